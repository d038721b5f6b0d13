"""Background batching of traces: `log_trace` returns at once; a thread sends the queued traces
in batches (at most `batch_size`, at least every `interval` seconds), and whatever is left is sent
on `flush()`, `close()` and at interpreter exit."""

import atexit
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("flywheel")
Send = Callable[[int, list[dict[str, Any]]], Any]


class TraceBatcher:
    def __init__(
        self, send: Send, *, batch_size: int = 100, interval: float = 1.0, max_queue: int = 100_000
    ) -> None:
        self._send, self.batch_size, self.interval = send, batch_size, interval
        self._queue: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue(maxsize=max_queue)
        self._lock = threading.Lock()  # one sender at a time: the thread, or a flush
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flywheel-traces", daemon=True)
        self.sent = 0
        self.failed = 0
        self._thread.start()
        atexit.register(self.close)

    def put(self, project: int, trace: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait((project, trace))
        except queue.Full:
            self.flush()  # back-pressure: the caller waits for one send rather than losing traces
            self._queue.put((project, trace))

    def _run(self) -> None:
        while not self._stop.is_set():
            deadline = time.monotonic() + self.interval
            while (
                self._queue.qsize() < self.batch_size
                and time.monotonic() < deadline
                and not self._stop.is_set()
            ):
                self._stop.wait(0.02)
            self._drain(once=True)

    def _take(self) -> list[tuple[int, dict[str, Any]]]:
        taken: list[tuple[int, dict[str, Any]]] = []
        while len(taken) < self.batch_size:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return taken

    def _drain(self, *, once: bool = False) -> None:
        with self._lock:
            while taken := self._take():
                by_project: dict[int, list[dict[str, Any]]] = {}
                for project, trace in taken:
                    by_project.setdefault(project, []).append(trace)
                for project, traces in by_project.items():
                    try:
                        self._send(project, traces)
                        self.sent += len(traces)
                    except Exception:  # noqa: BLE001 - a background sender must not die; counted and logged
                        self.failed += len(traces)
                        logger.exception(
                            "flywheel: %d traces for project %s were not recorded", len(traces), project
                        )
                if once:
                    return

    def flush(self) -> None:
        """Send everything queued so far, now."""
        self._drain()

    def close(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout=10)
        self.flush()
        atexit.unregister(self.close)
