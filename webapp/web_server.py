"""How the local stack serves HTTP and websockets: uvicorn, with FLYWHEEL_WEB_WORKERS processes.

One ASGI server for both (Django's views and Channels' consumers share `webapp.asgi`), so pages,
REST and websockets keep one address; the processes share its socket, and the channel layer in
Redis carries websocket messages between them. Imported by the settings: no Django here.
"""

import os


def default_web_workers() -> int:
    """Two processes per core: Django's views are synchronous, so one process serves one request
    at a time, and a second per core keeps the core busy while the first waits on the database."""
    return 2 * (os.cpu_count() or 1)


def web_argv(*, python: str, bind: str, port: int, workers: int) -> list[str]:
    return [
        python,
        "-m",
        "uvicorn",
        "webapp.asgi:application",
        "--host",
        bind,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--loop",
        "uvloop",
        "--http",
        "httptools",
        "--ws",
        "websockets",
        # Compression is per message per viewer: a run's message went through zlib once for each
        # of its viewers (a fifth of a web process's time with 200 viewers, bench-live); live
        # messages are small JSON, so CPU is the scarcer resource.
        "--ws-per-message-deflate",
        "false",
        "--lifespan",
        "off",  # Django's ASGI handler has no lifespan events
        "--no-access-log",
        "--timeout-graceful-shutdown",
        "10",
    ]
