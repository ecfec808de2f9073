"""OpenTelemetry for `spec.tracing`: where spans go, and the standard variables of the
containers that export them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .meta import Fronted


def traces_url(owner: Fronted) -> str | None:
    """Where spans go (OTLP/HTTP: the collector's /v1/traces), or None: tracing is off."""
    endpoint = owner.spec.tracing.endpoint
    return None if endpoint is None else endpoint.rstrip("/") + "/v1/traces"


def tracing_env(
    owner: Fronted, service: str, resource: dict[str, str],
    taken: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:  # fmt: skip
    """OpenTelemetry's standard variables for spec.tracing, none when it is off: the
    frontend reads them (its tracing module), and vLLM's OpenTelemetry SDK
    (its exporter: OTLP/HTTP, not its default gRPC; its sampler; the resource). A variable
    the pool's own `env` sets is left to it."""
    t = owner.spec.tracing
    if t.endpoint is None:
        return []
    attributes = {"k8s.namespace.name": owner.namespace, **resource}
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": t.endpoint.rstrip("/"),
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": service,
        "OTEL_RESOURCE_ATTRIBUTES": ",".join(f"{k}={v}" for k, v in attributes.items()),
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": f"{t.sampling_ratio:g}",
    }
    names = {e["name"] for e in taken}
    return [{"name": k, "value": v} for k, v in env.items() if k not in names]
