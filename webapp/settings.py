"""Flywheel settings: the one settings file, driven by environment variables.

Every variable read here is documented in the README (tests/test_docs.py fails otherwise).
Unset, they give the embedded default: SQLite in WAL mode and a private Redis under
FLYWHEEL_HOME. Set DATABASE_URL and REDIS_URL to run on PostgreSQL and an external Redis.
"""

import os
import secrets
import sys
from pathlib import Path

import dj_database_url
from csp.constants import NONCE, NONE, SELF
from redis.connection import parse_url

from webapp.artifact_storage import folder_storage, s3_storage
from webapp.web_server import default_web_workers

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"environment variable {name} must be true or false, got {raw!r}")


def env_list(name: str, default: str) -> list[str]:
    return [part.strip() for part in env_str(name, default).split(",") if part.strip()]


FLYWHEEL_HOME = Path(env_str("FLYWHEEL_HOME", str(BASE_DIR / ".flywheel"))).resolve()
FLYWHEEL_HOME.mkdir(parents=True, exist_ok=True)
if FLYWHEEL_HOME.stat().st_uid == os.getuid():
    FLYWHEEL_HOME.chmod(0o700)  # the database, secrets, uploads and logs: for this user only


def _generated_once(name: str) -> str:
    """A secret generated once into FLYWHEEL_HOME/<name>, readable by its owner only."""
    path = FLYWHEEL_HOME / name
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
    path.chmod(0o600)  # also tightens a file an older version left world-readable
    return path.read_text().strip()


SECRET_KEY = os.environ.get("FLYWHEEL_SECRET_KEY") or _generated_once("secret_key")
# /healthz's detail and /metrics: for this bearer token or these addresses (core/ops_access.py).
FLYWHEEL_OPS_TOKEN = os.environ.get("FLYWHEEL_OPS_TOKEN") or _generated_once("ops_token")
FLYWHEEL_OPS_ALLOW = env_list("FLYWHEEL_OPS_ALLOW", "")
DEBUG = env_bool("FLYWHEEL_DEBUG", False)
ALLOWED_HOSTS = env_list("FLYWHEEL_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("FLYWHEEL_CSRF_TRUSTED_ORIGINS", "")
PORT = env_int("PORT", 8000)
FLYWHEEL_BIND = env_str("FLYWHEEL_BIND", "127.0.0.1")
# Processes of the web server (uvicorn: HTTP and websockets); see webapp/web_server.py.
FLYWHEEL_WEB_WORKERS = env_int("FLYWHEEL_WEB_WORKERS", default_web_workers())

# daphne is there for `manage.py runserver` only: the web server (uvicorn) serves the ASGI app
# itself, and its processes need not import daphne and install Twisted's reactor (about a second
# of each one's start-up, `python -X importtime`).
INSTALLED_APPS = [
    *([] if "uvicorn" in sys.modules else ["daphne"]),
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "core",
    "webapp",
    "docs_pages",
    "projects",
    "tiers",
    "runs",
    "serving",
    "rewards",
    "reviews",
    "traces",
    "webhooks",
    "reward_models",
    "evaluations",
    "finetuning",
    "costs",
    "episodes",
    "tinker_api",
    "sweeps",
    "workers",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "core.outage.RedisOutageMiddleware",  # writes answer 503 while Redis is unreachable
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "webapp.metrics.RequestMetricsMiddleware",
    "core.errors.OutOfRangeMiddleware",
]

ROOT_URLCONF = "webapp.urls"
ASGI_APPLICATION = "webapp.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "ops.views.ops_link",
            ],
        },
    },
]

# --- the front door -----------------------------------------------------------------------

# Content-Security-Policy on every answer: scripts and styles from this origin only (plus the one
# nonce'd empty <style> Plotly writes its rules into), no plugins, no framing, forms post here.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, NONCE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}
# Behind a TLS-terminating proxy: HSTS, cookies only over HTTPS, and the proxy's
# X-Forwarded-Proto: https taken as the request's scheme (the proxy must set it, and strip it
# from clients). Off by default: the embedded default serves plain HTTP on 127.0.0.1.
FLYWHEEL_HTTPS = env_bool("FLYWHEEL_HTTPS", False)
if FLYWHEEL_HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]  # probes from inside, over plain HTTP
    SECURE_HSTS_SECONDS = 365 * 24 * 3600
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

# --- storage -------------------------------------------------------------------------------

