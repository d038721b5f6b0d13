"""OTLP/HTTP, included at /otlp/: exporters append /v1/traces to the endpoint they are given."""

from django.urls import path

from traces import otlp

urlpatterns = [path("v1/traces", otlp.otlp_traces, name="otlp-traces")]
