"""Prometheus metrics at /metrics: request counts and latencies, and the size of the record."""

import os
import time
from collections.abc import Callable, Iterator

from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from core.api import error_body
from core.ops_access import ops_allowed
from costs.selectors import usage_totals
from ops.selectors import cluster_read

REQUESTS = Counter("flywheel_http_requests_total", "HTTP requests served", ["method", "view", "status"])
LATENCY = Histogram(
    "flywheel_http_request_duration_seconds", "Time to serve an HTTP request", ["method", "view"]
)


class RequestMetricsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        # Label by route name, never by raw path: paths hold ids and would explode cardinality.
        view = (match.view_name if match else "") or "unmatched"
        LATENCY.labels(request.method, view).observe(time.perf_counter() - started)
        REQUESTS.labels(request.method, view, str(response.status_code)).inc()
        return response


class RecordCollector(Collector):
    """Counts read from the database at scrape time."""

    GAUGES = (
        ("flywheel_projects", "projects.Project", "Projects"),
        ("flywheel_task_sets", "projects.TaskSet", "Task sets"),
        ("flywheel_task_items", "projects.TaskItem", "Task items over all versions"),
        ("flywheel_tiers", "tiers.Tier", "Tiers"),
    )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Declared without touching the database, which may not exist yet at import time.
        for name, _, doc in self.GAUGES:
            yield GaugeMetricFamily(name, doc)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from django.apps import apps

        for name, model_name, doc in self.GAUGES:
            model = apps.get_model(model_name)
            yield GaugeMetricFamily(name, doc, value=model.objects.count())


class OpsCollector(Collector):
    """The operations overview as gauges, read at scrape time (ops/selectors.py): workers by queue
    and state, queue depths and waits, Redis and the database, sandboxes. No run is named."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # read only at scrape time: Redis may be down when this registers

    def collect(self) -> Iterator[GaugeMetricFamily]:

        cluster = cluster_read()
        cluster.pop("client")
        yield from ops_gauges(cluster)


def ops_gauges(cluster: dict) -> Iterator[GaugeMetricFamily]:
    redis, database = cluster["redis"], cluster["database"]
    for name, health, doc in (("redis", redis, "Redis"), ("database", database, "The database")):
        yield GaugeMetricFamily(f"flywheel_{name}_up", f"{doc} answered", value=float(health["ok"]))
        latency = GaugeMetricFamily(f"flywheel_{name}_latency_seconds", f"{doc}'s answer time from the web")
        if health["latency_ms"] is not None:
            latency.add_metric([], health["latency_ms"] / 1000)
        yield latency
    workers = GaugeMetricFamily("flywheel_workers", "Workers by queue and state", labels=["queue", "state"])
    busy = GaugeMetricFamily("flywheel_workers_busy", "Live workers running a task", labels=["queue"])
    waiting = GaugeMetricFamily("flywheel_queue_waiting", "Messages waiting in a queue", labels=["queue"])
    oldest = GaugeMetricFamily(
        "flywheel_queue_oldest_wait_seconds",
        "How long the oldest waiting message has waited",
        labels=["queue"],
    )
    for queue in cluster["queues"]:
        for state in ("alive", "gone", "stopped"):
            count = sum(1 for w in cluster["workers"] if w["state"] == state and queue["name"] in w["queues"])
            workers.add_metric([queue["name"], state], count)
        busy.add_metric([queue["name"]], queue["workers_busy"])
        waiting.add_metric([queue["name"]], queue["waiting"])
        oldest.add_metric([queue["name"]], queue["oldest_wait_seconds"] or 0.0)
    yield from (workers, busy, waiting, oldest)
    memory = GaugeMetricFamily(
        "flywheel_worker_memory_bytes", "A live worker's resident memory", labels=["worker"]
    )
    restarts = GaugeMetricFamily(
        "flywheel_worker_restarts", "Times a worker of this name started again", labels=["worker"]
    )
    for worker in cluster["workers"]:
        if worker["state"] == "alive":
            memory.add_metric([worker["name"]], worker["memory_bytes"])
        restarts.add_metric([worker["name"]], worker["restarts"])
    yield from (memory, restarts)
    sandboxes = GaugeMetricFamily("flywheel_sandboxes", "Sandboxes on live workers", labels=["state"])
    for state in ("live", "busy", "idle", "replaced"):
        sandboxes.add_metric([state], cluster["sandboxes"][state])
    yield sandboxes


class UsageCollector(Collector):
    """What every run has used, in units (costs/), as counters read at scrape time: device-seconds
    by kind and device class, CPU-seconds, tokens by kind, checkpoint bytes. No run is named; money
    is in the API, at the prices an operator sets."""

    TOKENS = ("prefilled", "sampled", "trained")

    def describe(self) -> Iterator[CounterMetricFamily]:
        return iter(())  # read only at scrape time

    def collect(self) -> Iterator[CounterMetricFamily]:
        rows = usage_totals()
        device = CounterMetricFamily(
            "flywheel_usage_device_seconds", "Time workers held a device", labels=["kind", "device_class"]
        )
        cpu = CounterMetricFamily("flywheel_usage_cpu_seconds", "CPU of sandboxes", labels=["kind"])
        tokens = CounterMetricFamily(
            "flywheel_usage_tokens", "Tokens by what was done", labels=["kind", "tokens"]
        )
        engine = CounterMetricFamily(
            "flywheel_usage_engine_tokens", "Engine tier tokens", labels=["direction"]
        )
        storage = CounterMetricFamily("flywheel_usage_storage_bytes", "Checkpoint bytes recorded")
        engine_in = engine_out = stored = 0
        for row in rows:
            device.add_metric([row["kind"], row["device_class"] or "none"], row["device_seconds"] or 0.0)
            cpu.add_metric([row["kind"]], row["cpu_seconds"] or 0.0)
            for name in self.TOKENS:
                tokens.add_metric([row["kind"], name], row[f"tokens_{name}"] or 0)
            engine_in += row["engine_tokens_in"] or 0
            engine_out += row["engine_tokens_out"] or 0
            stored += row["storage_bytes"] or 0
        engine.add_metric(["in"], engine_in)
        engine.add_metric(["out"], engine_out)
        storage.add_metric([], stored)
        yield from (device, cpu, tokens, engine, storage)


_collector = RecordCollector()
_ops_collector = OpsCollector()
_usage_collector = UsageCollector()
REGISTRY.register(_collector)
REGISTRY.register(_ops_collector)
REGISTRY.register(_usage_collector)


def scrape_registry() -> CollectorRegistry:
    """This process's metrics; under a web server of several processes (the stack sets
    PROMETHEUS_MULTIPROC_DIR), every process's, summed from the files they write there."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    registry.register(_collector)
    registry.register(_ops_collector)
    registry.register(_usage_collector)
    return registry


def metrics_view(request: HttpRequest) -> HttpResponse:

    if not ops_allowed(request):
        message = "the metrics need the operations token (Authorization: Bearer <FLYWHEEL_OPS_TOKEN>)"
        response = JsonResponse(error_body(401, message), status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)
