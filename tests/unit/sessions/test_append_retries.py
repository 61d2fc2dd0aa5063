"""The append path's one retry policy (sessions/messages.py ``AppendRetries``), driven without Redis: a
fake send answers each attempt, and the loop must retry what the policy names, as often as it says,
and nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import NoScriptError, ResponseError

from memlane_server.access.identity import UNRESTRICTED, Caller
from memlane_server.config import Settings
from memlane_server.errors import FailedPrecondition, SessionExpired, Unavailable
from memlane_server.keyspace import KeySpace
from memlane_server.sessions.messages import AppendMemo, AppendRetries, SessionMessages, _Batch
from memlane_server.sessions.model import Message, Role
from memlane_server.wiring.stores import session_limits


class _Script:
    sha = "0" * 40


class _Redis:
    def __init__(self) -> None:
        self.loaded = 0

    def register_script(self, _: str) -> _Script:
        return _Script()

    async def script_load(self, _: str) -> str:
        self.loaded += 1
        return _Script.sha

    async def zadd(self, *_: Any, **__: Any) -> int:  # the memo's deadline bump after a success
        return 1


_OK = [7, 1, 1, 0]  # token_total, message_count, then (seq, duplicate) of the one message


class _Harness:
    """SessionMessages with ``_prepare`` and ``_send`` replaced: each send pops the next answer."""

    def __init__(self, answers: list[Any], ttl_s: int = 0) -> None:
        self.redis = _Redis()
        self.store = SessionMessages(
            self.redis,  # type: ignore[arg-type]
            KeySpace("t"),
            tokens=None,  # type: ignore[arg-type]
            limits=session_limits(Settings().sessions),
            memo=AppendMemo(self.redis, KeySpace("t")),  # type: ignore[arg-type]
        )
        self.answers = list(answers)
        self.sent: list[list[Any]] = []
        self.prepared = 0
        self.revived = 0
        self.forgotten = 0
        self.ttl_s = ttl_s

        async def prepare(session_id: str, messages: list[Message], writer: Caller, model: str) -> _Batch:
            self.prepared += 1
            return _Batch(messages, [1], ["k"], [0, self.ttl_s * 1000, 1], 0, self.ttl_s)

        async def send(batch: _Batch) -> Any:
            self.sent.append(list(batch.args))
            answer = self.answers.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return answer

        def forget(session_id: str) -> None:
            self.forgotten += 1

        self.store._prepare = prepare  # type: ignore[method-assign]
        self.store._send = send  # type: ignore[method-assign]
        self.store._memo.document_changed = forget  # type: ignore[method-assign]

    async def revive(self, session_id: str) -> None:
        self.revived += 1

    def build(self) -> Callable[[], list[Message]]:
        return lambda: [Message("m1", "", Role.USER, "hi")]

    def append(self, *, revive: bool = True) -> Any:
        if revive:
            return asyncio.run(self.store.append_reviving("s1", self.build(), UNRESTRICTED, self.revive))
        return asyncio.run(self.store.append("s1", self.build()()))


def test_a_plain_batch_is_sent_once() -> None:
    h = _Harness([_OK])
    out = h.append()
    assert (out.seqs, out.token_total, len(h.sent), h.prepared) == ([1], 7, 1, 1)


def test_a_lost_script_cache_is_reloaded_once_per_send() -> None:
    h = _Harness([NoScriptError("NOSCRIPT"), _OK])
    assert h.append().seqs == [1]
    assert h.redis.loaded == AppendRetries.SCRIPT_RELOADS == 1
    h = _Harness([NoScriptError("NOSCRIPT"), NoScriptError("NOSCRIPT"), _OK])
    with pytest.raises(NoScriptError):
        h.append()
    assert len(h.sent) == 2


def test_a_changed_timeout_resends_the_batch_with_the_documents_timeout() -> None:
    h = _Harness([ResponseError("TTL 60000"), _OK], ttl_s=30)
    assert h.append().seqs == [1]
    assert [args[1] for args in h.sent] == [30_000, 60_000]
    assert (h.forgotten, h.prepared) == (1, 1)  # the memo forgot the session; the batch was not rebuilt


def test_a_timeout_that_keeps_changing_answers_unavailable() -> None:
    h = _Harness([ResponseError(f"TTL {n}000") for n in range(1, 10)])
    with pytest.raises(Unavailable, match="timeout kept changing"):
        h.append()
    assert len(h.sent) == AppendRetries.SENDS_PER_BATCH == 3


def test_an_expired_session_is_revived_and_the_batch_built_again() -> None:
    h = _Harness([ResponseError("EXPIRED"), _OK])
    assert h.append().seqs == [1]
    assert (h.revived, h.prepared, len(h.sent)) == (1, 2, 2)


def test_a_session_that_keeps_expiring_answers_unavailable() -> None:
    h = _Harness([ResponseError("EXPIRED")] * 5)
    with pytest.raises(Unavailable, match="kept expiring"):
        h.append()
    assert h.prepared == h.revived == AppendRetries.BATCHES == 3


def test_each_batch_gets_its_own_timeout_sends() -> None:
    """A revival starts a fresh batch: the TTL budget is per batch, as the policy says."""
    answers: list[Any] = [ResponseError("TTL 1000"), ResponseError("TTL 2000"), ResponseError("EXPIRED")]
    h = _Harness([*answers, ResponseError("TTL 3000"), ResponseError("TTL 4000"), _OK])
    assert h.append().seqs == [1]
    assert (h.revived, h.prepared, len(h.sent)) == (1, 2, 6)


def test_without_revive_an_expired_session_is_the_answer() -> None:
    h = _Harness([ResponseError("EXPIRED")])
    with pytest.raises(SessionExpired):
        h.append(revive=False)
    assert h.revived == 0


def test_other_refusals_are_never_retried() -> None:
    h = _Harness([ResponseError("CLOSED"), _OK])
    with pytest.raises(FailedPrecondition):
        h.append()
    assert len(h.sent) == 1
