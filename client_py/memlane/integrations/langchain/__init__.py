"""LangChain on memlane: ``MemlaneChatMessageHistory`` (a ``BaseChatMessageHistory``; a memlane session
holds the messages whole) and ``MemlaneRetriever`` (a ``BaseRetriever`` over memlane's long-term
memory, score parts as metadata). Needs ``memlane[langchain]``."""

from ._history import MemlaneChatMessageHistory
from ._messages import NATIVE_FORMAT, from_message, to_message
from ._retriever import MemlaneRetriever, to_document

__all__ = [
    "NATIVE_FORMAT",
    "MemlaneChatMessageHistory",
    "MemlaneRetriever",
    "from_message",
    "to_document",
    "to_message",
]
