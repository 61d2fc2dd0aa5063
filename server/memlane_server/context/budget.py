"""Budgets: the window, reserved output, per-section caps and the priority order.

Sections are granted in priority order (system -> profile -> memory -> history), each up to its cap and
never beyond what is left, so the lowest-priority section (history) absorbs any shortfall and

    sum(block tokens) + input tokens + reserved output <= window

holds by construction as long as every block stays within its grant (``Ledger.spend`` enforces it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ContextSettings
from ..errors import InvalidArgument
from ..tokens import context_window_for_model
from .model import Fallback, Section, SectionBudget, SectionCaps, Strategy, parse_strategy


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    """Server-side defaults; a request may override caps, strategy and window size."""

    default_reserved_output: int = 1024
    # Default caps as shares of what is available after reserved output and input, with absolute maxima,
    # so that no section is ever uncapped and the history keeps the bulk of a small window.
    system_share: float = 0.25
    profile_share: float = 0.05
    profile_max: int = 512
    memory_share: float = 0.15
    memory_max: int = 2048
    # History: the rolling summary's share of the history budget.
    summary_share: float = 0.25
    # Summarize once the unsummarized turns reach this share of the history budget (never at the limit).
    trigger_ratio: float = 0.75
    # After summarizing, hybrid keeps this share of the history budget as verbatim recent turns...
    hybrid_recent_share: float = 0.5
    # ...while rolling summary keeps only the last few turns verbatim.
    rolling_keep_turns: int = 2
    window_turns: int = 20  # sliding window default
    memory_limit: int = 8  # memories recalled per request
    # Relevance floor: a recalled memory matching no query word, with a cosine to the query below this,
    # is left out of the context (settings: context_memory_min_similarity).
    memory_min_similarity: float = 0.15
    # Used when neither the request, the session's metadata nor its channel policy names a strategy.
    default_strategy: Strategy = Strategy.HYBRID
    fallback: Fallback = Fallback.GAP_SUMMARY  # or DROPPED_OLDEST
    max_scan_messages: int = 2000  # most turns read per request (bounds hot-path work)


@dataclass(slots=True)
class BudgetPlan:
    window: int
    reserved_output: int
    input_tokens: int
    available: int  # window - reserved - input
    caps: dict[Section, int]


def resolve_window(model: str, explicit: int) -> int:
    if explicit < 0:
        raise InvalidArgument("context_window_tokens must not be negative")
    return explicit or context_window_for_model(model)


def plan_budget(
    window: int, reserved_output: int, input_tokens: int, caps: SectionCaps, policy: BudgetPolicy
) -> BudgetPlan:
    if reserved_output < 0:
        raise InvalidArgument("reserved_output_tokens must not be negative")
    for name in ("system", "profile", "memory", "history"):
        if getattr(caps, name) < 0:
            raise InvalidArgument(f"caps.{name}_tokens must not be negative")
    available = window - reserved_output - input_tokens
    if available < 0:
        raise InvalidArgument(
            f"reserved_output_tokens ({reserved_output}) plus the user input ({input_tokens} tokens) "
            f"exceed the context window ({window})"
        )

    def cap(requested: int, default: int) -> int:
        return min(requested or default, available)

    return BudgetPlan(
        window=window,
        reserved_output=reserved_output,
        input_tokens=input_tokens,
        available=available,
        caps={
            Section.SYSTEM: cap(caps.system, int(available * policy.system_share)),
            Section.PROFILE: cap(
                caps.profile, min(policy.profile_max, int(available * policy.profile_share))
            ),
            Section.MEMORY: cap(caps.memory, min(policy.memory_max, int(available * policy.memory_share))),
            Section.HISTORY: cap(caps.history, available),
        },
    )


class Ledger:
    """Grants sections their tokens in priority order and records what each used."""

    def __init__(self, plan: BudgetPlan) -> None:
        self.plan = plan
        self.remaining = plan.available
        self.budgets: list[SectionBudget] = []

    def grant(self, section: Section) -> int:
        return max(0, min(self.plan.caps[section], self.remaining))

    def spend(self, section: Section, granted: int, used: int) -> None:
        if used > granted:
            # A bug in a block builder, never a user error: refuse rather than overflow the window.
            raise AssertionError(f"{section.name} used {used} tokens of {granted} granted")
        self.remaining -= used
        self.budgets.append(SectionBudget(section, granted, used))

    @property
    def used(self) -> int:
        return self.plan.available - self.remaining


def policy_from_settings(settings: ContextSettings) -> BudgetPolicy:
    """The policy the configured settings describe; raises ``InvalidArgument`` naming a bad setting."""
    fallbacks = {"gap_summary": Fallback.GAP_SUMMARY, "drop_oldest": Fallback.DROPPED_OLDEST}
    if settings.context_fallback not in fallbacks:
        raise InvalidArgument(f"context_fallback: expected one of {', '.join(fallbacks)}")
    if not 0 < settings.context_summary_trigger_ratio <= 1:
        raise InvalidArgument("context_summary_trigger_ratio: must be in (0, 1]")
    if not 0 <= settings.context_memory_min_similarity < 1:
        raise InvalidArgument("context_memory_min_similarity: must be in [0, 1)")
    return BudgetPolicy(
        memory_min_similarity=settings.context_memory_min_similarity,
        default_reserved_output=settings.context_reserved_output_tokens,
        trigger_ratio=settings.context_summary_trigger_ratio,
        window_turns=settings.context_window_turns,
        default_strategy=parse_strategy(settings.context_strategy, "context_strategy") or Strategy.HYBRID,
        fallback=fallbacks[settings.context_fallback],
    )
