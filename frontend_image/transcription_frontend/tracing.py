"""Tracing: an OpenTelemetry span for each step of a request, exported over OTLP/HTTP.

Off unless an OTLP endpoint is set (`spec.tracing.endpoint`, which the operator passes as
OpenTelemetry's standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`,
`OTEL_TRACES_SAMPLER_ARG`; `TracingSettings.from_env`). Off, the gateway's `Tracer` is this
module's no-op: no exporter, no SDK imported, no trace header read or sent. On, the SDK and
the exporter are imported (`OtelTracer`), and:

- a request's span continues the client's trace when it sends a valid W3C `traceparent`
  (an invalid one is ignored: the request starts a trace of its own);
- each step is a child span: `receive` (the upload, parsed), `route` (the pools chosen),
  `forward` (to a worker: the pool and worker chosen), and under it `hold` (waiting for a
  pool to scale from zero) and one `worker` span per attempt, whose context goes to the
  worker as its `traceparent` (vLLM's own spans join the trace there);
- long audio: `longaudio.cut`, then `longaudio.fanout` with one `longaudio.chunk` per chunk,
  each the parent of the chunk's own request through the pipeline (subrequest.py);
- realtime: one `realtime.turn` per turn, under the WebSocket upgrade's `traceparent` when
  it had one, each the parent of the turn's request through the pipeline.

Spans are sampled parent-based: a client's sampled flag is followed, and new traces are
sampled at the ratio set. The docs list every span and attribute (docs/operations/tracing.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from transcription_api.errors import APIError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span as OtelSpan

log = logging.getLogger("transcription_frontend.tracing")

AttributeValue = str | bool | int | float | Sequence[str]
Attributes = Mapping[str, AttributeValue]

SERVICE_NAME = "transcription-frontend"
TRACE_HEADERS = (b"traceparent", b"tracestate")
TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class TracingSettings:
    endpoint: str | None = None  # where spans go (OTLP/HTTP, the full traces URL); None: off
    service_name: str = SERVICE_NAME
    sampling_ratio: float = 1.0  # of new traces; a client's sampled flag is followed

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TracingSettings:
        """OpenTelemetry's standard variables: on when an OTLP endpoint is set, unless
        `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`."""
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or None
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if endpoint is None and base:
            endpoint = base.rstrip("/") + TRACES_PATH  # the base URL's signal path (OTLP/HTTP)
        if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
            endpoint = None
        if env.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "none":
            endpoint = None
        ratio = 1.0
        arg = env.get("OTEL_TRACES_SAMPLER_ARG")
        if arg:
            try:
                ratio = min(max(float(arg), 0.0), 1.0)
            except ValueError:
                log.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a number: sampling all", arg)
        return cls(endpoint, env.get("OTEL_SERVICE_NAME") or SERVICE_NAME, ratio)


class Span(Protocol):
    """A step's span, as the pipeline sees it."""

    def set(self, key: str, value: AttributeValue | None) -> None: ...

    def end(self) -> None: ...


class Parent(Protocol):
    """Where a span hangs: a span's context, or a trace a client sent (`Tracer.incoming`)."""


class _NoSpan:
    """Tracing off: a span that records nothing (one for all)."""

    def set(self, key: str, value: AttributeValue | None) -> None:
        pass

    def end(self) -> None:
        pass

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


NO_SPAN = _NoSpan()


class Tracer:
    """Tracing off (the default): every method does nothing and costs a call."""

    enabled = False

    def span(self, name: str, attributes: Attributes | None = None, *,
             parent: Parent | None = None, client: bool = False,
             ) -> AbstractContextManager[Span]:  # fmt: skip
        """A context manager: a span for the block, current within it (a child of `parent`,
        else of the current span); `client`: a request to another service."""
        return NO_SPAN

    def request(self, name: str, headers: Iterable[tuple[bytes, bytes]],
                attributes: Attributes | None = None) -> AbstractContextManager[Span]:  # fmt: skip
        """A context manager: the span of a request the gateway serves, continuing the trace
        of a valid `traceparent` in `headers`; else a child of the current span (a
        subrequest: a chunk, a realtime turn), else a new trace."""
        return NO_SPAN

    def start(self, name: str, attributes: Attributes | None = None,
              parent: Parent | None = None) -> Span:  # fmt: skip
        """A span that outlives a block (not current anywhere): end it with `end()`; pass it
        as `parent` to its children."""
        return NO_SPAN

    def incoming(self, headers: Iterable[tuple[bytes, bytes]]) -> Parent | None:
        """The trace a client sent (a valid `traceparent`), or None."""
        return None

    def inject(self, headers: dict[str, str]) -> None:
        """Add the current span's `traceparent` (and `tracestate`) to an outgoing request."""

    def shutdown(self) -> None:
        """Export what is buffered, and stop."""


