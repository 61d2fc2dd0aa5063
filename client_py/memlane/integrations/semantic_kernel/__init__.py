"""Semantic Kernel on memlane: ``MemlaneAgentThread`` (a ``ChatHistoryAgentThread`` for
``ChatCompletionAgent`` whose history is a memlane session, ``ChatMessageContent`` stored whole).
Needs ``memlane[semantic-kernel]``."""

from ._messages import NATIVE_FORMAT, to_content, to_message
from ._thread import MemlaneAgentThread

__all__ = ["NATIVE_FORMAT", "MemlaneAgentThread", "to_content", "to_message"]
