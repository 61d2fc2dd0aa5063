"""The mixed workload of a chaos trial: sessions created, appended to one message at a time with
client-chosen ids (retried on another sidecar when one dies), assembled now and then, ended by close or
by a 4 s TTL; the user messages state facts the rules extractor turns into memories; one user of the
trial is erased (ForgetUser) halfway, once their sessions are archived."""

from __future__ import annotations

import collections
import contextlib
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import redis

import memlane
from memlane import Message, PromotionState, Role

# Facts the offline rules extractor picks up ("User is allergic to ..."), so LTM gets written.
_FOODS = ("kiwi", "peanuts", "shellfish", "sesame", "mustard", "celery", "lupin", "soy", "walnuts", "mango")


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[str, set[str]] = collections.defaultdict(set)
        self.internal = 0
        self.ended: set[str] = set()  # sessions the workload ended (close) or let expire (TTL)
        self.by_ttl: set[str] = set()
        self.users: set[str] = set()
        self.sessions_of: dict[str, set[str]] = collections.defaultdict(set)
        self.forgotten: set[str] = set()
        self.forget_failed = 0

    def ack(self, sid: str, mid: str) -> None:
        with self.lock:
            self.acked[sid].add(mid)


class Caller:
    """Runs ``fn(client)`` on some live sidecar, moving to another on UNAVAILABLE (one was killed, Redis
    is failing over) for up to ``patience`` seconds; RESOURCE_EXHAUSTED waits for the server's hint."""

    def __init__(self, targets: Callable[[], Sequence[str]], tally: Tally, patience: float = 45.0) -> None:
        self.targets, self.tally, self.patience = targets, tally, patience

    def __call__(
        self, fn: Callable[[memlane.Client], Any], rng: random.Random | None = None, *, timeout: float = 15.0
    ) -> Any:
        rng = rng or random.Random()
        deadline = time.monotonic() + max(self.patience, 3 * timeout)
        while True:
            target = rng.choice(list(self.targets()))
            try:
                with memlane.Client(target, timeout=timeout, retry=memlane.NO_RETRY) as c:
                    return fn(c)
            except (
                memlane.UnavailableError,
                memlane.DeadlineExceededError,
                memlane.CancelledError,
                memlane.ResourceExhaustedError,
                memlane.AbortedError,
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("no sidecar answered") from None
                time.sleep(0.1 + rng.random() * 0.2)
            except memlane.MemlaneError as exc:
                if exc.code == grpc.StatusCode.INTERNAL:
                    with self.tally.lock:
                        self.tally.internal += 1
                raise


def _message(sid: str, i: int, rng: random.Random) -> Message:
    if i % 2:
        return Message(message_id=f"m{i:03d}", role=Role.ROLE_ASSISTANT, content=f"Noted, turn {i} of {sid}.")
    if i % 4 == 0:
        text = f"I am allergic to {rng.choice(_FOODS)} batch {rng.randrange(10**6)}."
    else:
        text = f"Turn {i} of {sid}: what should I cook tonight?"
    return Message(message_id=f"m{i:03d}", role=Role.ROLE_USER, content=text)


def run_session(call: Caller, tally: Tally, rng: random.Random, user: str) -> None:
    by_ttl = rng.random() < 0.4
    # An inactivity timeout: short, but longer than an append usually takes. One retried through a kill
    # or a Redis restart can take longer; the session then expires, the append resumes it (RESUMED) and
    # it ends again (checks.py allows that for TTL sessions).
    ttl = 4 if by_ttl else 0
    try:
        sid = call(lambda c: c.create_session(user_id=user, ttl_seconds=ttl), rng).session.session_id
    except (memlane.MemlaneError, RuntimeError):
        return  # counted if INTERNAL; nothing was acknowledged
    with tally.lock:
        tally.users.add(user)
        tally.sessions_of[user].add(sid)
        if by_ttl:
            tally.by_ttl.add(sid)
    for i in range(rng.randint(3, 15)):
        msg = _message(sid, i, rng)
        try:
            call(lambda c, m=msg: c.append_messages(session_id=sid, messages=[m]), rng)
            tally.ack(sid, msg.message_id)
        except (memlane.MemlaneError, RuntimeError):
            pass  # not acknowledged: not counted
        if rng.random() < 0.3:
            with contextlib.suppress(memlane.MemlaneError, RuntimeError):
                call(lambda c: list(c.assemble_context(session_id=sid, user_input="now?")), rng)
        if rng.random() < 0.1:
            with contextlib.suppress(memlane.MemlaneError, RuntimeError):
                call(lambda c: c.search_memories(caller=memlane.Caller(user_id=user), query="allergic"), rng)
    if not by_ttl:  # a close that fails shows as a session not ended
        with contextlib.suppress(memlane.MemlaneError, RuntimeError):
            call(lambda c: c.close_session(session_id=sid), rng)
    with tally.lock:
        tally.ended.add(sid)


class Erasure:
    """Worker 0 works for the doomed user until halfway; then the user's sessions are awaited until
    archived and the user is forgotten (through any sidecar, retried: a sidecar may die mid-erasure)."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.switch = threading.Event()  # worker 0 stops opening sessions for the doomed user
        self.left = threading.Event()  # ... and its last one has ended

    def run(self, call: Caller, tally: Tally, archived: Callable[[str], bool], at: float) -> None:
        time.sleep(max(0.0, at - time.monotonic()))
        self.switch.set()
        self.left.wait(120)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all(archived(s) for s in tally.sessions_of[self.user]):
            time.sleep(0.3)
        try:
            # An erasure rewrites LTM fragments and archives (on S3 too): slow on a loaded machine.
            call(lambda c: c.forget_user(user_id=self.user), timeout=120)
            with tally.lock:
                tally.forgotten.add(self.user)
        except (memlane.MemlaneError, RuntimeError) as exc:
            print(f"  ForgetUser({self.user}) failed: {exc!r}")
            with tally.lock:
                tally.forget_failed += 1


def session_worker(
    k: int,
    call: Caller,
    tally: Tally,
    rng: random.Random,
    *,
    users: list[str],
    erasure: Erasure,
    stop_at: float,
) -> None:
    try:
        while time.monotonic() < stop_at:
            doomed = k == 0 and not erasure.switch.is_set()
            run_session(call, tally, rng, erasure.user if doomed else users[k % len(users)])
            if k == 0 and erasure.switch.is_set():
                erasure.left.set()
    finally:
        if k == 0:
            erasure.left.set()


def is_archived(r: Any, prefix: str) -> Callable[[str], bool]:
    def check(sid: str) -> bool:
        try:
            raw = r.hget(f"{prefix}:{{{sid}}}:doc", "promotion_state")
        except redis.RedisError:  # the monkey is restarting Redis: ask again
            return False
        return int(raw or 0) == PromotionState.PROMOTION_STATE_ARCHIVED

    return check
