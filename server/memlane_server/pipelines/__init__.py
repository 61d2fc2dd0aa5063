"""Session-end jobs: discard, summarize, promote, archive, retire; archive retention; resumption.

Public face (built by ``app.py``):

- ``SessionEndPipeline``: the idempotent steps for one session (``handle_job``, ``retire``).
- ``SessionEndWorker``: a worker's background jobs (the job streams' consumer: session end, learning,
  summaries; retirement, archive retention). ``on_request.EndOnRequest``: PromoteSession, a forced job
  waited for.
- ``Resumer.ensure_hot(session_id)``: call before serving a session; reloads a retired one.
- ``ArchiveStore`` / ``ParquetArchive``: cold storage; ``Promoter`` / ``LtmPromoter``: promotion.
"""

from ..sessions.model import ArchivePointer
from .archive import ArchiveStore, ParquetArchive
from .archive_tables import ArchivePart
from .on_request import Resumer
from .promote import LtmPromoter, Promoter, memory_id_for
from .session_end import EndReport, PipelineConfig, SessionEndPipeline
from .worker import QueueMetrics, SessionEndWorker, WorkerConfig

__all__ = [
    "ArchivePart",
    "ArchivePointer",
    "ArchiveStore",
    "EndReport",
    "LtmPromoter",
    "ParquetArchive",
    "PipelineConfig",
    "Promoter",
    "QueueMetrics",
    "Resumer",
    "SessionEndPipeline",
    "SessionEndWorker",
    "WorkerConfig",
    "memory_id_for",
]
