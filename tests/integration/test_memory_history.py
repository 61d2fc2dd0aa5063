"""Versions and snapshots of a user's long-term memory through the real server: every change kept as a
version (who, when, why), a named snapshot taken, listed, diffed against now and restored (undoing a bad
extraction batch), access-controlled like the rest of the memory API, and driven from the CLI."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from memlane_server.cli import main
from tests.conftest import ServerFactory

R = mpb.MemoryChangeReason
AGENTS = ("alpha", "beta")
TOKENS = {a: f"tok-{a}-{uuid.uuid4().hex[:6]}" for a in AGENTS}


@pytest.fixture(scope="module")
def dev(start_server: ServerFactory) -> SidecarThread:
    return start_server(ltm_snapshots_max_per_user=3)


@pytest.fixture(scope="module")
def c(dev: SidecarThread) -> Iterator[memlane.Client]:
    with memlane.Client(dev.target, timeout=60) as client:
        yield client


def _fact(c: memlane.Client, user: str, content: str, slot: str = "") -> mpb.Memory:
    return c.create_memory(
        caller=mpb.Caller(user_id=user), content=content, kind=mpb.MEMORY_KIND_FACT, slot=slot
    ).memory


def _versions(c: memlane.Client, user: str, memory_id: str = "", agent: str = "") -> list[mpb.MemoryVersion]:
    caller = mpb.Caller(user_id=user, agent_id=agent)
    return list(
        memlane.iter_pages(
            lambda t: c.list_memory_versions(caller=caller, memory_id=memory_id, page_size=2, page_token=t),
            "versions",
        )
    )


def _state(c: memlane.Client, user: str) -> dict[str, tuple[str, str, int]]:
    """Every item, retired ones too: (content, superseded_by, valid_until)."""
    flt = mpb.MemoryFilter(include_retired=True)
    items = c.list_memories(caller=mpb.Caller(user_id=user), filter=flt, page_size=500).memories
    return {m.memory_id: (m.content, m.superseded_by, m.valid_until_unix_ms) for m in items}


def test_every_change_is_a_version(c: memlane.Client, user_id: str) -> None:
    city = _fact(c, user_id, "The user lives in Madrid.", slot="location")
    caller = mpb.Caller(user_id=user_id)
    city.importance = 0.9
    c.update_memory(caller=caller, memory=city, update_mask=FieldMask(paths=["importance"]))
    c.record_feedback(caller=caller, memory_id=city.memory_id, verdict=mpb.FEEDBACK_VERDICT_USEFUL)
    moved = _fact(c, user_id, "The user lives in Seville.", slot="location")
    pet = _fact(c, user_id, "The user has a dog named Rex.")
    c.delete_memory(caller=caller, memory_id=pet.memory_id)

    history = _versions(c, user_id, city.memory_id)
    assert [v.reason for v in history] == [
        R.MEMORY_CHANGE_REASON_CREATE,
        R.MEMORY_CHANGE_REASON_EDIT,
        R.MEMORY_CHANGE_REASON_FEEDBACK,
        R.MEMORY_CHANGE_REASON_SUPERSEDE,
    ]
    assert history[0].memory.importance == pytest.approx(0.5) and history[
        1
    ].memory.importance == pytest.approx(0.9)
    assert history[-1].memory.superseded_by == moved.memory_id
    assert all(v.changed_at_unix_ms > 0 for v in history)
    assert [v.changed_at_unix_ms for v in history] == sorted(v.changed_at_unix_ms for v in history)
    [*_, gone] = _versions(c, user_id, pet.memory_id)
    assert gone.reason == R.MEMORY_CHANGE_REASON_DELETE and gone.deleted and "Rex" in gone.memory.content
    everything = _versions(c, user_id)  # paginated two at a time: every version once, in order
    assert len(everything) == len({(v.memory_id, v.changed_at_unix_ms, v.reason) for v in everything}) >= 7

    # An extraction and a merge say so, with the writing agent as who.
    ex = c.extract_memories(
        caller=mpb.Caller(user_id=user_id, agent_id="bot"),
        messages=[Message(role=Role.ROLE_USER, content="I prefer tea over coffee.")],
    )
    [first] = [m.memory for m in ex.memories]
    again = c.extract_memories(
        caller=mpb.Caller(user_id=user_id, agent_id="bot"),
        messages=[Message(role=Role.ROLE_USER, content="I prefer tea over coffee.")],
    )
    assert again.memories[0].outcome == mpb.INGEST_OUTCOME_MERGED
    reasons = [(v.reason, v.changed_by) for v in _versions(c, user_id, first.memory_id)]
    assert reasons == [(R.MEMORY_CHANGE_REASON_EXTRACTION, "bot"), (R.MEMORY_CHANGE_REASON_MERGE, "bot")]


def test_a_snapshot_undoes_a_bad_extraction_batch(c: memlane.Client, user_id: str) -> None:
    caller = mpb.Caller(user_id=user_id)
    _fact(c, user_id, "The user lives in Madrid.", slot="location")
    _fact(c, user_id, "The user works as a nurse.")
    before = _state(c, user_id)
    snap = c.create_memory_snapshot(caller=caller, snapshot_id="before-batch", note="nightly").snapshot
    assert snap.item_count == 2 and snap.note == "nightly"
    with pytest.raises(memlane.AlreadyExistsError):
        c.create_memory_snapshot(caller=caller, snapshot_id="before-batch")

    # The bad batch: a wrong move (retires Madrid) and a wrong new fact.
    c.extract_memories(
        caller=caller,
        messages=[Message(role=Role.ROLE_USER, content="I live in Paris. I am allergic to peanuts.")],
    )
    c.record_feedback(caller=caller, memory_id=next(iter(before)), verdict=mpb.FEEDBACK_VERDICT_WRONG)
    after = _state(c, user_id)
    assert after != before  # positive control: the batch changed the memory

    diff = c.get_memory_snapshot_diff(caller=caller, snapshot_id="before-batch").diffs
    kinds = {d.memory_id: d.kind for d in diff}
    assert {kinds[i] for i in after.keys() - before.keys()} == {mpb.MEMORY_DIFF_KIND_ADDED}
    assert mpb.MEMORY_DIFF_KIND_CHANGED in kinds.values()
    assert all(i in after for i in kinds)  # nothing was removed

    restored = c.restore_memory_snapshot(caller=caller, snapshot_id="before-batch", backup_snapshot_id="oops")
    assert len(restored.diffs) == len(diff) and restored.backup.item_count == len(after)
    assert _state(c, user_id) == before
    assert c.get_memory_snapshot_diff(caller=caller, snapshot_id="before-batch").diffs == []
    hits = c.search_memories(caller=caller, query="where does the user live").results
    assert any("Madrid" in h.memory.content for h in hits) and not any(
        "Paris" in h.memory.content for h in hits
    )
    # The restore is versioned too, and can itself be undone from the backup.
    assert any(v.reason == R.MEMORY_CHANGE_REASON_RESTORE for v in _versions(c, user_id))
    c.restore_memory_snapshot(caller=caller, snapshot_id="oops")
    assert _state(c, user_id).keys() == after.keys()

    listed = [s.snapshot_id for s in c.list_memory_snapshots(caller=caller).snapshots]
    assert listed == ["oops", "before-batch"]
    c.create_memory_snapshot(caller=caller, snapshot_id="third")
    with pytest.raises(memlane.ResourceExhaustedError):  # ltm_snapshots_max_per_user=3
        c.create_memory_snapshot(caller=caller, snapshot_id="fourth")
    c.delete_memory_snapshot(caller=caller, snapshot_id="third")
    with pytest.raises(memlane.NotFoundError):
        c.get_memory_snapshot_diff(caller=caller, snapshot_id="third")


def _policy_server(start_server: ServerFactory, tmp: Path) -> SidecarThread:
    path = tmp / "policy.yaml"
    tokens = [{"sha256": hashlib.sha256(TOKENS[a].encode()).hexdigest(), "agent": a} for a in AGENTS]
    path.write_text(yaml.safe_dump({"tokens": tokens}))
    return start_server(auth_required=True, access_policy_file=str(path))


def test_snapshots_and_versions_follow_the_access_rule(
    start_server: ServerFactory, tmp_path: Path, user_id: str
) -> None:
    secured = _policy_server(start_server, tmp_path)
    with (
        memlane.Client(secured.target, token=TOKENS["alpha"], timeout=60) as alpha,
        memlane.Client(secured.target, token=TOKENS["beta"], timeout=60) as beta,
    ):
        mine = mpb.Caller(user_id=user_id)
        private = alpha.create_memory(
            caller=mine, content="Alpha's private note on the user.", kind=mpb.MEMORY_KIND_FACT,
            scope=mpb.MEMORY_SCOPE_AGENT,
        ).memory  # fmt: skip
        shared = alpha.create_memory(
            caller=mine, content="The user speaks Basque.", kind=mpb.MEMORY_KIND_FACT
        )
        assert len(_versions(alpha, user_id, private.memory_id)) == 1
        with pytest.raises(memlane.NotFoundError):  # beta cannot read alpha's private item...
            beta.list_memory_versions(caller=mine, memory_id=private.memory_id)
        seen = {v.memory_id for v in _versions(beta, user_id)}
        assert shared.memory.memory_id in seen and private.memory_id not in seen  # ...nor its versions

        snap = alpha.create_memory_snapshot(caller=mine, snapshot_id="a1").snapshot
        assert snap.agent_id == "alpha" and snap.item_count == 2
        beta_snap = beta.create_memory_snapshot(caller=mine, snapshot_id="b1").snapshot
        assert beta_snap.item_count == 1  # beta's view holds no private item of alpha's
        assert [s.snapshot_id for s in beta.list_memory_snapshots(caller=mine).snapshots] == ["b1"]
        with pytest.raises(memlane.NotFoundError):
            beta.get_memory_snapshot_diff(caller=mine, snapshot_id="a1")
        with pytest.raises(memlane.NotFoundError):
            beta.restore_memory_snapshot(caller=mine, snapshot_id="a1")
        alpha.delete_memory(caller=mine, memory_id=private.memory_id)
        alpha.restore_memory_snapshot(caller=mine, snapshot_id="a1")  # positive control: the owner may
        assert alpha.get_memory(caller=mine, memory_id=private.memory_id).memory.content.startswith("Alpha")


def test_snapshot_cli(
    dev: SidecarThread, c: memlane.Client, user_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = ["--target", dev.target]
    _fact(c, user_id, "The user collects stamps.")
    assert main(["snapshots", "take", "--user", user_id, "cli-1", *target]) == 0
    _fact(c, user_id, "The user collects coins.")
    capsys.readouterr()
    assert main(["snapshots", "list", "--user", user_id, *target]) == 0
    assert [json.loads(line)["snapshot_id"] for line in capsys.readouterr().out.splitlines()] == ["cli-1"]
    assert main(["snapshots", "diff", "--user", user_id, "cli-1", *target]) == 0
    [added] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert added["kind"] == "added" and "coins" in added["after"]["content"]
    assert main(["snapshots", "restore", "--user", user_id, "cli-1", *target]) == 0
    assert json.loads(capsys.readouterr().out)["undone"] == {"added": 1}
    assert [m.content for m in c.list_memories(caller=mpb.Caller(user_id=user_id)).memories] == [
        "The user collects stamps."
    ]
    assert main(["snapshots", "diff", "--user", user_id, "nope", *target]) == 1


def test_a_restore_keeps_to_the_snapshots_view(c: memlane.Client, user_id: str) -> None:
    """A caller that reads a group's items only since the snapshot does not see them as additions."""
    plain, grouped = (
        mpb.Caller(user_id=user_id, agent_id="x"),
        mpb.Caller(user_id=user_id, agent_id="x", groups=["g1"]),
    )
    c.create_memory(caller=plain, content="The user likes jazz.", kind=mpb.MEMORY_KIND_FACT)
    c.create_memory_snapshot(caller=plain, snapshot_id="narrow")
    team = c.create_memory(
        caller=grouped, content="The team ships on Fridays.", kind=mpb.MEMORY_KIND_FACT,
        scope=mpb.MEMORY_SCOPE_GROUP, group="g1",
    ).memory  # fmt: skip
    extra = c.create_memory(caller=plain, content="The user likes opera.", kind=mpb.MEMORY_KIND_FACT).memory
    diffs = c.get_memory_snapshot_diff(caller=grouped, snapshot_id="narrow").diffs
    assert [(d.memory_id, d.kind) for d in diffs] == [(extra.memory_id, mpb.MEMORY_DIFF_KIND_ADDED)]
    c.restore_memory_snapshot(caller=grouped, snapshot_id="narrow")
    assert c.get_memory(caller=grouped, memory_id=team.memory_id).memory.content.startswith("The team")
    with pytest.raises(memlane.NotFoundError):  # positive control: the restore did delete the addition
        c.get_memory(caller=grouped, memory_id=extra.memory_id)
