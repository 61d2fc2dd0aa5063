"""End-user binding through the real server: a signed user token (JWT, ``sub`` = the end user) in
``x-memlane-user-token`` holds every user-scoped RPC to that user. Keys come from the access policy file
(inline JWKS) and from a JWKS file; forged, expired and wrong-key tokens are refused."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import procedure_pb2 as ppb
from memlane.v1 import session_pb2 as pb
from memlane.v1 import session_service_pb2 as spb
from memlane_server.background import SidecarThread
from tests.access_policy import TOKENS, write_policy
from tests.conftest import ServerFactory

POLICY_KEY = Ed25519PrivateKey.generate()  # its public half is inline in the policy file
FILE_KEY = Ed25519PrivateKey.generate()  # its public half is in the JWKS file
STRANGER_KEY = Ed25519PrivateKey.generate()  # nobody trusts it
ISSUER, AUDIENCE = "https://login.example", "memlane"


def _jwk(key: Ed25519PrivateKey, kid: str) -> dict[str, str]:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "use": "sig"}


def user_token(
    sub: str, key: Ed25519PrivateKey = POLICY_KEY, kid: str = "policy-1", ttl: int = 300, **claims: Any
) -> str:
    now = int(time.time())
    payload = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + ttl, **claims}
    return jwt.encode(payload, key, algorithm="EdDSA", headers={"kid": kid})


@pytest.fixture(scope="module")
def bound(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> SidecarThread:
    d = tmp_path_factory.mktemp("binding")
    write_policy(d / "policy.yaml", user_token_jwks={"keys": [_jwk(POLICY_KEY, "policy-1")]})
    (d / "jwks.json").write_text(json.dumps({"keys": [_jwk(FILE_KEY, "file-1")]}))
    return start_server(
        auth_required=True,
        access_policy_file=str(d / "policy.yaml"),
        user_token_required=True,
        user_token_jwks_file=str(d / "jwks.json"),
        user_token_issuer=ISSUER,
        user_token_audience=AUDIENCE,
    )


def client(server: SidecarThread, agent: str, user: str | None) -> memlane.Client:
    return memlane.Client(server.target, token=TOKENS[agent], user_token=user, timeout=20)


def _forged_none(sub: str) -> str:
    header = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT","kid":"policy-1"}').rstrip(b"=")
    body = json.dumps({"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 300})
    return f"{header.decode()}.{base64.urlsafe_b64encode(body.encode()).rstrip(b'=').decode()}."


def _tampered(sub: str, other: str) -> str:
    """A valid token for ``sub`` whose payload was edited to say ``other``."""
    head, _, sig = user_token(sub).split(".")
    now = int(time.time())
    body = {"sub": other, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 300}
    return f"{head}.{base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b'=').decode()}.{sig}"


BAD_TOKENS: dict[str, Callable[[], str]] = {
    "expired": lambda: user_token("alice", ttl=-3600),
    "unknown key, trusted kid": lambda: user_token("alice", key=STRANGER_KEY),
    "unknown kid": lambda: user_token("alice", key=STRANGER_KEY, kid="other"),
    "alg none": lambda: _forged_none("alice"),
    "payload edited": lambda: _tampered("bob", "alice"),
    "wrong issuer": lambda: user_token("alice", iss="https://evil.example"),
    "wrong audience": lambda: user_token("alice", aud="someone-else"),
    "no sub": lambda: jwt.encode(
        {"iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 300},
        POLICY_KEY,
        algorithm="EdDSA",
        headers={"kid": "policy-1"},
    ),
    "not a jwt": lambda: "hello",
}


@pytest.mark.parametrize("case", sorted(BAD_TOKENS))
def test_forged_expired_and_wrong_key_tokens_are_refused(bound: SidecarThread, case: str) -> None:
    with client(bound, "writer", BAD_TOKENS[case]()) as c, pytest.raises(memlane.UnauthenticatedError):
        c.list_sessions()
    with client(bound, "writer", user_token("alice")) as c:  # positive control: a good token passes
        c.list_sessions()


def test_a_token_is_required_except_for_admins(bound: SidecarThread) -> None:
    with client(bound, "writer", None) as c, pytest.raises(memlane.UnauthenticatedError, match="user token"):
        c.list_sessions(user_id="alice")
    with client(bound, "admin", None) as admin:  # operators act across users
        admin.list_sessions(user_id="alice")


def test_a_token_for_alice_cannot_reach_bob(bound: SidecarThread) -> None:
    alice_t, bob_t = user_token("alice"), user_token("bob", key=FILE_KEY, kid="file-1")
    with client(bound, "writer", bob_t) as bob:
        bob_sid = bob.create_session(user_id="bob").session.session_id
        bob.append_messages(
            session_id=bob_sid, messages=[Message(role=Role.ROLE_USER, content="bob's secret")]
        )
        bob.create_memory(
            caller=mpb.Caller(user_id="bob"), kind=mpb.MEMORY_KIND_FACT, content="Bob likes jazz."
        )
    with client(bound, "writer", alice_t) as alice:
        # Positive controls: alice's own data, with the user named or left to the binding.
        own = alice.create_session(user_id="alice").session.session_id
        assert alice.create_session().session.user_id == "alice"
        alice.append_messages(session_id=own, messages=[Message(role=Role.ROLE_USER, content="hi")])
        assert [m.content for m in alice.list_messages(session_id=own).messages] == ["hi"]
        alice.create_memory(
            caller=mpb.Caller(user_id="alice"), kind=mpb.MEMORY_KIND_FACT, content="Alice sails."
        )
        assert alice.get_profile(caller=mpb.Caller()).facts[0].content == "Alice sails."
        listed = {s.user_id for s in alice.list_sessions(page_size=100).sessions}
        assert listed == {"alice"}  # bob's session exists, but the binding filters the listing
        alice.list_checkpoints(session_id=own)  # her own thread's checkpoints answer

        denied: dict[str, Callable[[], object]] = {
            "create_session": lambda: alice.create_session(user_id="bob"),
            "create_session(id)": lambda: alice.create_session(session_id=bob_sid, user_id="alice"),
            "get_session": lambda: alice.get_session(session_id=bob_sid),
            "list_sessions": lambda: alice.list_sessions(user_id="bob"),
            "append_messages": lambda: alice.append_messages(
                session_id=bob_sid, messages=[Message(role=Role.ROLE_USER, content="x")]
            ),
            "list_messages": lambda: alice.list_messages(session_id=bob_sid),
            "update_session": lambda: alice.update_session(
                session=pb.Session(session_id=bob_sid, tags=["x"]), update_mask=FieldMask(paths=["tags"])
            ),
            "close_session": lambda: alice.close_session(session_id=bob_sid),
            "promote_session": lambda: alice.promote_session(session_id=bob_sid, close=True),
            "assemble_context": lambda: list(
                alice.assemble_context(session_id=bob_sid, user_input="secret?")
            ),
            "list_turn_traces": lambda: alice.list_turn_traces(session_id=bob_sid),
            "search_memories": lambda: alice.search_memories(caller=mpb.Caller(user_id="bob"), query="jazz"),
            "get_profile": lambda: alice.get_profile(caller=mpb.Caller(user_id="bob")),
            "list_memories": lambda: alice.list_memories(caller=mpb.Caller(user_id="bob")),
            "create_memory": lambda: alice.create_memory(
                caller=mpb.Caller(user_id="bob"), kind=mpb.MEMORY_KIND_FACT, content="Bob hates jazz."
            ),
            "watch_session_events": lambda: next(iter(alice.watch_session_events(user_id="bob"))),
            "get_checkpoint": lambda: alice.get_checkpoint(session_id=bob_sid),
            "list_checkpoints": lambda: alice.list_checkpoints(session_id=bob_sid),
            "copy_checkpoints": lambda: alice.copy_checkpoints(
                source_session_id=bob_sid, target_session_id=own
            ),
            "copy_checkpoints(into bob)": lambda: alice.copy_checkpoints(
                source_session_id=own, target_session_id=bob_sid
            ),
            "prune_checkpoints": lambda: alice.prune_checkpoints(session_ids=[own, bob_sid]),
            "delete_checkpoints": lambda: alice.delete_checkpoints(session_id=bob_sid),
            "delete_checkpoint_runs": lambda: alice.delete_checkpoint_runs(run_ids=["run-1"]),
        }
        for name, call in denied.items():
            with pytest.raises(memlane.PermissionDeniedError):
                call()
                pytest.fail(f"{name} reached bob's data")
    with client(bound, "writer", bob_t) as bob:  # bob's data is untouched
        s = bob.get_session(session_id=bob_sid).session
        assert s.status == pb.SESSION_STATUS_ACTIVE and list(s.tags) == []
        assert [m.content for m in bob.list_messages(session_id=bob_sid).messages] == ["bob's secret"]
        assert [f.content for f in bob.get_profile(caller=mpb.Caller(user_id="bob")).facts] == [
            "Bob likes jazz."
        ]


def test_a_bound_watch_follows_its_user_only(bound: SidecarThread) -> None:
    bob_t = user_token("bob", key=FILE_KEY, kid="file-1")
    with client(bound, "writer", bob_t) as bob:
        bob.close_session(session_id=bob.create_session().session.session_id)
    with client(bound, "writer", user_token("alice")) as alice:
        last = alice.create_session().session.session_id
        alice.close_session(session_id=last)
        seen = []
        for resp in alice.watch_session_events(after_event_id="0", timeout=20):
            seen.append(resp.event)
            if resp.event.session_id == last and resp.event.type == spb.SESSION_EVENT_TYPE_CLOSED:
                break
        assert seen and {e.user_id for e in seen} == {"alice"}
    with client(bound, "admin", None) as admin:  # positive control: bob's events are in the stream
        for resp in admin.watch_session_events(after_event_id="0", user_id="bob", timeout=20):
            assert resp.event.user_id == "bob"
            break


async def test_the_async_client_carries_the_user_token(bound: SidecarThread) -> None:
    async with memlane.AsyncClient(
        bound.target, token=TOKENS["writer"], user_token=user_token("carol"), timeout=20
    ) as carol:
        made = (await carol.create_session()).session
        assert made.user_id == "carol"  # filled from the token
        with pytest.raises(memlane.PermissionDeniedError):
            await carol.list_sessions(user_id="alice")
    async with memlane.AsyncClient(bound.target, token=TOKENS["writer"], timeout=20) as anonymous:
        with pytest.raises(memlane.UnauthenticatedError):
            await anonymous.list_sessions(user_id="carol")


def test_bound_calls_keep_snapshots_and_learned_procedures_to_their_user(bound: SidecarThread) -> None:
    alice, bob = f"alice-{time.time_ns()}", f"bob-{time.time_ns()}"
    with client(bound, "writer", user_token(alice)) as a, client(bound, "writer", user_token(bob)) as b:
        a.create_memory(caller=mpb.Caller(), content="Alice keeps bees.", kind=mpb.MEMORY_KIND_FACT)
        snap = a.create_memory_snapshot(caller=mpb.Caller(), snapshot_id="mine").snapshot
        assert snap.user_id == alice and snap.item_count == 1  # the empty user field is the bound user
        for call in (
            lambda: b.get_memory_snapshot_diff(caller=mpb.Caller(user_id=alice), snapshot_id="mine"),
            lambda: b.restore_memory_snapshot(caller=mpb.Caller(user_id=alice), snapshot_id="mine"),
            lambda: b.list_memory_versions(caller=mpb.Caller(user_id=alice)),
        ):
            with pytest.raises(memlane.PermissionDeniedError):
                call()
        assert list(b.list_memory_snapshots(caller=mpb.Caller()).snapshots) == []
        assert [s.snapshot_id for s in a.list_memory_snapshots(caller=mpb.Caller()).snapshots] == ["mine"]

        sid = a.create_session(user_id=alice, agent_id="writer").session.session_id
        pid, routine = f"bees-{time.time_ns()}", ppb.PROCEDURE_KIND_ROUTINE
        with pytest.raises(memlane.PermissionDeniedError):  # bob's call cannot cite alice's session
            b.propose_procedure(
                procedure_id=pid, kind=routine, content="Ask about the bees.", source_session_id=sid
            )
        a.propose_procedure(
            procedure_id=pid, kind=routine, content="Ask about the bees.", source_session_id=sid
        )
        b.propose_procedure(procedure_id=pid, kind=routine, content="Greet first.")

        def versions(c: memlane.Client) -> list[str]:
            return [v.content for v in c.get_procedure(procedure_id=pid).procedure.versions]

        # A version learned from alice's session is alice's data: hidden from a call bound to bob.
        assert versions(a) == ["Ask about the bees.", "Greet first."]
        assert versions(b) == ["Greet first."]
