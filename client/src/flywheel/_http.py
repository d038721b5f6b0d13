"""The transports: one keep-alive httpx client (`Transport`, or `AsyncTransport` on
httpx.AsyncClient), bearer auth, retries with backoff on 429 and 5xx (and on connection failures),
an idempotency key on every POST (the same key for each retry, so a retried create is replayed,
never done twice), errors raised as `APIError`s, and every JSON object answered as a `Record`.

Both transports offer the same calls (json, pages, lines, download); the resources are written once
against them, so a resource on an AsyncTransport answers coroutines and async iterators."""

import asyncio
import json
import logging
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from flywheel._records import Record, shaped
from flywheel.errors import APIError, ConfigurationError

logger = logging.getLogger("flywheel")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
JSON = dict[str, Any]  # what callers send; what the API answers is a Record
USER_AGENT = "flywheel-client/0.2"


class _Base:
    """What both transports share: configuration, the retry delay, the request's headers and query."""

    def __init__(
        self, *, url: str, token: str, max_retries: int = 4, backoff: float = 0.5, backoff_max: float = 30.0
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"the Flywheel URL must start with http:// or https://; got {url!r}")
        if not token:
            raise ConfigurationError("no API token: pass token= or set FLYWHEEL_TOKEN")
        self.url = url.rstrip("/")
        self.token = token
        self.max_retries, self.backoff, self.backoff_max = max_retries, backoff, backoff_max
        self.headers = {"Authorization": f"Bearer {token}", "User-Agent": USER_AGENT}

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        """Seconds before retry `attempt` (1-based): the server's Retry-After when it gives one,
        else exponential backoff with full jitter."""
        if (
            response is not None
            and (after := response.headers.get("Retry-After", "")).replace(".", "", 1).isdigit()
        ):
            return min(float(after), self.backoff_max)
        return random.uniform(0, min(self.backoff_max, self.backoff * 2 ** (attempt - 1)))

    def retry(self, method: str, path: str, attempt: int, failure: object) -> bool:
        """Whether to try again after `failure` (an exception, or a status to retry), logging it."""
        if attempt > self.max_retries:
            return False
        logger.warning("%s %s failed (%s); retrying", method, path, failure)
        return True


def _prepare(method: str, params: dict[str, Any] | None, idempotency_key: str | None) -> tuple[dict, Any]:
    headers = {}
    if method == "POST":
        headers["Idempotency-Key"] = idempotency_key or str(uuid.uuid4())
    # None, not {}: an empty params would replace the query of a `next` page's URL.
    query = {k: _query_value(v) for k, v in (params or {}).items() if v is not None} or None
    return headers, query


def _decoded(response: httpx.Response, shape: type[Record]) -> Any:
    if response.status_code == 204 or not response.content:
        return None
    return shaped(Record.wrap(response.json()), shape)


class Transport(_Base):
    def __init__(
        self, *, url: str, token: str, timeout: float = 60.0, http: httpx.Client | None = None, **retries: Any
    ) -> None:
        super().__init__(url=url, token=token, **retries)
        self.http = http or httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        files: Any = None,
        data: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        headers, query = _prepare(method, params, idempotency_key)
        attempt = 0
        with ExitStack() as opened:
            files = _open_files(files, opened)
            while True:
                attempt += 1
                response = None
                try:
                    request = self.http.build_request(
                        method, path, params=query, json=json_body, files=files, data=data, headers=headers
                    )
                    response = self.http.send(request, stream=stream)
                except httpx.TransportError as exc:
                    if not self.retry(method, path, attempt, exc):
                        raise
                else:
                    if response.status_code not in RETRY_STATUSES or not self.retry(
                        method, path, attempt, response.status_code
                    ):
                        break
                    if stream:
                        response.close()
                if files is not None:
                    _rewind(files)
                time.sleep(self.delay(attempt, response))
        if response.status_code >= 400:
            if stream:
                response.read()
            raise _error(response)
        return response

    def json(self, method: str, path: str, *, shape: type[Record] = Record, **kwargs: Any) -> Any:
        """The answer's JSON, its objects Records (the top one, or a list's, as `shape`)."""
        return _decoded(self.send(method, path, **kwargs), shape)

    def pages(
        self, path: str, params: dict[str, Any] | None = None, *, shape: type[Record] = Record
    ) -> Iterator[Record]:
        """Every object of a cursor-paginated list, fetching the next page as it goes."""
        body = self.json("GET", path, params=params)
        while True:
            if isinstance(body, list):  # an endpoint that answers the whole list at once
                yield from shaped(body, shape)
                return
            yield from shaped(body["results"], shape)
            if not body.get("next"):
                return
            body = self.json("GET", body["next"])

    def download(
        self,
        path: str,
        out: str | os.PathLike,
        params: dict[str, Any] | None = None,
        progress: Callable[[int], Any] | None = None,
    ) -> Path:
        """Stream a binary download to the file `out`; no half-written file is left on failure."""
        target = Path(out)
        try:
            with open(target, "wb") as handle:
                response = self.send("GET", path, params=params, stream=True)
                try:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
                        if progress is not None:
                            progress(len(chunk))
                finally:
                    response.close()
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return target

    def lines(self, path: str, params: dict[str, Any] | None = None) -> Iterator[Record]:
        """The objects of an NDJSON download, one a line, as they stream in."""
        response = self.send("GET", path, params=params, stream=True)
        try:
            for line in response.iter_lines():
                if line.strip():
                    yield Record.wrap(json.loads(line))
        finally:
            response.close()


