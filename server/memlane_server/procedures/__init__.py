"""Procedural memory: how an agent should work, learned from experience, versioned and approved before
it reaches a context (see ``service`` for the life of a procedure and the extractor, ``store`` for the
model every layer reads and why Redis keeps it)."""

from .service import ProcedureService, Proposal, proposal_from
from .store import ActiveProcedure, Kind, Origin, Owner, Procedure, State, Version

__all__ = [
    "ActiveProcedure",
    "Kind",
    "Origin",
    "Owner",
    "Procedure",
    "ProcedureService",
    "Proposal",
    "State",
    "Version",
    "proposal_from",
]
