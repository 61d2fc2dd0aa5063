"""Files only their owner can read: a real ``memlane serve`` (embedded Redis, a worker process, the model
process, long-term memory, the archive) leaves nothing under its data dir that another uid may read,
whatever umask it was started with, and tightens a data dir it finds open. docs/security.md, "Files"."""

from __future__ import annotations

import stat
import uuid
from pathlib import Path

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2 as mpb
from tests.integration.test_pod_faults import Pod, pods  # noqa: F401 - a fixture


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_served_data_dir_is_its_owners_alone(
    pods: list[Pod],  # noqa: F811 - the fixture imported from test_pod_faults
    tmp_path: Path,
) -> None:
    """On the base commit the data dir, the AOF, LanceDB's files and the archive were world-readable
    (0755/0644 under a common umask 022). Started under umask 022 on a data dir of mode 0755 holding an
    archive directory an older version left at 0755: one log line, then owner-only everywhere. Positive
    controls: the files checked exist (the AOF, LanceDB data, archive parts written by the worker
    process)."""
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)
    legacy = data / "archive"
    legacy.mkdir()
    legacy.chmod(0o755)
    (legacy / "left-by-an-older-version").write_bytes(b"old")
    (legacy / "left-by-an-older-version").chmod(0o644)
    pod = Pod(tmp_path, "a", data, umask="022", ltm_enabled="true", worker_processes=1)
    pods.append(pod)
    user = f"u-{uuid.uuid4().hex[:8]}"
    with memlane.Client(pod.target, timeout=120) as c:
        c.create_memory(caller=mpb.Caller(user_id=user), kind=mpb.MEMORY_KIND_FACT, content="Keeps bees.")
        sid = c.create_session(user_id=user).session.session_id
        c.append_messages(
            session_id=sid, messages=[Message(role=Role.ROLE_USER, content="I moved to Porto last spring.")]
        )
        list(c.assemble_context(session_id=sid, user_input="where do I live?"))
        c.promote_session(session_id=sid, close=True, timeout=120)
    log = pod.log.read_text()
    assert "tightened to owner-only" in log and "archive 0755" in log, log[-2000:]

    files = [p for p in sorted(data.rglob("*")) if p.name != "left-by-an-older-version"]
    names = {p.relative_to(data).parts[0] for p in files if p.is_file()}
    assert {"redis", "ltm", "archive"} <= names, names
    assert (data / "redis" / "appendonly.aof").exists() or list((data / "redis").glob("appendonly*"))
    assert list((data / "archive").rglob("*.parquet")) and list((data / "ltm").rglob("*.lance"))
    opened = {str(p.relative_to(data)): oct(_mode(p)) for p in [data, *files] if _mode(p) & 0o077}
    assert opened == {}, opened
    # What an older version left below keeps its mode, but no one else can reach it any more.
    assert _mode(legacy) == 0o700 and _mode(data) == 0o700
    # The socket as the umask it was started with makes it: others may not connect.
    assert not _mode(Path(pod.target.removeprefix("unix:"))) & 0o022


def test_the_image_umask_shares_only_the_socket(
    pods: list[Pod],  # noqa: F811 - the fixture imported from test_pod_faults
    tmp_path: Path,
) -> None:
    """Under the image's umask 0007 (so an agent in the pod's group can connect to the socket) the data
    files were group-readable too (0770 and 0660): now the socket alone is shared with the group (positive
    control), the data dir and its files are not."""
    data = tmp_path / "data"
    pod = Pod(tmp_path, "a", data, umask="0007")
    pods.append(pod)
    with memlane.Client(pod.target, timeout=60) as c:
        sid = c.create_session(user_id="u-image").session.session_id
        c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="hello")])
    opened = {str(p): oct(_mode(p)) for p in [data, *data.rglob("*")] if _mode(p) & 0o077}
    assert opened == {}, opened
    socket_mode = _mode(Path(pod.target.removeprefix("unix:")))
    assert socket_mode & 0o020 and not socket_mode & 0o007, oct(socket_mode)  # the group may connect
