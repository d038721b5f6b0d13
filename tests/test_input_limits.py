"""Request body limits on a real web server process, with its memory measured from outside: an
oversized body is refused with 413 in the error shape before authentication and before it is read,
so the server's memory does not grow with it, signed in or not."""

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests

from projects import services as project_services
from projects.models import TaskSetVersion
from tests.conftest import make_project, make_user
from tests.run_harness import worker_env
from tests.web_server import WebServer

MB = 1024 * 1024
UPLOAD_LIMIT_MB = 8
BODY_LIMIT_MB = 1
OVERSIZED = 200 * MB  # the probe's 216 MB POST grew the process by 1.7 GB
# Growth allowed while the server refuses 200 MB: interpreter noise, not the body.
MEMORY_SLACK = 25 * MB


class Zeros:
    """A body of `size` bytes, sent from a declared length without being held in memory."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sent = 0

    def __len__(self) -> int:
        return self.size

    def read(self, amount: int = -1) -> bytes:
        amount = self.size - self.sent if amount < 0 else min(amount, self.size - self.sent)
        self.sent += amount
        return b"a" * amount


def chunks(size: int, chunk: int = MB):
    """The same, with no declared length (chunked transfer encoding)."""
    for _ in range(size // chunk):
        yield b"a" * chunk


class PeakMemory:
    """Samples the resident memory of a server (its process and any worker processes) in a thread
    while a block runs; `growth` is the peak over what it held before."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.before = self.peak = 0
        self.running = False

    def rss(self) -> int:
        processes = [self.process, *self.process.children(recursive=True)]
        return sum(process.memory_info().rss for process in processes)

    def __enter__(self) -> "PeakMemory":
        self.before = self.peak = self.rss()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.rss())
            time.sleep(0.005)

    def __exit__(self, *exc_info) -> None:
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.rss())

    @property
    def growth(self) -> int:
        return self.peak - self.before


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup, django_db_blocker):
    """The web server on the test database, with small limits so the test sends little."""
    env = worker_env(FLYWHEEL_MAX_UPLOAD_MB=str(UPLOAD_LIMIT_MB), FLYWHEEL_MAX_BODY_MB=str(BODY_LIMIT_MB))
    with WebServer(env, tmp_path_factory.mktemp("web") / "web.log") as web:
        yield web


@pytest.fixture
def lab(transactional_db):
    owner = make_user("owner")
    project = make_project(owner)
    task_set = project_services.task_set_create(project=project, name="arith", by=owner)
    _, token = project_services.api_token_create(user=owner, name="tests")
    return {"task_set": task_set, "auth": {"Authorization": f"Bearer {token}"}}


