"""Leases kept alive by the process that holds them.

Work claimed in the database (a rollout batch, an idempotency key's in-flight marker) carries a
short lease that its holder renews from a background thread while it works. A holder that dies
(kill -9, a lost host) stops renewing, so its claim lapses within one lease instead of blocking
the work for as long as the work could ever take.
"""

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil
from django.db import connection

logger = logging.getLogger(__name__)


@contextmanager
def lease_kept(renew: Callable[[], bool], *, every: float, name: str) -> Iterator[None]:
    """Call `renew` every `every` seconds in a thread while the block runs. `renew` returns False
    when the claim is gone (finished or taken over elsewhere): renewing then stops."""
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(every):
                try:
                    if not renew():
                        return
                except Exception:  # noqa: BLE001 - a missed renewal is retried; the lease has slack
                    logger.warning("could not renew the lease of %s", name, exc_info=True)
        finally:
            connection.close()  # this thread's own database connection

    thread = threading.Thread(target=beat, name=f"lease-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every + 5)


def process_identity() -> str:
    """host:pid:start-time of this process: unique even when the pid is reused later."""
    return f"{socket.gethostname()}:{os.getpid()}:{_started(os.getpid())}"


def process_gone(identity: str) -> bool:
    """True when `identity` names a process of this host that no longer exists. A process of
    another host cannot be seen from here: False (its lease decides)."""
    host, _, rest = identity.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return _started(int(pid)) != started


def _started(pid: int) -> str:
    try:
        return f"{psutil.Process(pid).create_time():.3f}"
    except psutil.Error:
        return "gone"
