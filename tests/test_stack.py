"""The local stack as `make up` starts it and `make down` stops it, on a private FLYWHEEL_HOME and
ports: nothing it started survives `make down` (learners and the spare learner included); a hung
Redis is restarted by the supervisor; the embedded Redis asks for its generated password; files
under the home are for their owner only."""

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from redis import Redis
from redis.exceptions import AuthenticationError

from projects import services as project_services
from tests.run_harness import wait_until
from webapp import stack
from webapp.embedded_redis import redis_ping

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def stack_env(home) -> dict[str, str]:
    """The environment `make up` runs in, on a home and ports of this test's own (the embedded
    default: no DATABASE_URL or REDIS_URL)."""
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    return env | {
        "FLYWHEEL_HOME": str(home),
        "PORT": str(free_port()),
        "FLYWHEEL_REDIS_PORT": str(free_port()),
        "FLYWHEEL_WEB_WORKERS": "1",
        "FLYWHEEL_SANDBOX_WORKER_CHECK": "false",
    }


def manage(env: dict[str, str], *args: str, timeout: float = 180) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def supervisor_start(env: dict[str, str], services: str) -> int:
    """Start the supervisor detached, as `make up` (flywheel_up) does."""
    code = (
        "import django; django.setup(); from webapp import stack; "
        f"print(stack.supervisor_start({services.split(',')!r}))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def learners_under(pid: int) -> list[psutil.Process]:
    try:
        tree = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in tree if "run_learner" in " ".join(p.cmdline() if alive(p.pid) else [])]


def test_make_down_stops_everything_make_up_started_the_spare_learner_included(home, stack_env):
    supervisor = supervisor_start(stack_env, "redis,worker-learner")
    try:
        # The learner worker starts a spare learner at once, in a session of its own (so that it
        # outlives a killed worker process), exactly as it starts a run's learner.
        wait_until(lambda: learners_under(supervisor), "the spare learner", timeout=120)
        started = psutil.Process(supervisor).children(recursive=True) + [psutil.Process(supervisor)]
        learner = learners_under(supervisor)[0]
        assert learner.pid in stack.stack_processes(home)  # it carries the stack's mark
        out = manage(stack_env, "flywheel_down")
    finally:
        if alive(supervisor):
            stack.stack_processes_stop(home)
    survivors = [(p.pid, p.cmdline()) for p in started if alive(p.pid)]
    assert survivors == [], out
    assert stack.stack_processes(home) == []
    assert not (home / "run" / "supervisor.pid").exists()


