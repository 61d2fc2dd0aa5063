"""LangGraph on memlane: ``MemlaneSaver`` (a checkpointer; thread = memlane session) and
``MemlaneStore`` (a ``BaseStore`` over memlane's long-term memory). Needs ``memlane[langgraph]``."""

from ._saver import MemlaneSaver
from ._store import MemlaneStore

__all__ = ["MemlaneSaver", "MemlaneStore"]
