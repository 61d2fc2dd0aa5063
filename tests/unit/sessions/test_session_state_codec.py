"""The lifecycle's typed state on the session document (sessions/codec.py): one codec, and documents
written before the typed fields (everything inside one JSON field ``extra``) still read the same."""

from __future__ import annotations

import orjson

from memlane_server.sessions.codec import decode_session, encode_session
from memlane_server.sessions.model import ArchivePointer, ChannelPolicy, Retirement, Session

POINTER = ArchivePointer("file:///a/t.parquet", "file:///a/s.parquet", "file:///a/tr.parquet", 1, 8, 8)
POLICY = ChannelPolicy(kind="messaging", channel="chat", hot_retention=0, resume_turns=3)


def _stored(fields: dict[str, str | int]) -> dict[bytes, bytes]:
    return {k.encode(): str(v).encode() for k, v in fields.items()}


def test_typed_state_round_trips() -> None:
    s = Session("s1", "u1", channel="chat", policy=POLICY, resumed_at_ms=7)
    s.retirement = Retirement(123, [POINTER], checkpoints_uri="file:///a/ck.parquet")
    back = decode_session(_stored(encode_session(s)))
    assert back.policy == POLICY and back.retirement == s.retirement and back.resumed_at_ms == 7
    plain = decode_session(_stored(encode_session(Session("s2", "u1"))))
    assert plain.policy is None and plain.retirement is None and plain.resumed_at_ms == 0


def test_a_document_of_the_old_layout_reads_the_same() -> None:
    new = Session("s1", "u1", channel="chat", policy=POLICY, resumed_at_ms=0)
    new.retirement = Retirement(123, [POINTER], checkpoints_uri="file:///a/ck.parquet")
    fields = encode_session(new)
    for name in ("policy", "retired_at_ms", "archives", "checkpoints_uri"):
        fields.pop(name)
    fields["extra"] = orjson.dumps(
        {
            "policy": POLICY.to_record(),
            "retired_at_ms": 123,
            "archive": [POINTER.to_record()],
            "checkpoints_archive": "file:///a/ck.parquet",
        }
    ).decode()
    old = decode_session(_stored(fields))
    assert old.policy == new.policy and old.retirement == new.retirement
    # A resumed document of the old layout: no retirement, its resume time kept.
    fields["extra"] = orjson.dumps({"policy": POLICY.to_record(), "resumed_at_ms": 99}).decode()
    resumed = decode_session(_stored(fields))
    assert resumed.retirement is None and resumed.resumed_at_ms == 99 and resumed.policy == POLICY
    # Oldest: no policy recorded at all.
    fields["extra"] = "{}"
    assert decode_session(_stored(fields)).policy is None
