"""Budgets: the ledger grants sections in priority order. The headroom invariant itself is a property
of the real assembler, checked through the real server in tests/integration/test_headroom.py."""

from __future__ import annotations

import pytest

from memlane_server.config import Settings
from memlane_server.context import Ledger, Section, SectionCaps
from memlane_server.context.budget import plan_budget
from memlane_server.errors import InvalidArgument
from memlane_server.wiring.lifecycle import budget_policy


def test_priority_order_lowest_section_absorbs_the_shortfall() -> None:
    policy = budget_policy(Settings().context)
    plan = plan_budget(1000, 200, 0, SectionCaps(system=700, history=900), policy)
    ledger = Ledger(plan)
    assert ledger.grant(Section.SYSTEM) == 700
    ledger.spend(Section.SYSTEM, 700, 700)
    assert ledger.grant(Section.PROFILE) == min(policy.profile_max, int(800 * policy.profile_share))
    ledger.spend(Section.PROFILE, 40, 40)
    ledger.spend(Section.MEMORY, ledger.grant(Section.MEMORY), 60)
    assert ledger.grant(Section.HISTORY) == 0  # history gets what is left: nothing
    with pytest.raises(AssertionError):
        ledger.spend(Section.HISTORY, 0, 1)


def test_reserved_output_beyond_window_is_invalid() -> None:
    with pytest.raises(InvalidArgument):
        plan_budget(1000, 1001, 0, SectionCaps(), budget_policy(Settings().context))
