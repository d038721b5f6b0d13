"""Prometheus metrics at /metrics: request counts and latencies, and the size of the record."""

import os
import time
from collections.abc import Callable, Iterator

from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

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
        ("flywheel_projects", "Project", "Projects"),
        ("flywheel_task_sets", "TaskSet", "Task sets"),
        ("flywheel_task_items", "TaskItem", "Task items over all versions"),
        ("flywheel_tiers", "Tier", "Tiers"),
    )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Declared without touching the database, which may not exist yet at import time.
        for name, _, doc in self.GAUGES:
            yield GaugeMetricFamily(name, doc)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from django.apps import apps

        for name, model_name, doc in self.GAUGES:
            model = apps.get_model("runs", model_name)
            yield GaugeMetricFamily(name, doc, value=model.objects.count())


_collector = RecordCollector()
REGISTRY.register(_collector)


def scrape_registry() -> CollectorRegistry:
    """This process's metrics; under a web server of several processes (the stack sets
    PROMETHEUS_MULTIPROC_DIR), every process's, summed from the files they write there."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    registry.register(_collector)
    return registry


def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)
