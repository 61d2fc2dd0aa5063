"""Long synthetic sessions of several shapes, generated (seeded), for summarizer and assembly tests.

Each shape is a kind of filler that crowds a summary differently: incidental numbers, templated status
lines carrying codes, small talk, and many genuine identifiers worded apart. Durable identifiers are
planted early (turn 3) and late.
"""

from __future__ import annotations

import random

EARLY_ID = "My purchase order is PO-77341-ZX."
LATE_ID = "The return label is RL-55012-QT."
NOUNS = [
    "warehouse", "courier", "invoice", "refund", "voucher", "pallet", "contract", "shipment", "locker",
    "gateway", "tenant", "license", "router", "printer", "account", "policy", "claim", "badge", "parcel",
    "vendor", "ledger", "project", "cluster", "bucket", "mailbox", "device", "vehicle", "permit", "asset",
    "dock", "counter", "desk", "terminal", "plan", "quote", "order", "ticket", "case", "booking", "seat",
]  # fmt: skip


def _routine_numbers(rng: random.Random, i: int) -> str:
    return rng.choice(
        [
            f"I read page {rng.randint(100, 999)} of the manual.",
            f"Give me {rng.randint(100, 900)} words on that.",
            f"Step {i} done, {rng.randint(100, 999)} rows left.",
            f"That took {rng.randint(100, 999)} seconds, fine.",
            f"There are {rng.randint(100, 999)} entries in the list now.",
        ]
    )


def _status_templates(rng: random.Random, i: int) -> str:
    return rng.choice(
        [
            f"Build B-{1000 + i} passed on runner {rng.randint(1, 9)}.",
            f"Ticket TCK-{5000 + i} moved to review.",
            f"Sync job J{700 + i} finished with {rng.randint(100, 999)} records.",
        ]
    )


def _small_talk(rng: random.Random, i: int) -> str:
    return rng.choice(
        ["sounds good", "that makes sense", "tell me more", "nice weather here", "fair enough", "I see"]
    ) + rng.choice([".", "!", ", thanks.", " then."])


def _many_identifiers(rng: random.Random, i: int) -> str:
    # Genuine identifiers, each worded differently: a cap must choose among them.
    code = f"{rng.choice('ABCDEFGHJK')}{rng.choice('LMNPQRSTUV')}-{rng.randint(10000, 99999)}"
    return f"The {NOUNS[i % len(NOUNS)]} reference is {code}."


SHAPES = {
    "routine_numbers": _routine_numbers,
    "status_templates": _status_templates,
    "small_talk": _small_talk,
    "many_identifiers": _many_identifiers,
}


def session_texts(shape: str, seed: int, n: int) -> list[tuple[int, str]]:
    """(seq, text) of an ``n``-turn session of one shape: ``EARLY_ID`` at turn 3, ``LATE_ID`` near the end."""
    rng = random.Random(seed)
    out = []
    for seq in range(1, n + 1):
        text = SHAPES[shape](rng, seq)
        if seq == 3:
            text = EARLY_ID
        elif seq == n - 5:
            text = LATE_ID
        out.append((seq, text))
    return out