class AsyncTransport(_Base):
    """Transport's calls as coroutines (json, download) and async iterators (pages, lines)."""

    def __init__(
        self,
        *,
        url: str,
        token: str,
        timeout: float = 60.0,
        http: httpx.AsyncClient | None = None,
        **retries: Any,
    ) -> None:
        super().__init__(url=url, token=token, **retries)
        self.http = http or httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=timeout)

    async def close(self) -> None:
        await self.http.aclose()

    async def send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        files: Any = None,
        data: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        headers, query = _prepare(method, params, idempotency_key)
        attempt = 0
        with ExitStack() as opened:
            files = _open_files(files, opened)
            while True:
                attempt += 1
                response = None
                try:
                    request = self.http.build_request(
                        method, path, params=query, json=json_body, files=files, data=data, headers=headers
                    )
                    response = await self.http.send(request, stream=stream)
                except httpx.TransportError as exc:
                    if not self.retry(method, path, attempt, exc):
                        raise
                else:
                    if response.status_code not in RETRY_STATUSES or not self.retry(
                        method, path, attempt, response.status_code
                    ):
                        break
                    if stream:
                        await response.aclose()
                if files is not None:
                    _rewind(files)
                await asyncio.sleep(self.delay(attempt, response))
        if response.status_code >= 400:
            if stream:
                await response.aread()
            raise _error(response)
        return response

    async def json(self, method: str, path: str, *, shape: type[Record] = Record, **kwargs: Any) -> Any:
        return _decoded(await self.send(method, path, **kwargs), shape)

    async def pages(
        self, path: str, params: dict[str, Any] | None = None, *, shape: type[Record] = Record
    ) -> AsyncIterator[Record]:
        body = await self.json("GET", path, params=params)
        while True:
            if isinstance(body, list):
                for item in shaped(body, shape):
                    yield item
                return
            for item in shaped(body["results"], shape):
                yield item
            if not body.get("next"):
                return
            body = await self.json("GET", body["next"])

    async def download(
        self,
        path: str,
        out: str | os.PathLike,
        params: dict[str, Any] | None = None,
        progress: Callable[[int], Any] | None = None,
    ) -> Path:
        target = Path(out)
        try:
            with open(target, "wb") as handle:
                response = await self.send("GET", path, params=params, stream=True)
                try:
                    async for chunk in response.aiter_bytes():
                        handle.write(chunk)
                        if progress is not None:
                            progress(len(chunk))
                finally:
                    await response.aclose()
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return target

    async def lines(self, path: str, params: dict[str, Any] | None = None) -> AsyncIterator[Record]:
        response = await self.send("GET", path, params=params, stream=True)
        try:
            async for line in response.aiter_lines():
                if line.strip():
                    yield Record.wrap(json.loads(line))
        finally:
            await response.aclose()


def _query_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _open_files(files: Any, opened: ExitStack) -> Any:
    """`files` with each path in it opened (closed when `opened` closes): resources pass a path
    through, so the file is open only while its request is sent, by either transport."""
    if not isinstance(files, dict):
        return files
    result = {}
    for field, entry in files.items():
        if isinstance(entry, tuple) and isinstance(entry[1], (str, os.PathLike)):
            entry = (entry[0], opened.enter_context(open(entry[1], "rb")), *entry[2:])  # noqa: SIM115
        result[field] = entry
    return result


def _rewind(files: Any) -> None:
    for entry in files.values() if isinstance(files, dict) else files:
        handle = entry[1] if isinstance(entry, tuple) else entry
        if hasattr(handle, "seek"):
            handle.seek(0)


def _error(response: httpx.Response) -> APIError:
    try:
        body = response.json()
    except ValueError:
        body = None
    request = response.request
    return APIError.from_response(
        response.status_code, body, response.text, method=request.method, url=str(request.url)
    )