def setup(settings: TracingSettings) -> Tracer:
    """The gateway's tracer: a no-op unless an endpoint is set."""
    if settings.endpoint is None:
        return Tracer()
    log.info("tracing on: spans to %s (sampling %g of new traces)", settings.endpoint,
             settings.sampling_ratio)  # fmt: skip
    return OtelTracer(settings)


def _carrier(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The trace headers of an ASGI request (the first of each), for the propagator."""
    out: dict[str, str] = {}
    for k, v in headers:
        if k in TRACE_HEADERS:
            out.setdefault(k.decode("latin-1"), v.decode("latin-1"))
    return out


class _Live:
    """A recording span (or a sampled-out one: it records nothing, but carries the trace)."""

    def __init__(self, span: OtelSpan) -> None:
        self.span = span

    def set(self, key: str, value: AttributeValue | None) -> None:
        if value is not None:
            self.span.set_attribute(key, value)

    def end(self) -> None:
        self.span.end()


class _Context:
    """A Parent: an OpenTelemetry context."""

    def __init__(self, context: Context) -> None:
        self.context = context


class OtelTracer(Tracer):
    """Tracing on: the OpenTelemetry SDK, exporting in batches over OTLP/HTTP (protobuf).

    Its own TracerProvider, not the process-wide one: one per gateway (tests run several)."""

    enabled = True

    def __init__(self, settings: TracingSettings, provider: TracerProvider | None = None) -> None:
        from opentelemetry import context, trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._context, self._trace = context, trace
        self._propagator = TraceContextTextMapPropagator()
        if provider is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider = TracerProvider(
                # OTEL_RESOURCE_ATTRIBUTES (the pod, the deployment) are merged in
                resource=Resource.create({"service.name": settings.service_name}),
                sampler=ParentBased(TraceIdRatioBased(settings.sampling_ratio)),
            )
            exporter = OTLPSpanExporter(endpoint=settings.endpoint, timeout=10)
            provider.add_span_processor(BatchSpanProcessor(exporter))
        self.provider = provider
        self.tracer = provider.get_tracer("transcription_frontend")

    def _parent(self, parent: Parent | None) -> Context | None:
        return parent.context if isinstance(parent, _Context) else None

    @contextmanager
    def span(self, name: str, attributes: Attributes | None = None, *,
             parent: Parent | None = None, client: bool = False,
             ) -> Iterator[Span]:  # fmt: skip
        kind = self._trace.SpanKind.CLIENT if client else self._trace.SpanKind.INTERNAL
        with self._use(name, attributes, self._parent(parent), kind) as span:
            yield span

    @contextmanager
    def request(self, name: str, headers: Iterable[tuple[bytes, bytes]],
                attributes: Attributes | None = None) -> Iterator[Span]:  # fmt: skip
        current = self._context.get_current()
        sub = self._trace.get_current_span(current).get_span_context().is_valid
        parent = self._propagator.extract(_carrier(headers), context=current)
        kind = self._trace.SpanKind.INTERNAL if sub else self._trace.SpanKind.SERVER
        with self._use(name, attributes, parent, kind) as span:
            yield span

    @contextmanager
    def _use(self, name: str, attributes: Attributes | None, parent: Context | None,
             kind: Any) -> Iterator[Span]:  # fmt: skip
        span = self.tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
        with self._trace.use_span(span, end_on_exit=True, record_exception=False,
                                  set_status_on_exception=False):  # fmt: skip
            try:
                yield _Live(span)
            except BaseException as e:
                failed(span, e)
                raise

    def start(self, name: str, attributes: Attributes | None = None,
              parent: Parent | None = None) -> Span:  # fmt: skip
        return _Live(self.tracer.start_span(name, self._parent(parent), attributes=attributes))

    def incoming(self, headers: Iterable[tuple[bytes, bytes]]) -> Parent | None:
        carrier = _carrier(headers)
        if not carrier:
            return None
        ctx = self._propagator.extract(carrier)
        valid = self._trace.get_current_span(ctx).get_span_context().is_valid
        return _Context(ctx) if valid else None

    def inject(self, headers: dict[str, str]) -> None:
        self._propagator.inject(headers)

    def shutdown(self) -> None:
        self.provider.shutdown()


def context_of(span: Span) -> Parent | None:
    """A span as the parent of others (None when tracing is off)."""
    if isinstance(span, _Live):
        from opentelemetry import trace

        return _Context(trace.set_span_in_context(span.span))
    return None


def failed(span: OtelSpan, e: BaseException) -> None:
    """How a step ended that raised: an error, or a client's fault, or a cancellation."""
    from opentelemetry.trace import Status, StatusCode

    if isinstance(e, APIError):
        span.set_attribute("error.type", str(e.status))
        span.set_attribute("transcription.error.code", e.code or e.type)
        if e.status >= 500:
            span.set_status(Status(StatusCode.ERROR, e.message))
        return
    if not isinstance(e, Exception):  # cancelled: the client left, or a sibling failed
        span.set_attribute("transcription.cancelled", True)
        return
    span.record_exception(e)
    span.set_attribute("error.type", type(e).__qualname__)
    span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))
