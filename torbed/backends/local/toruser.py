"""The user tor runs as on the local backend: not root.

A scenario's extra torrc lines are checked against an allow-list (torbed.torrc_policy); this
is the layer under it. Run as root, a line that slipped through could make tor write anywhere
(``DataDirectory /etc``, ``Log notice file /etc/passwd``). So each tor drops to a uid of its
own (``setpriv --reuid --regid --clear-groups``, after ``ip netns exec`` entered its
namespace) that owns nothing on the machine but the run's data directories; everything else
tor needs comes to it without a path it must open:

- its data directory (keys, consensus, control socket) under the run's scratch directory,
  owned by that uid (the scratch directory itself is only traversable: 0711);
- its torrc and fragments copied into the scratch directory (the run directory may sit
  under a home directory tor's uid cannot enter); the run directory keeps the record;
- its log on stdout (``Log notice stdout``), a file torbed opened in the run directory;
- a tor binary from torbed's build cache (under a home directory too) copied into the
  scratch directory.

Not in a user-namespace run: only the invoking user's uid is mapped there, and tor already
runs as that user outside. ``TORBED_TOR_UID`` picks the uid (default ``DEFAULT_UID``; it must
have no account on the machine); ``TORBED_TOR_UID=0`` keeps tor as root.

Public API:

- ``TorUser(uid, gid)``; ``choose() -> (TorUser | None, why)``; ``TorUser.prefix() -> argv``
- ``own(path, user)``: chown a tree to the user
- ``reachable_binary(tor, scratch, user) -> str``: a copy tor's uid may execute, where needed
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError, RunFailed

DEFAULT_UID = 64123     # unlikely to be anybody's: Debian leaves 60000-64999 unassigned


@dataclass(frozen=True)
class TorUser:
    uid: int
    gid: int

    def prefix(self) -> list[str]:
        """argv prefix that runs a command as this user. The parent-death signal is set
        again: a change of uid clears it (prctl(2))."""
        return [shutil.which("setpriv") or "setpriv", f"--reuid={self.uid}", f"--regid={self.gid}",
                "--clear-groups", "--pdeathsig=KILL", "--"]

    def describe(self) -> dict:
        return {"uid": self.uid, "gid": self.gid}


def choose() -> tuple[TorUser | None, str | None]:
    """The user tor runs as, or (None, why tor runs as the caller). Raises InputError for a
    TORBED_TOR_UID that is no uid or an account's, RunFailed without setpriv."""
    if os.environ.get("TORBED_IN_USERNS"):
        return None, "user namespace: only the invoking user is mapped, and tor runs as that user outside it"
    if os.geteuid() != 0:
        return None, "torbed is not root"
    raw = os.environ.get("TORBED_TOR_UID", str(DEFAULT_UID))
    try:
        uid = int(raw)
    except ValueError:
        raise InputError(f"TORBED_TOR_UID={raw!r}: a whole number, the uid tor runs as (0: root)") from None
    if uid == 0:
        return None, "TORBED_TOR_UID=0"
    if not 0 < uid < 2**32 - 1:
        raise InputError(f"TORBED_TOR_UID={uid}: not a uid")
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        account = None
    if account is not None:
        raise InputError(f"TORBED_TOR_UID={uid} is the account '{account.pw_name}': tor needs a uid that owns "
                        "nothing on this machine; set TORBED_TOR_UID to an unused one")
    if not shutil.which("setpriv"):
        raise RunFailed("'setpriv' (util-linux) not found: it drops tor's privileges; install util-linux, "
                        "or set TORBED_TOR_UID=0 to run tor as root")
    return TorUser(uid, uid), None


def own(path: Path, user: TorUser | None) -> None:
    """``chown -R`` to ``user`` (nothing for None)."""
    if user is None:
        return
    os.chown(path, user.uid, user.gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), user.uid, user.gid, follow_symlinks=False)


def reachable_binary(tor: str, scratch: Path, user: TorUser | None) -> str:
    """``tor`` itself when every directory above it may be entered by anyone (/usr/bin/tor),
    else a hard link (same file system, executable by anyone) or a copy under ``scratch``/bin
    (a build in root's cache: /root is 0700; a copy of a 14 MB tor otherwise)."""
    if user is None or _world_reachable(Path(tor)):
        return tor
    digest = hashlib.sha256(tor.encode()).hexdigest()[:12]
    dest = scratch / "bin" / digest / Path(tor).name
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(scratch / "bin", 0o755)
        os.chmod(dest.parent, 0o755)
        try:
            if not os.stat(tor).st_mode & 0o001:
                raise PermissionError(tor)
            os.link(tor, dest)
        except OSError:
            shutil.copy2(tor, dest)
            os.chmod(dest, 0o755)
    return str(dest)


def _world_reachable(path: Path) -> bool:
    path = path.resolve()
    try:
        if not path.stat().st_mode & 0o001:
            return False
        return all(p.stat().st_mode & 0o001 for p in path.parents)
    except OSError:
        return False