SQLITE_PATH = FLYWHEEL_HOME / "db.sqlite3"
DATABASES = {
    "default": dj_database_url.parse(env_str("DATABASE_URL", f"sqlite:///{SQLITE_PATH}"), conn_max_age=0)
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Readable by this user only; SQLite gives its -wal and -shm files the database file's mode.
    sqlite_file = Path(DATABASES["default"]["NAME"])
    if sqlite_file.is_absolute() and sqlite_file.parent.is_dir():
        os.close(os.open(sqlite_file, os.O_CREAT | os.O_WRONLY, 0o600))
        if sqlite_file.stat().st_uid == os.getuid():
            sqlite_file.chmod(0o600)
    # WAL lets the web process read while a worker writes; IMMEDIATE takes the write lock at
    # BEGIN so two writers queue on busy_timeout instead of failing with "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # Worker processes in end-to-end tests must see the test database, so it lives on disk.
    DATABASES["default"]["TEST"] = {"NAME": str(FLYWHEEL_HOME / "test-db.sqlite3")}
else:
    # Named explicitly: a live server forked by the tests resolves the test database name again
    # from the already-switched settings, and must not prefix "test_" a second time.
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}"}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

MEDIA_ROOT = FLYWHEEL_HOME / "media"
MEDIA_URL = "/media/"
STATIC_URL = "/static/"
STATIC_ROOT = FLYWHEEL_HOME / "static"
STATIC_ROOT.mkdir(exist_ok=True)  # whitenoise expects it
# Plotly.js: its "basic" bundle (scatter, bar, pie: the charts use only scatter traces), vendored
# in static/vendor, a quarter of the full bundle's size (1.2 MB, 0.4 MB gzipped).
STATICFILES_DIRS = [BASE_DIR / "static"]
# Artifacts (published policy versions, checkpoints, merged exports; runs/artifacts.py): a folder
# (FLYWHEEL_ARTIFACTS_DIR, default FLYWHEEL_HOME/artifacts; on many hosts a shared mount) or an
# S3-compatible bucket (FLYWHEEL_ARTIFACTS_S3_BUCKET, through django-storages, which is then
# needed). Each host caches the versions it fetched, the FLYWHEEL_ARTIFACT_CACHE_VERSIONS used last.
FLYWHEEL_ARTIFACTS_DIR = Path(env_str("FLYWHEEL_ARTIFACTS_DIR", str(FLYWHEEL_HOME / "artifacts"))).resolve()
FLYWHEEL_ARTIFACTS_S3_BUCKET = env_str("FLYWHEEL_ARTIFACTS_S3_BUCKET", "")
FLYWHEEL_ARTIFACTS_S3_ENDPOINT = env_str("FLYWHEEL_ARTIFACTS_S3_ENDPOINT", "")
FLYWHEEL_ARTIFACT_CACHE_VERSIONS = env_int("FLYWHEEL_ARTIFACT_CACHE_VERSIONS", 6)
if FLYWHEEL_ARTIFACTS_S3_BUCKET:
    ARTIFACTS_STORAGE = s3_storage(
        bucket=FLYWHEEL_ARTIFACTS_S3_BUCKET, endpoint=FLYWHEEL_ARTIFACTS_S3_ENDPOINT
    )
else:
    ARTIFACTS_STORAGE = folder_storage(str(FLYWHEEL_ARTIFACTS_DIR))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Fingerprinted, gzip and brotli, long-cached once `make up` has run `collectstatic`.
    "staticfiles": {"BACKEND": "webapp.static_storage.FingerprintedStaticStorage"},
    "artifacts": ARTIFACTS_STORAGE,
}
# Before any `collectstatic` (a checkout's tests): files straight from static/ under their own
# names, uncompressed and cached 60 s (webapp/static_storage.py).
WHITENOISE_USE_FINDERS = True
# Only the fingerprinted copies are kept and compressed: half the work of `collectstatic`.
WHITENOISE_KEEP_ONLY_HASHED_FILES = True
# Request bodies (core/limits.py): a file upload (multipart) may be FLYWHEEL_MAX_UPLOAD_MB, any
# other body FLYWHEEL_MAX_BODY_MB; bigger ones are refused with 413 before they are read.
FLYWHEEL_MAX_UPLOAD_MB = env_int("FLYWHEEL_MAX_UPLOAD_MB", 100)
FLYWHEEL_MAX_BODY_MB = env_int("FLYWHEEL_MAX_BODY_MB", 10)
# Uploads above this size stream to a temporary file instead of memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = FLYWHEEL_MAX_BODY_MB * 1024 * 1024
FLYWHEEL_IMPORT_MAX_ERRORS = env_int("FLYWHEEL_IMPORT_MAX_ERRORS", 50)

