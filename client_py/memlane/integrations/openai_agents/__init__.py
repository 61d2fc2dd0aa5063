"""OpenAI Agents SDK on memlane: ``MemlaneSession`` (the SDK's ``Session``; a memlane session holds the
items whole) and ``memlane_instructions`` (an agent's instructions plus memlane's profile, recalled
memories and summary, per turn). Needs ``memlane[openai-agents]``."""

from ._instructions import memlane_instructions, render
from ._items import NATIVE_FORMAT
from ._session import MemlaneSession

__all__ = ["NATIVE_FORMAT", "MemlaneSession", "memlane_instructions", "render"]
