"""Strands Agents on memlane: ``MemlaneSessionManager`` / ``MemlaneSessionRepository`` (Strands'
session persistence: sessions, agents, messages with integer indexes) and ``MemlaneMemoryStore`` (a
``MemoryStore`` over memlane's long-term memory, with a ``forget_memory`` tool). Needs
``memlane[strands]``."""

from ._memory import MemlaneMemoryStore
from ._messages import NATIVE_FORMAT
from ._repository import MemlaneSessionManager, MemlaneSessionRepository

__all__ = ["NATIVE_FORMAT", "MemlaneMemoryStore", "MemlaneSessionManager", "MemlaneSessionRepository"]
