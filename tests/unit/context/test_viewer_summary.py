"""Summaries per visibility scope: folding keeps scopes apart, each viewer reads exactly its scopes."""

from __future__ import annotations

import pytest

from memlane_server.access.identity import UNRESTRICTED, Caller, CallerRole
from memlane_server.context.summaries import viewer_summary
from memlane_server.sessions.model import Message, Role, Summary, VisibilityKind
from memlane_server.summarizers import ExtractiveSummarizer
from memlane_server.summarizers.summarizer import fold_scoped
from memlane_server.tokens import TokenCounter

COUNTER = TokenCounter()
SHARED = "We decided to ship on Friday."
ALPHA = "My purchase order is PO-77341-ZX."
BETA = "The beta vault code is BX-4410."
OPS = "The ops runbook id is RB-2231."


def _m(
    seq: int, text: str, vis: VisibilityKind, agent: str = "", group: str = "", *, transient: bool = False
) -> Message:
    return Message(
        f"m{seq}",
        "s",
        Role.USER,
        text,
        seq=seq,
        visibility=vis,
        source_agent_id=agent,
        visibility_group=group,
        transient=transient,
    )


TURNS = [
    _m(1, SHARED, VisibilityKind.SESSION, "alpha"),
    _m(2, ALPHA, VisibilityKind.AGENT, "alpha"),
    _m(3, BETA, VisibilityKind.AGENT, "beta"),
    _m(4, OPS, VisibilityKind.GROUP, "alpha", "ops"),
    _m(5, "Scratch note ZZ-9999.", VisibilityKind.SESSION, "alpha", transient=True),
]


async def _folded() -> Summary:
    return await fold_scoped(ExtractiveSummarizer(COUNTER), Summary(), TURNS, 200)


async def test_each_scope_is_folded_apart_and_transient_turns_never() -> None:
    s = await _folded()
    assert s.through_seq == 5 and s.through_message_id == "m5"
    assert SHARED in s.text and all(x not in s.text for x in (ALPHA, BETA, OPS, "ZZ-9999"))
    parts = {(p.visibility, p.agent_id, p.group): p.text for p in s.scoped}
    assert set(parts) == {
        (VisibilityKind.AGENT, "alpha", ""),
        (VisibilityKind.AGENT, "beta", ""),
        (VisibilityKind.GROUP, "alpha", "ops"),
    }
    assert ALPHA in parts[(VisibilityKind.AGENT, "alpha", "")]
    assert "ZZ-9999" not in str(parts)
    # A later fold keeps the scopes it has no new turns for.
    more = await fold_scoped(
        ExtractiveSummarizer(COUNTER), s, [_m(6, "Order 5521 arrived.", VisibilityKind.AGENT, "beta")], 200
    )
    texts = {p.agent_id + p.group: p.text for p in more.scoped}
    assert ALPHA in texts["alpha"] and BETA in texts["beta"] and "5521" in texts["beta"]


@pytest.mark.parametrize(
    ("viewer", "sees", "not_seen"),
    [
        (Caller("alpha", groups=frozenset({"ops"})), [SHARED, ALPHA, OPS], [BETA]),
        (Caller("beta"), [SHARED, BETA], [ALPHA, OPS]),
        (Caller("gamma", groups=frozenset({"ops"})), [SHARED, OPS], [ALPHA, BETA]),
        (
            Caller("boss", roles=frozenset({CallerRole.ORCHESTRATOR}), delegates=frozenset({"alpha"})),
            [SHARED, ALPHA, OPS],
            [BETA],
        ),
        (Caller("audit", roles=frozenset({CallerRole.AUDITOR})), [SHARED, ALPHA, BETA, OPS], []),
        (UNRESTRICTED, [SHARED, ALPHA, BETA, OPS], []),
        (Caller("outsider"), [SHARED], [ALPHA, BETA, OPS]),
    ],
)
async def test_a_viewer_reads_exactly_the_scopes_the_access_rule_allows(
    viewer: Caller, sees: list[str], not_seen: list[str]
) -> None:
    shown, cut = viewer_summary(await _folded(), viewer, COUNTER, "", 500)
    text = shown.text
    assert not cut
    assert all(s in text for s in sees), text
    assert all(s not in text for s in not_seen), text


WORDS = [
    "desk",
    "lamp",
    "sofa",
    "rug",
    "vase",
    "bowl",
    "cup",
    "mug",
    "pan",
    "pot",
    "jar",
    "tin",
    "box",
    "bag",
    "hat",
    "cap",
    "mop",
]


async def test_over_the_cap_every_part_keeps_a_share() -> None:
    long_shared = " ".join(f"We decided the {w} ships on pallet PL-{i}{i}{i}." for i, w in enumerate(WORDS))
    s = await fold_scoped(
        ExtractiveSummarizer(COUNTER),
        Summary(),
        [_m(1, long_shared, VisibilityKind.SESSION), _m(2, ALPHA, VisibilityKind.AGENT, "alpha")],
        2000,
    )
    shown, cut = viewer_summary(s, Caller("alpha"), COUNTER, "", 120)
    assert cut
    assert ALPHA in shown.text and "We decided the desk" in shown.text
    assert "We decided the mop" not in shown.text  # the long part was cut...
    assert COUNTER.count(shown.text) <= 120 + 4  # ...to what the private part left (plus the joins)
