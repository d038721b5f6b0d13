"""The transport: one keep-alive httpx client, bearer auth, retries with backoff on 429 and 5xx
(and on connection failures), an idempotency key on every POST (the same key for each retry, so a
retried create is replayed, never done twice), and errors raised as `APIError`s."""

import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any

import httpx

from flywheel.errors import APIError, ConfigurationError

logger = logging.getLogger("flywheel")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
JSON = dict[str, Any]


class Transport:
    def __init__(
        self,
        *,
        url: str,
        token: str,
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        backoff_max: float = 30.0,
        http: httpx.Client | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"the Flywheel URL must start with http:// or https://; got {url!r}")
        if not token:
            raise ConfigurationError("no API token: pass token= or set FLYWHEEL_TOKEN")
        self.url = url.rstrip("/")
        self.token = token
        self.max_retries, self.backoff, self.backoff_max = max_retries, backoff, backoff_max
        headers = {"Authorization": f"Bearer {token}", "User-Agent": "flywheel-client/0.1"}
        self.http = http or httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        """Seconds before retry `attempt` (1-based): the server's Retry-After when it gives one,
        else exponential backoff with full jitter."""
        if (
            response is not None
            and (after := response.headers.get("Retry-After", "")).replace(".", "", 1).isdigit()
        ):
            return min(float(after), self.backoff_max)
        return random.uniform(0, min(self.backoff_max, self.backoff * 2 ** (attempt - 1)))

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
        headers = {}
        if method == "POST":
            headers["Idempotency-Key"] = idempotency_key or str(uuid.uuid4())
        # None, not {}: an empty params would replace the query of a `next` page's URL.
        params = {k: _query_value(v) for k, v in (params or {}).items() if v is not None} or None
        attempt = 0
        while True:
            attempt += 1
            response = None
            try:
                request = self.http.build_request(
                    method, path, params=params, json=json_body, files=files, data=data, headers=headers
                )
                response = self.http.send(request, stream=stream)
            except httpx.TransportError as exc:
                if attempt > self.max_retries:
                    raise
                logger.warning("%s %s failed (%s); retrying", method, path, exc)
            else:
                if response.status_code not in RETRY_STATUSES or attempt > self.max_retries:
                    break
                if stream:
                    response.close()
                logger.warning("%s %s answered %s; retrying", method, path, response.status_code)
            if files is not None:
                _rewind(files)
            time.sleep(self.delay(attempt, response))
        if response.status_code >= 400:
            if stream:
                response.read()
            raise _error(response)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.send(method, path, **kwargs)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def pages(self, path: str, params: dict[str, Any] | None = None) -> Iterator[JSON]:
        """Every object of a cursor-paginated list, fetching the next page as it goes."""
        body = self.json("GET", path, params=params)
        while True:
            if isinstance(body, list):  # an endpoint that answers the whole list at once
                yield from body
                return
            yield from body["results"]
            if not body.get("next"):
                return
            body = self.json("GET", body["next"])

    def download(
        self,
        path: str,
        out: IO[bytes],
        params: dict[str, Any] | None = None,
        progress: Callable[[int], Any] | None = None,
    ) -> int:
        """Write a binary download to `out` as it streams in; the bytes written."""
        response = self.send("GET", path, params=params, stream=True)
        written = 0
        try:
            for chunk in response.iter_bytes():
                out.write(chunk)
                written += len(chunk)
                if progress is not None:
                    progress(len(chunk))
        finally:
            response.close()
        return written

    def lines(self, path: str, params: dict[str, Any] | None = None) -> Iterator[JSON]:
        """The objects of an NDJSON download, one a line, as they stream in."""
        response = self.send("GET", path, params=params, stream=True)
        try:
            for line in response.iter_lines():
                if line.strip():
                    yield json.loads(line)
        finally:
            response.close()


def _query_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


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
