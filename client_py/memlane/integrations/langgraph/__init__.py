"""LangGraph on memlane: ``MemlaneSaver`` (a checkpointer; thread = memlane session). Needs
``memlane[langgraph]``."""

from ._saver import MemlaneSaver

__all__ = ["MemlaneSaver"]
