"""Streaming responses that stay streamed under ASGI.

Under ASGI, Django consumes a synchronous iterator whole before sending it; a large export
would sit in memory. An asynchronous iterator that pulls chunks in the sync thread keeps
memory flat whichever server runs the app.
"""

from collections.abc import AsyncIterator, Iterable, Iterator
from itertools import islice

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest

LINES_PER_CHUNK = 1000


def streamed(request: HttpRequest, lines: Iterable[str]) -> Iterator[str] | AsyncIterator[str]:
    if not isinstance(request, ASGIRequest):
        return iter(lines)
    iterator = iter(lines)

    def next_chunk() -> str:
        return "".join(islice(iterator, LINES_PER_CHUNK))

    async def chunks() -> AsyncIterator[str]:
        # thread_sensitive (the default) keeps every pull on one thread, and so on one DB cursor.
        while chunk := await sync_to_async(next_chunk)():
            yield chunk

    return chunks()


def streamed_bytes(request: HttpRequest, chunks: Iterable[bytes]) -> Iterator[bytes] | AsyncIterator[bytes]:
    """Binary chunks (an archive as it is written), pulled one at a time in the sync thread."""
    if not isinstance(request, ASGIRequest):
        return iter(chunks)
    iterator = iter(chunks)

    async def pull() -> AsyncIterator[bytes]:
        while chunk := await sync_to_async(next, thread_sensitive=False)(iterator, b""):  # type: ignore[call-arg]  # asgiref types next() with one argument
            yield chunk

    return pull()
