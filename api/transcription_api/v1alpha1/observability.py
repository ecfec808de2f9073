"""`spec.tracing` and `spec.monitoring`: OpenTelemetry traces and Prometheus scraping."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from ..schema import CrdModel, Rule, broken, validations
from ..units import DURATION

# An OTLP/HTTP collector's base URL: http(s), a host (name or IPv4) and port, an optional
# path; no query, fragment or credentials. CEL's `matches` (RE2) and Python's `re` read it
# alike: it has no backslash to escape in either.
OTLP_ENDPOINT = r"^https?://[A-Za-z0-9._-]+(:[0-9]{1,5})?(/[-A-Za-z0-9._~/%]*)?$"
OTLP_ENDPOINT_MESSAGE = (
    "tracing.endpoint must be the http:// or https:// base URL of an OTLP/HTTP collector, "
    "a host and port with no query or credentials (e.g. http://otel-collector.monitoring:4318)"
)


class MonitoringSpec(CrdModel):
    """Prometheus scraping of this resource's pods through prometheus-operator
    (docs/operations/metrics.md). The chart's `metrics.podMonitors` does the same for every
    resource at once; this is for clusters where the chart's is off."""

    pod_monitor: bool = Field(
        default=False,
        description="Create a PodMonitor (monitoring.coreos.com/v1) scraping the frontend and "
        "the workers (not `transformers serve`, which has no /metrics), whose series get "
        "`namespace`, `deployment`, `pool` and `engine` labels. Skipped where the cluster "
        "does not serve PodMonitors (prometheus-operator not installed).",
    )
    interval: str = Field(
        default="30s", pattern=DURATION, max_length=20, description="Scrape interval."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels of the PodMonitor: what Prometheus' podMonitorSelector matches.",
    )


TRACING_RULES: list[Rule[TracingSpec]] = [
    Rule(
        f"!has(self.endpoint) || self.endpoint.matches('{OTLP_ENDPOINT}')",
        OTLP_ENDPOINT_MESSAGE,
        lambda t: t.endpoint is None or re.match(OTLP_ENDPOINT, t.endpoint) is not None,
        field_path=".endpoint",
    )
]


class TracingSpec(CrdModel):
    """OpenTelemetry traces of each request, from the frontend into vLLM's engine
    (docs/operations/tracing.md). Off unless `endpoint` is set."""

    model_config = ConfigDict(json_schema_extra=validations(TRACING_RULES))

    endpoint: str | None = Field(
        default=None,
        max_length=512,
        description="Base URL of an OTLP/HTTP (protobuf) collector, e.g. "
        "http://otel-collector.monitoring:4318: the frontends and the vLLM workers export "
        "spans to its /v1/traces. Unset: no tracing (the default).",
    )
    sampling_ratio: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="Fraction of new traces sampled. A request that brings a W3C "
        "`traceparent` follows its sampled flag instead (parent-based sampling).",
    )

    @model_validator(mode="after")
    def _endpoint(self) -> TracingSpec:
        if broken(TRACING_RULES, self):
            raise ValueError(f"{OTLP_ENDPOINT_MESSAGE}; got {self.endpoint!r}")
        return self


# `spec.tracing`, of a deployment and of a gateway alike.
Tracing = Annotated[
    TracingSpec,
    Field(
        default_factory=TracingSpec,
        description="OpenTelemetry traces: the OTLP endpoint and sampling (off by default).",
    ),
]