# --- Redis: broker, channel layer, cache ---------------------------------------------------

FLYWHEEL_REDIS_PORT = env_int("FLYWHEEL_REDIS_PORT", 6380)
EMBEDDED_REDIS = "REDIS_URL" not in os.environ
# The private Redis asks for a password generated once into FLYWHEEL_HOME (webapp/embedded_redis.py).
_REDIS_AUTH = f":{_generated_once('redis_password')}@" if EMBEDDED_REDIS else ""
REDIS_URL = env_str("REDIS_URL", f"redis://{_REDIS_AUTH}127.0.0.1:{FLYWHEEL_REDIS_PORT}/0")

CACHES = {
    "default": {
        # Fails open while Redis is unreachable (an empty cache): the throttle lets reads through.
        "BACKEND": "core.outage.FailOpenRedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "flywheel",
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
    }
}

# Redis pub/sub: a group message is published once and each web process fans it out to its own
# viewers (the list-based layer stored a copy per viewer and each process popped them one by one:
# 200 viewers of a run made 200 Redis round trips per message). Websocket messages are
# notifications, at most once (core/events.py), which is what pub/sub gives. Pub/sub channels
# ignore Redis' database number, so the prefix carries it: deployments (or test runs) sharing a
# Redis server on different databases must not see each other's runs.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": f"flywheel-ws-db{parse_url(REDIS_URL).get('db', 0)}"},
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "rollout"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Longer than any task may run, so Redis does not redeliver work that is still in progress.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 6 * 3600}
# `control` runs the scheduler's periodic pass alone: a learner worker is busy for as long as the
# run it supervises, so a pass queued behind it would wait for the run to end.
CELERY_WORKER_QUEUES = ("rollout", "learner", "eval", "control")
# How often the scheduler restarts learners that died with their host and starts queued runs.
FLYWHEEL_TICK_SECONDS = env_int("FLYWHEEL_TICK_SECONDS", 10)
CELERY_BEAT_SCHEDULE = {
    "runs-tick": {
        "task": "workers.control.runs_schedule",
        "schedule": float(FLYWHEEL_TICK_SECONDS),
        # A tick left waiting (its worker down or busy) is dropped, not run in a pile on return:
        # each pass does all the work the ones before it would have.
        "options": {"expires": max(3 * FLYWHEEL_TICK_SECONDS, 30)},
    },
}
CELERY_TASK_ROUTES = {
    "workers.rollout.*": {"queue": "rollout"},
    "workers.learner.*": {"queue": "learner"},
    "workers.eval.*": {"queue": "eval"},
    "workers.control.*": {"queue": "control"},
}
# The training methods a run can name (runs/learners.py): modules that register an algorithm when
# imported. FLYWHEEL_LEARNERS_EXTRA adds a team's own (comma-separated module paths); every process,
# web and workers, must see the same list.
FLYWHEEL_LEARNERS = [
    "workers.learners.grpo_config",
    "workers.learners.sft_config",
    "workers.learners.dpo_config",
    "workers.learners.tinker_config",
    *env_list("FLYWHEEL_LEARNERS_EXTRA", ""),
]
# The Tinker API (tinker_api/): a session whose client sends no heartbeat for this long is ended
# (the SDK sends one every 10 s); a future's poll waits this long for its answer before "try
# again"; LoRA's alpha (scale = alpha / rank), which Tinker's clients do not send.
FLYWHEEL_TINKER_SESSION_TIMEOUT = env_int("FLYWHEEL_TINKER_SESSION_TIMEOUT", 120)
FLYWHEEL_TINKER_POLL_SECONDS = env_int("FLYWHEEL_TINKER_POLL_SECONDS", 10)
FLYWHEEL_TINKER_LORA_ALPHA = float(env_int("FLYWHEEL_TINKER_LORA_ALPHA", 32))
# A rollout worker decodes up to this many pending sample requests of one sampling session at once.
FLYWHEEL_TINKER_SAMPLE_BATCH = env_int("FLYWHEEL_TINKER_SAMPLE_BATCH", 64)
# Each Tinker sample is recorded as a trace of its project (reviewers read and label them).
FLYWHEEL_TINKER_RECORD_SAMPLES = env_bool("FLYWHEEL_TINKER_RECORD_SAMPLES", True)
# Runs of one project that may be active (starting, running, pausing) at once; the rest queue.
FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS = env_int("FLYWHEEL_PROJECT_MAX_ACTIVE_RUNS", 1)
# Runs one user may have active at once across projects (0: no limit); the others wait, saying why.
FLYWHEEL_USER_MAX_ACTIVE_RUNS = env_int("FLYWHEEL_USER_MAX_ACTIVE_RUNS", 0)
# Learner workers (one per learner process; GPUs on a GPU host) the active runs of one project may
# hold at once, unless its owners set the project's own (0: no limit), and those of one user across
# projects (0: no limit). Runs over them wait in their project's queue, saying why.
FLYWHEEL_PROJECT_MAX_GPU_WORKERS = env_int("FLYWHEEL_PROJECT_MAX_GPU_WORKERS", 0)
FLYWHEEL_USER_MAX_GPU_WORKERS = env_int("FLYWHEEL_USER_MAX_GPU_WORKERS", 0)
# Steps of the short run an estimate launches to calibrate itself (`"calibrate": true`).
# 8: its first step is a warm-up the estimate leaves out, and steps keep speeding up after it; on
# `make bench-estimate` a 4-step calibration overestimated by up to 47 %, an 8-step one by 23-36 %.
FLYWHEEL_CALIBRATION_STEPS = max(2, env_int("FLYWHEEL_CALIBRATION_STEPS", 8))
# The currency of prices, budgets and costs (costs/): one for the whole installation.
FLYWHEEL_CURRENCY = os.environ.get("FLYWHEEL_CURRENCY", "USD")
# A learner that crashes is restarted from its last checkpoint at most this many times.
FLYWHEEL_LEARNER_MAX_RESTARTS = env_int("FLYWHEEL_LEARNER_MAX_RESTARTS", 3)
# The learner's device's peak FLOP/s, in TFLOPS, for each step's `learner/mfu`: 0 takes a known
# GPU's dense bf16 peak (workers/learners/device_figures.py) and records no MFU where it is unknown.
FLYWHEEL_DEVICE_PEAK_TFLOPS = float(env_str("FLYWHEEL_DEVICE_PEAK_TFLOPS", "0") or 0)
# A live run whose learner has not reported for this long is restarted by the watchdog.
FLYWHEEL_LEARNER_HEARTBEAT_TIMEOUT = env_int("FLYWHEEL_LEARNER_HEARTBEAT_TIMEOUT", 60)
# Processes of a run's learner on this learner worker (`accelerate launch` with the DDP config
# FLYWHEEL_ACCELERATE_CONFIG) when the run's `learner_processes` hyperparameter does not say.
FLYWHEEL_LEARNER_PROCESSES = env_int("FLYWHEEL_LEARNER_PROCESSES", 1)
FLYWHEEL_ACCELERATE_CONFIG = Path(
    env_str("FLYWHEEL_ACCELERATE_CONFIG", str(BASE_DIR / "deploy" / "accelerate" / "ddp.yaml"))
)
# Each worker process that supervises learners keeps one spare learner loaded (about 400 MB), so
# a run's learner starts without the seconds of loading Python, Django, torch and transformers.
FLYWHEEL_LEARNER_SPARE = env_bool("FLYWHEEL_LEARNER_SPARE", True)
# Rollout work still pending (or whose worker's lease ran out) this long is sent again.
FLYWHEEL_ROLLOUT_RESEND_SECONDS = env_int("FLYWHEEL_ROLLOUT_RESEND_SECONDS", 30)
# The worker holding a rollout batch renews its lease every third of this; a batch not renewed for
# this long lost its worker and is claimed again. Keep it well under the episode deadline.
FLYWHEEL_ROLLOUT_LEASE_SECONDS = env_int("FLYWHEEL_ROLLOUT_LEASE_SECONDS", 30)
# Threads each worker and learner process gives torch (0: torch's default, one per core). One by
# default: a host runs several workers and learners, and oversubscribed threads slow them all.
FLYWHEEL_TORCH_THREADS = env_int("FLYWHEEL_TORCH_THREADS", 1)
FLYWHEEL_ROLLOUT_CONCURRENCY = env_int("FLYWHEEL_ROLLOUT_CONCURRENCY", 2)
# Task items per rollout batch; 0: a step's items split into one batch per rollout process.
FLYWHEEL_ROLLOUT_BATCH_ITEMS = env_int("FLYWHEEL_ROLLOUT_BATCH_ITEMS", 0)
FLYWHEEL_LEARNER_CONCURRENCY = env_int("FLYWHEEL_LEARNER_CONCURRENCY", 1)
FLYWHEEL_EVAL_CONCURRENCY = env_int("FLYWHEEL_EVAL_CONCURRENCY", 1)
FLYWHEEL_CONTROL_CONCURRENCY = env_int("FLYWHEEL_CONTROL_CONCURRENCY", 1)
# Webhooks (sent by the eval workers): how long one POST may take, and how many attempts a
# delivery gets (backing off from 10 s to hours) before it is marked failed.
FLYWHEEL_WEBHOOK_TIMEOUT_SECONDS = env_int("FLYWHEEL_WEBHOOK_TIMEOUT_SECONDS", 5)
FLYWHEEL_WEBHOOK_MAX_ATTEMPTS = env_int("FLYWHEEL_WEBHOOK_MAX_ATTEMPTS", 8)
# Webhooks go to public addresses only: a URL on the deployment's own network (127.0.0.1, 10.x,
# 169.254.169.254, ...) is refused unless this is set (a receiver on a private network).
FLYWHEEL_WEBHOOK_ALLOW_PRIVATE = env_bool("FLYWHEEL_WEBHOOK_ALLOW_PRIVATE", False)