def pid_in(home: Path, name: str) -> int | None:
    try:
        pid = int((home / "run" / f"{name}.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pid if alive(pid) else None


def test_a_hung_redis_is_restarted_by_the_supervisor_and_asks_for_its_password(home, stack_env):
    home.mkdir(mode=0o755)
    (home / "logs").mkdir(mode=0o755)
    (home / "logs" / "old.log").write_text("left world-readable by an older version")
    (home / "logs" / "old.log").chmod(0o644)
    port = int(stack_env["FLYWHEEL_REDIS_PORT"])
    supervisor = supervisor_start(stack_env, "redis")
    try:
        password = (home / "redis_password").read_text().strip()
        wait_until(lambda: redis_ping(port, password), "the private Redis", timeout=30)
        # Without its password Redis refuses every command.
        with pytest.raises(AuthenticationError):
            Redis(host="127.0.0.1", port=port).set("probe", "1")
        Redis(host="127.0.0.1", port=port, password=password).set("kept", "across the restart")

        hung = pid_in(home, "redis")
        os.kill(hung, signal.SIGSTOP)  # alive, but answering nothing: a dead-process check misses it
        stopped_at = time.monotonic()
        wait_until(lambda: pid_in(home, "redis") not in (None, hung), "a new Redis", timeout=60)
        wait_until(lambda: redis_ping(port, password), "the new Redis to answer", timeout=30)
        took = time.monotonic() - stopped_at
        assert not alive(hung)
        assert Redis(host="127.0.0.1", port=port, password=password).get("kept") == b"across the restart"
        assert took < 30, took  # 10 s of start-up grace, then three failed checks 2 s apart
        print(f"a hung Redis answered again {took:.1f} s after SIGSTOP")

        # Everything under the home is for its owner only: what the stack wrote, what was there.
        loose = {
            str(path.relative_to(home)): oct(mode(path))
            for path in [home, *home.rglob("*")]
            if mode(path) & 0o077
        }
        assert loose == {}
        assert mode(home / "redis_password") == 0o600 and mode(home / "redis" / "redis.conf") == 0o600
        assert mode(home / "logs" / "redis.log") == 0o600 and mode(home / "run" / "redis.pid") == 0o600
        assert mode(home / "redis") == 0o700
        assert password not in " ".join(psutil.Process(pid_in(home, "redis")).cmdline())
    finally:
        manage(stack_env, "flywheel_down")
    assert not alive(supervisor) and not redis_ping(port)


# --- websockets during a Redis outage ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_websocket_opened_while_redis_is_down_is_refused_with_the_code_open_ones_get(
    team, tmp_path, settings
):
    from asgiref.sync import async_to_sync
    from channels.testing import WebsocketCommunicator

    from runs.consumers import CLOSE_TRY_AGAIN_LATER
    from tests.test_run_recovery import start_redis
    from webapp.asgi import application

    port = free_port()
    redis = start_redis(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    settings.REDIS_URL = url
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer", "CONFIG": {"hosts": [url]}}
    }
    _, token = project_services.api_token_create(user=team["owner"], name="ws")
    path = f"/ws/projects/{team['project'].pk}/"

    def socket() -> WebsocketCommunicator:
        return WebsocketCommunicator(application, path, [(b"authorization", f"Bearer {token}".encode())])

    async def scenario() -> tuple[dict, dict, bool]:
        nonlocal redis
        before = socket()
        assert (await before.connect(timeout=10))[0] is True
        redis.kill()
        redis.wait(timeout=20)
        closed_open_one = await before.receive_output(timeout=15)  # the layer watch's ping fails
        during = socket()
        connected, _ = await during.connect(timeout=10)
        assert connected is True  # accepted, so that the code reaches a browser...
        closed_new_one = await during.receive_output(timeout=10)  # ...and closed at once
        redis = start_redis(port, tmp_path)
        after = socket()
        reconnected = (await after.connect(timeout=10))[0] and await after.receive_nothing(timeout=1)
        await after.disconnect()
        return closed_open_one, closed_new_one, reconnected

    try:
        closed_open_one, closed_new_one, reconnected = async_to_sync(scenario)()
    finally:
        redis.kill()
        redis.wait(timeout=20)
    assert closed_open_one == {"type": "websocket.close", "code": CLOSE_TRY_AGAIN_LATER}
    assert closed_new_one == closed_open_one
    assert reconnected is True


# --- make up waits while the services make progress ---------------------------------------------


def test_make_up_sees_a_busy_starting_service_progress_and_a_stopped_one_stall(tmp_path):
    import uuid

    name = f"test-progress-{uuid.uuid4().hex[:8]}"
    pidfile = stack.run_dir() / f"{name}.pid"
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        pidfile.write_text(str(busy.pid))
        watch = stack.Progress(name)

        def seen_working() -> bool:
            watch.update(time.monotonic())
            return watch.cpu > 0.3

        wait_until(seen_working, "its CPU time to be seen", timeout=60)  # importing, say
        assert watch.stalled_for(time.monotonic()) < 5

        os.kill(busy.pid, signal.SIGSTOP)  # hung: no CPU time, nothing logged
        wait_until(lambda: psutil.Process(busy.pid).status() == psutil.STATUS_STOPPED, "it to stop", 10)
        now = time.monotonic()
        watch.update(now)
        watch.update(now + 61)
        assert watch.stalled_for(now + 61) >= 61 and watch.restarts == 0

        pidfile.write_text(str(other.pid))  # the supervisor started it again: a new pid
        watch.update(now + 62)
        assert watch.restarts == 1 and watch.stalled_for(now + 62) == 0
    finally:
        for process in (busy, other):
            process.kill()
            process.wait()
        pidfile.unlink(missing_ok=True)


def test_stored_artifacts_and_their_cached_copies_are_for_their_owner_only(tmp_path, db):
    import uuid

    from core.artifacts import artifact_delete, artifact_get, artifact_put

    local = tmp_path / "policy"
    local.mkdir()
    (local / "model.safetensors").write_bytes(b"weights")
    prefix = f"tests/modes-{uuid.uuid4().hex[:8]}"
    artifact_put(local, prefix)
    try:
        cached = artifact_get(prefix)
        assert mode(local / "model.safetensors") == 0o400  # read-only, and nobody else's to read
        assert mode(cached / "model.safetensors") & 0o077 == 0
    finally:
        artifact_delete(prefix)
