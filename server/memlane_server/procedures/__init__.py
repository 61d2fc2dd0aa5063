"""Procedural memory: how an agent should work, learned from experience, versioned and approved before
it reaches a context (see ``service`` for the life of a procedure, ``store`` for why Redis)."""

from ..sessions.procedures import ProcedureStore
from .extract import ExtractingPromoter
from .model import ActiveProcedure, Kind, Origin, Owner, Procedure, State, Version
from .service import ProcedureService, Proposal

__all__ = [
    "ActiveProcedure",
    "ExtractingPromoter",
    "Kind",
    "Origin",
    "Owner",
    "Procedure",
    "ProcedureService",
    "ProcedureStore",
    "Proposal",
    "State",
    "Version",
]