# --- sandboxes (sandboxes/config.py reads these; without Django it falls back to the environment)

FLYWHEEL_SANDBOX_BACKEND = env_str("FLYWHEEL_SANDBOX_BACKEND", "bubblewrap")
FLYWHEEL_SANDBOX_IMAGE = env_str("FLYWHEEL_SANDBOX_IMAGE", "flywheel-sandbox:latest")
FLYWHEEL_SANDBOX_DOCKER_HOST = env_str("FLYWHEEL_SANDBOX_DOCKER_HOST", "")
FLYWHEEL_SANDBOX_DOCKER_CERT_PATH = env_str("FLYWHEEL_SANDBOX_DOCKER_CERT_PATH", "")
FLYWHEEL_SANDBOX_BWRAP = env_str("FLYWHEEL_SANDBOX_BWRAP", "/usr/bin/bwrap")
FLYWHEEL_SANDBOX_PYTHON = env_str("FLYWHEEL_SANDBOX_PYTHON", "/usr/bin/python3")
FLYWHEEL_SANDBOX_POOL_MAX = env_int("FLYWHEEL_SANDBOX_POOL_MAX", 2 * (os.cpu_count() or 1))
FLYWHEEL_SANDBOX_POOL_WARM = env_int("FLYWHEEL_SANDBOX_POOL_WARM", 2)
FLYWHEEL_SANDBOX_UID_BASE = env_int("FLYWHEEL_SANDBOX_UID_BASE", 200000)
FLYWHEEL_SANDBOX_STATE_DIR = env_str("FLYWHEEL_SANDBOX_STATE_DIR", "/tmp/flywheel-sandboxes")
FLYWHEEL_SANDBOX_CGROUPS = env_str("FLYWHEEL_SANDBOX_CGROUPS", "auto")
FLYWHEEL_SANDBOX_SECCOMP = env_str("FLYWHEEL_SANDBOX_SECCOMP", "on")
FLYWHEEL_SANDBOX_WORKER_CHECK = env_bool("FLYWHEEL_SANDBOX_WORKER_CHECK", True)

