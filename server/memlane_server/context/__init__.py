"""Working-memory assembly: budgets, strategies, rolling summaries, turn traces."""

from .assembler import ContextAssembler
from .budget import BudgetPlan, BudgetPolicy, Ledger, plan_budget, resolve_window
from .model import (
    STRATEGY_METADATA_KEY,
    AssembleRequest,
    AssembleStats,
    Block,
    BlockMessage,
    Fallback,
    Flush,
    MemoryRef,
    Provenance,
    Section,
    SectionBudget,
    SectionCaps,
    Strategy,
    SummaryRange,
    Truncation,
    TurnTrace,
    parse_strategy,
)
from .sources import MemoryHit, MemorySource, NoMemory
from .summaries import SummaryScheduler
from .traces import TraceStore

__all__ = [
    "STRATEGY_METADATA_KEY",
    "AssembleRequest",
    "AssembleStats",
    "Block",
    "BlockMessage",
    "BudgetPlan",
    "BudgetPolicy",
    "ContextAssembler",
    "Fallback",
    "Flush",
    "Ledger",
    "MemoryHit",
    "MemoryRef",
    "MemorySource",
    "NoMemory",
    "Provenance",
    "Section",
    "SectionBudget",
    "SectionCaps",
    "Strategy",
    "SummaryRange",
    "SummaryScheduler",
    "TraceStore",
    "Truncation",
    "TurnTrace",
    "parse_strategy",
    "plan_budget",
    "resolve_window",
]
