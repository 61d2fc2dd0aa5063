"""Procedural memory: how an agent should work, learned from experience, versioned and approved before
it reaches a context (see ``service`` for the life of a procedure, ``sessions/procedures.py`` for why
Redis, ``sessions/procedure_model.py`` for the model every layer reads)."""

from ..sessions.procedure_model import ActiveProcedure, Kind, Origin, Owner, Procedure, State, Version
from .extract import proposal_from
from .service import ProcedureService, Proposal

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