# --- models

# A tier naming a hub id that cannot be loaded (not a local directory, not in the local Hugging
# Face cache) is refused at creation if the hub does not answer for it within this many seconds
# (inference/model_sources.py). Off for workers that load models from caches the web host lacks.
FLYWHEEL_HUB_CHECK = env_bool("FLYWHEEL_HUB_CHECK", True)
FLYWHEEL_HUB_TIMEOUT_SECONDS = env_int("FLYWHEEL_HUB_TIMEOUT_SECONDS", 5)
# The OpenAI-compatible endpoint (/v1/): how many tiers and checkpoints each web process keeps
# loaded between requests (the least recently used is dropped first).
FLYWHEEL_SERVE_MODELS = env_int("FLYWHEEL_SERVE_MODELS", 2)

# --- rewards

# A local sentence-embedding model for text_similarity's cosine metric; empty turns cosine off.
FLYWHEEL_EMBEDDING_MODEL = env_str("FLYWHEEL_EMBEDDING_MODEL", "")

# --- auth ----------------------------------------------------------------------------------

# Failed sign-ins (passwords, API tokens) per account and per address: this many within the window
# lock both out for the window (core/lockout.py).
AUTHENTICATION_BACKENDS = ["core.lockout.LockoutModelBackend"]
FLYWHEEL_LOGIN_MAX_FAILURES = env_int("FLYWHEEL_LOGIN_MAX_FAILURES", 10)
FLYWHEEL_LOGIN_LOCKOUT_SECONDS = env_int("FLYWHEEL_LOGIN_LOCKOUT_SECONDS", 900)
# Proxies whose FLYWHEEL_CLIENT_ADDRESS_HEADER names the client (for lockouts); ignored from anyone else.
FLYWHEEL_TRUSTED_PROXIES = env_list("FLYWHEEL_TRUSTED_PROXIES", "")
FLYWHEEL_CLIENT_ADDRESS_HEADER = env_str("FLYWHEEL_CLIENT_ADDRESS_HEADER", "X-Forwarded-For")
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "project-list"
LOGOUT_REDIRECT_URL = "login"
FLYWHEEL_DEMO_USER = env_str("FLYWHEEL_DEMO_USER", "demo")
FLYWHEEL_DEMO_PASSWORD = env_str("FLYWHEEL_DEMO_PASSWORD", "flywheel-demo")

