"""Host uids for sandboxes, one per live sandbox, claimed with a lock file so that worker processes
on the same host never share one (a shared uid would share RLIMIT_NPROC and signal permissions)."""

import fcntl
import os
from pathlib import Path

from .interface import InfrastructureError

UID_COUNT = 4096


class UidLease:
    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def uid_claim(*, base: int, state_dir: str) -> UidLease:
    start = os.getpid() % UID_COUNT  # spread processes out so that claims rarely collide
    for step in range(UID_COUNT):
        lease = uid_try(base + (start + step) % UID_COUNT, state_dir=state_dir)
        if lease is not None:
            return lease
    raise InfrastructureError(f"all {UID_COUNT} sandbox uids from {base} are in use on this host")


def uid_try(uid: int, *, state_dir: str) -> UidLease | None:
    """The lease of this very uid, or None while a live sandbox holds it."""
    folder = Path(state_dir) / "uids"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(folder / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return UidLease(uid, fd)