def assert_too_large(response: requests.Response, limit_mb: int, setting: str) -> None:
    assert response.status_code == 413
    assert response.headers["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert (error["code"], error["param"], error["details"]) == ("payload_too_large", "body", [])
    assert f"at most {limit_mb} MB (the server's {setting})" in error["message"]


def upload(server, task_set, body, headers=None) -> requests.Response:
    url = f"{server.url}/api/v1/task-sets/{task_set.pk}/import"
    content_type = {"Content-Type": "multipart/form-data; boundary=flywheel"}
    return requests.post(url, data=body, headers=content_type | (headers or {}), timeout=120)


@pytest.mark.parametrize("signed_in", [False, True])
def test_an_oversized_upload_is_refused_unread_and_the_server_does_not_grow(server, lab, signed_in):
    headers = lab["auth"] if signed_in else {}
    with PeakMemory(server.pid) as memory:
        response = upload(server, lab["task_set"], Zeros(OVERSIZED), headers)
    assert_too_large(response, UPLOAD_LIMIT_MB, "FLYWHEEL_MAX_UPLOAD_MB")
    assert "the request body is 200.0 MB" in response.json()["error"]["message"]
    assert memory.growth < MEMORY_SLACK, f"grew {memory.growth / MB:.0f} MB"
    assert TaskSetVersion.objects.count() == 0


@pytest.mark.parametrize("signed_in", [False, True])
def test_the_refusal_comes_before_a_byte_of_the_body_is_sent(server, lab, signed_in):
    """Headers announcing 200 MB, and no body: the answer comes at once, so nothing waited to read it."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.putrequest("POST", f"/api/v1/task-sets/{lab['task_set'].pk}/import")
    headers = lab["auth"] if signed_in else {}
    for name, value in (headers | {"Content-Type": "multipart/form-data; boundary=flywheel"}).items():
        connection.putheader(name, value)
    connection.putheader("Content-Length", str(OVERSIZED))
    connection.endheaders()  # the headers go; not one byte of the body follows them
    try:
        response = connection.getresponse()
        assert response.status == 413
        assert json.loads(response.read())["error"]["code"] == "payload_too_large"
    finally:
        connection.close()


def test_three_oversized_uploads_at_once_leave_the_server_flat(server, lab):
    with PeakMemory(server.pid) as memory, ThreadPoolExecutor(3) as pool:
        body = [Zeros(OVERSIZED) for _ in range(3)]
        sending = [pool.submit(upload, server, lab["task_set"], zeros, lab["auth"]) for zeros in body]
        responses = [future.result() for future in sending]
    assert [response.status_code for response in responses] == [413, 413, 413]
    assert memory.growth < MEMORY_SLACK, f"grew {memory.growth / MB:.0f} MB"


def test_a_chunked_body_without_a_length_is_cut_off_at_the_limit(server, lab):
    with PeakMemory(server.pid) as memory:
        response = upload(server, lab["task_set"], chunks(OVERSIZED), lab["auth"])
    assert_too_large(response, UPLOAD_LIMIT_MB, "FLYWHEEL_MAX_UPLOAD_MB")
    assert f"the request body is over {UPLOAD_LIMIT_MB} MB" in response.json()["error"]["message"]
    assert memory.growth < MEMORY_SLACK + UPLOAD_LIMIT_MB * MB, f"grew {memory.growth / MB:.0f} MB"


@pytest.mark.parametrize("signed_in", [False, True])
def test_a_json_body_over_its_limit_gets_the_error_shape_not_an_html_page(server, lab, signed_in):
    headers = {"Content-Type": "application/json"} | (lab["auth"] if signed_in else {})
    body = json.dumps({"name": "x" * (2 * BODY_LIMIT_MB * MB)})
    response = requests.post(f"{server.url}/api/v1/projects", data=body, headers=headers, timeout=60)
    assert_too_large(response, BODY_LIMIT_MB, "FLYWHEEL_MAX_BODY_MB")


def test_a_file_within_the_limit_still_imports(server, lab):
    items = ({"id": f"q{i}", "prompt": f"{i} + {i}?", "reference": str(2 * i)} for i in range(2000))
    lines = "".join(json.dumps(item) + "\n" for item in items)
    files = {"file": ("tasks.jsonl", lines.encode())}
    url = f"{server.url}/api/v1/task-sets/{lab['task_set'].pk}/import"
    response = requests.post(url, files=files, headers=lab["auth"], timeout=60)
    assert response.status_code == 201, response.text
    assert TaskSetVersion.objects.get().items.count() == 2000


def test_an_empty_or_broken_multipart_body_gets_the_error_shape(server, lab):
    url = f"{server.url}/api/v1/task-sets/{lab['task_set'].pk}/import"
    for content_type, body in [
        ("multipart/form-data; boundary=flywheel", b""),
        ("multipart/form-data; boundary=flywheel", b"garbage"),
        ("multipart/form-data", b"garbage"),
    ]:
        headers = {"Content-Type": content_type} | lab["auth"]
        response = requests.post(url, data=body, headers=headers, timeout=30)
        assert response.status_code == 400, (content_type, body)
        error = response.json()["error"]
        assert error["code"] == "invalid_request" and error["message"], error
    assert TaskSetVersion.objects.count() == 0
