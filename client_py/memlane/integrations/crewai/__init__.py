"""CrewAI on memlane: ``MemlaneStorage`` (CrewAI's memory ``StorageBackend`` over memlane's long-term
memory) and ``MemlaneEmbedder`` (CrewAI's embedder, served by the sidecar's model). Needs
``memlane[crewai]``, in an environment of its own: crewai 1.15 requires ``openai<3``, the
``openai-agents`` extra ``openai>=3``."""

from ._embedder import MemlaneEmbedder
from ._storage import MemlaneStorage

__all__ = ["MemlaneEmbedder", "MemlaneStorage"]
