"""An OpenTelemetry collector in-process, for the tracing tests: a real HTTP server that
takes OTLP/HTTP exports (`POST /v1/traces`, protobuf) as a collector does, and keeps their
spans, decoded with OpenTelemetry's own protobuf types."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass
class Span:
    """One exported span, with ids in hex as `traceparent` writes them."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a trace's root
    kind: str
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    start: int  # ns
    end: int
    service: str
    events: list[str] = field(default_factory=list)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class Collector:
    """Spans received so far (`spans`), and the URL to export them to (`traces_url`)."""

    def __init__(self, host: str = "127.0.0.1", advertise: str | None = None) -> None:
        """Listen on `host`; `advertise` is the address exporters are given (the test bed's
        pods reach this machine at the real node's address)."""
        self.spans: list[Span] = []
        self.requests = 0
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                ok = self.path == "/v1/traces" and self.headers.get("content-type") == (
                    "application/x-protobuf"
                )
                if ok:
                    collector.receive(body)
                self.send_response(200 if ok else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{advertise or host}:{self.server.server_address[1]}"
        self.traces_url = self.url + "/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def receive(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(Span(
                        name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(), kind=KINDS.get(s.kind, str(s.kind)),
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        status=s.status.code, start=s.start_time_unix_nano,
                        end=s.end_time_unix_nano, service=str(resource.get("service.name")),
                        events=[e.name for e in s.events],
                    ))  # fmt: skip
        with self.lock:
            self.spans += spans
            self.requests += 1

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def named(self, name: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def collector() -> Iterator[Collector]:
    c = Collector()
    try:
        yield c
    finally:
        c.stop()


def tree(spans: list[Span]) -> str:
    """A trace as an indented tree: name, kind, ids, the attributes that say where it went."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[Span]] = {}
    for s in sorted(spans, key=lambda s: s.start):
        children.setdefault(s.parent_id if s.parent_id in ids else "", []).append(s)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for s in children.get(parent, []):
            shown = {k: v for k, v in s.attributes.items()
                     if k.startswith("transcription.") or k == "http.response.status_code"}  # fmt: skip
            lines.append(f"{'  ' * depth}{s.name} [{s.kind}] span={s.span_id} "
                         f"parent={s.parent_id or '-'} {(s.end - s.start) / 1e6:.1f}ms {shown}")  # fmt: skip
            walk(s.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)