# --- REST ----------------------------------------------------------------------------------

FLYWHEEL_API_MAX_LIMIT = env_int("FLYWHEEL_API_MAX_LIMIT", 200)
FLYWHEEL_API_RATE = env_str("FLYWHEEL_API_RATE", "6000/min")
FLYWHEEL_IDEMPOTENCY_TTL_HOURS = env_int("FLYWHEEL_IDEMPOTENCY_TTL_HOURS", 24)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "projects.token_auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "core.api.NewestFirstCursorPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.api.error_handler",
    "DEFAULT_THROTTLE_CLASSES": ["core.throttling.RedisRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": FLYWHEEL_API_RATE},
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "core.parsers.StrictJSONParser",
        "rest_framework.parsers.MultiPartParser",
        "rest_framework.parsers.FormParser",
    ],
    # RFC 3339 from datetime.isoformat ("Z" for UTC): a strftime format would print year 116 as
    # "116-..." (glibc does not pad %Y), which no client parses.
    "DATETIME_FORMAT": "iso-8601",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Flywheel API",
    "DESCRIPTION": "Tasks, reward rules, tiers and post-training runs. See the README.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    # A run's train_split and eval_split share the task items' split choices: one enum for all.
    "ENUM_NAME_OVERRIDES": {
        "SplitEnum": "projects.models.TaskItem.Split",
        "ReviewLabelEnum": "reviews.models.Review.Label",
        "ReviewLabelFilterEnum": "runs.api.run_serializers.REVIEW_LABELS",
        "TierEvaluationStatusEnum": "tiers.models.TierEvaluation.Status",
        "RunStatusEnum": "runs.models.Run.Status",
        "LaunchMethodEnum": "runs.learners.launch_choices",  # the registry's launchable algorithms
        "RunOutcomeEnum": "runs.models.Run.Outcome",
        "TrajectoryOutcomeEnum": "runs.models.Trajectory.Outcome",
        "HeldOutChangeEnum": "runs.outcomes.CHANGES",
        "WebhookDeliveryStatusEnum": "webhooks.models.WebhookDelivery.Status",
        "WebhookDeliveryTypeEnum": "webhooks.models.WebhookDelivery.Type",
        "RunMethodEnum": "runs.models.Run.Method",
        "TrainOnReviewsMethodEnum": "reviews.serializers.TRAIN_METHODS",
        "ReviewQueueSourceEnum": "reviews.models.ReviewQueue.Source",
        "TraceThumbsEnum": "traces.models.Trace.Thumbs",
        "TraceThumbsFilterEnum": "traces.serializers.THUMBS_FILTER",
        "KindEnum": "projects.models.TaskItem.Kind",  # named, now that another field is called "kind"
        "OpsStatusEnum": "ops.serializers.OVERALL",
        "OpsScopeEnum": "ops.serializers.SCOPES",
        "OpsWorkerStateEnum": "ops.serializers.WORKER_STATES",
        "OpsProcessEndEnum": "ops.serializers.PROCESS_ENDS",
        "OpsFailureKindEnum": "ops.serializers.FAILURE_KINDS",
        "StubCheckStatusEnum": "projects.serializers.STUB_CHECK_STATUSES",
    },
    "APPEND_COMPONENTS": {"securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
    "SECURITY": [{"bearerAuth": []}],
    # Served from the drf-spectacular-sidecar package: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- misc ----------------------------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("FLYWHEEL_LOG_LEVEL", "INFO")},
}
