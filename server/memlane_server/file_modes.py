"""Who may read the sidecar's files: its own user alone. The data dir holds every user's turns and
memories (Redis's append-only file, LanceDB's tables, the archive and its turn traces), so another uid
on the host must not read any of it.

- A memlane process (``memlane serve``, ``memlane worker``) runs under umask 077 (``keep_private``):
  what it and its children create (the embedded Redis, worker processes, the model process) is 0600,
  directories 0700. The one file meant to be shared is the gRPC Unix socket: it keeps the mode the
  umask memlane was started with gives it (``share_socket``; the image starts under umask 0007 so an
  agent container in the pod's group can connect).
- A start finds the data dir as it is (an older memlane, an operator's ``mkdir``, an embedding program
  with its own umask) and tightens it (``tighten_data_dir``): the directory and what it holds directly
  lose the bits of others, and the bits of the group too, except on a data dir with the set-group-id
  bit: the mark of a volume whose group a platform manages (Kubernetes' ``fsGroup`` sets it, and puts
  group rights back on every file of the volume when it finds its root changed). Its store directories
  are 0700 whatever it is, which is what keeps the group out of them. One warning line says what was
  tightened. Tightened rather than refused: nobody but memlane has business in its data dir, and a
  start that refused would leave the files as readable as it found them.

Only the data dir and its direct entries are changed, not every file below: a directory of mode 0700
already keeps everyone else from every path beneath it, and walking a large table would slow the start.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("memlane")

PRIVATE_UMASK = 0o077
_started_with: list[int] = []  # the umask the process had before keep_private (for the socket)


def keep_private() -> None:
    """Makes every file this process and its children create its user's alone (umask 077)."""
    previous = os.umask(PRIVATE_UMASK)
    if not _started_with:
        _started_with.append(previous)


def share_socket(path: Path) -> None:
    """Gives a Unix socket bound under ``keep_private`` the mode the starting umask gives a new file (a
    client needs write permission to connect); nothing to do where ``keep_private`` was not called."""
    if _started_with:
        os.chmod(path, 0o666 & ~_started_with[0])


def tighten_data_dir(path: Path) -> None:
    """Takes away what others may do in the data dir (see the module's docstring); logs what changed."""
    managed = bool(path.stat().st_mode & stat.S_ISGID)
    changed = []
    root_mask = 0o007 if managed else 0o077
    if (was := _narrowed(path, root_mask)) is not None:
        changed.append(f"{path} {was:04o}")
    for entry in path.iterdir():
        info = entry.lstat()
        if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
            continue  # a socket keeps its mode (``share_socket``); a link is not followed
        if (was := _narrowed(entry, 0o077)) is not None:
            changed.append(f"{entry.name} {was:04o}")
    if changed:
        log.warning(
            "data_dir %s was open to other users; tightened to owner-only (%s): its files hold every"
            " user's data",
            path,
            ", ".join(changed),
        )


def _narrowed(path: Path, mask: int) -> int | None:
    """Clears ``mask`` from ``path``'s mode; returns the mode it had when that changed anything."""
    mode = stat.S_IMODE(path.lstat().st_mode)
    if not mode & mask:
        return None
    os.chmod(path, mode & ~mask)
    return mode
