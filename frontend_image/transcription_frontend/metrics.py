"""Prometheus metrics of the gateway. Model labels carry the primary model name."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "transcription_frontend_requests_total",
    "Requests answered, by primary model, endpoint, HTTP status and pool ('none' when no "
    "pool was reached).",
    ["model", "endpoint", "status", "pool"],
)
DURATION = Histogram(
    "transcription_frontend_request_duration_seconds",
    "Time from the request's arrival to the end of the response.",
    ["model", "endpoint", "pool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
AUDIO_SECONDS = Counter(
    "transcription_frontend_audio_seconds_total",
    "Seconds of audio transcribed or translated (answered 200), by primary model and API "
    "key: the seconds each answer's usage reports, for metering. `key` is the first 8 hex "
    'digits of the key\'s SHA-256 (`printf %s "$KEY" | sha256sum | cut -c1-8`), `none` '
    "when the gateway has no keys. Audio whose length neither the engine nor the upload's "
    "header tells (a stream of MP4/M4A, WebM or ASF audio) is not counted.",
    ["model", "key"],
)
UPLOAD_BYTES = Histogram(
    "transcription_frontend_upload_bytes",
    "Size of uploaded audio files.",
    ["endpoint"],
    buckets=tuple(2**k for k in range(14, 32, 2)),  # 16 KiB .. 1 GiB
)
IN_FLIGHT = Gauge(
    "transcription_frontend_in_flight_requests",
    "Requests being served by a worker, by pool.",
    ["pool"],
)
WORKER_REQUESTS = Counter(
    "transcription_frontend_worker_requests_total",
    "Requests sent to each worker, by pool: how the load is spread. `worker` is the worker's "
    "pod (static endpoints: `<pool>-<index>` in the route table), never its address.",
    ["pool", "worker"],
)
REFUSED_CONNECTIONS = Counter(
    "transcription_frontend_refused_connections_total",
    "Connections refused with 503 as they opened, by the limit they hit: client (its "
    "address's maxConnectionsPerClient) or total (maxConnections).",
    ["reason"],
)
RETRIES = Counter(
    "transcription_frontend_retries_total",
    "Requests sent again to another endpoint after one could not be reached or answered 503.",
    ["pool"],
)
EJECTIONS = Counter(
    "transcription_frontend_endpoint_ejections_total",
    "Endpoints taken out of rotation after repeated failures.",
    ["pool"],
)
ENDPOINTS = Gauge(
    "transcription_frontend_ready_endpoints",
    "Ready worker endpoints known, by pool.",
    ["pool"],
)
HELD = Gauge(
    "transcription_frontend_held_requests",
    "Requests waiting for a worker of the pool: held while it has none to take them (e.g. "
    "scaling from zero), or queued while every worker is at its bound of requests in flight.",
    ["pool"],
)
SPILLED = Gauge(
    "transcription_frontend_spilled_requests",
    "Requests in flight at a fallback pool because this pool, which they prefer, had no "
    "ready worker (e.g. a continuous pool at zero): they count as its load for autoscaling.",
    ["pool"],
)
BACKLOG = Gauge(
    "transcription_frontend_backlog_audio_seconds",
    "Seconds of audio this replica counts for the pool, which autoscaling scales on, by stage: "
    "arriving (uploading, parsing, being cut), queued (held; long audio's chunks waiting), "
    "in_flight (at a worker), spilled (in flight at a fallback pool in this one's place).",
    ["pool", "stage"],
)
DECODE_RATE = Gauge(
    "transcription_frontend_decode_rate",
    "Seconds of audio one worker of the pool decodes per second while busy, as this replica "
    "measures it on its answers (exponentially weighted, 120 s time constant).",
    ["pool"],
)
HELD_BYTES = Gauge(
    "transcription_frontend_held_bytes",
    "Bytes of the uploads held, all pools together (spooled to disk).",
)
HOLD_SECONDS = Histogram(
    "transcription_frontend_hold_seconds",
    "Time a request waited (held or queued) before a worker of its pool could take it (or it "
    "was refused).",
    ["pool"],
    buckets=(0.01, 0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600),
)
HOLD_REJECTIONS = Counter(
    "transcription_frontend_hold_rejections_total",
    "Requests answered 503 instead of held or queued, by the bound they hit: requests (per "
    "pool), bytes, memory, timeout, shutdown.",
    ["pool", "reason"],
)
TENANT_AUDIO = Counter(
    "transcription_frontend_tenant_audio_seconds_total",
    "Audio seconds of each tenant's requests: served (answered 200, as the answer reports "
    "them: what its quota is charged) and refused (429 over its quota, or 503 with the pool's "
    "queue full).",
    ["tenant", "outcome"],
)
TENANT_QUEUED = Gauge(
    "transcription_frontend_tenant_queued_audio_seconds",
    "Audio seconds of each tenant's requests waiting for a worker (held or queued).",
    ["tenant"],
)
TENANT_REJECTIONS = Counter(
    "transcription_frontend_tenant_rejections_total",
    "Requests of each tenant refused: quota_minute, quota_day (429) or queue_full (503: the "
    "requests or bytes waiting for its pool at their bound).",
    ["tenant", "reason"],
)
PEER_ERRORS = Counter(
    "transcription_frontend_peer_load_errors_total",
    "Peer frontends that did not report their load in time (their share is left out of "
    "the autoscaling metric until they do).",
)
CHUNKED = Counter(
    "transcription_frontend_chunked_requests_total",
    "Requests whose long audio was cut into chunks (each chunk is also a request in "
    "requests_total; the whole request is counted there with pool `chunked`).",
    ["model"],
)
CHUNKS = Histogram(
    "transcription_frontend_chunks_per_request",
    "Chunks a chunked request was cut into.",
    buckets=(2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256),
)
CHUNK_SECONDS = Histogram(
    "transcription_frontend_chunk_duration_seconds",
    "Time from a chunk's start to its answer (a chunk waiting for its turn not counted).",
    buckets=(0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120),
)
REALTIME_SESSIONS = Gauge(
    "transcription_frontend_realtime_sessions",
    "Realtime transcription sessions open (WebSockets on /v1/realtime).",
)
REALTIME_REFUSED = Counter(
    "transcription_frontend_realtime_refused_total",
    "Realtime sessions refused before they opened, by reason (intent, key, quota, model, "
    "limit, draining).",
    ["reason"],
)
REALTIME_TURNS = Counter(
    "transcription_frontend_realtime_turns_total",
    "Turns of realtime sessions transcribed, by the model the session named and outcome "
    "(completed, failed). Each is also a transcription request in requests_total.",
    ["model", "outcome"],
)
REALTIME_TURN_LATENCY = Histogram(
    "transcription_frontend_realtime_turn_latency_seconds",
    "From a turn's commit (server VAD: speech_stopped) to its transcript's completed (or "
    "failed) event.",
    ["model"],
    buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60),
)


def realtime_turn(model: str, outcome: str, seconds: float) -> None:
    REALTIME_TURNS.labels(model=model, outcome=outcome).inc()
    REALTIME_TURN_LATENCY.labels(model=model).observe(seconds)


@functools.cache
def _children(model: str, endpoint: str, status: int, pool: str) -> tuple[Any, Any]:
    return (
        REQUESTS.labels(model=model, endpoint=endpoint, status=str(status), pool=pool),
        DURATION.labels(model=model, endpoint=endpoint, pool=pool),
    )


@dataclass
class Observation:
    """One request, as the metrics see it: filled in along the pipeline, recorded once when
    the response (a stream included) has ended."""

    endpoint: str
    model: str = "unknown"  # the primary name, once the model is resolved
    pool: str = "none"  # until a pool's worker answers
    status: int = 500
    key: str = "none"  # the API key's label (auth.Key.label), once checked
    audio_seconds: int | None = None  # the answer's billed seconds, once it has been sent
    started: float = field(default_factory=time.perf_counter)

    def upload(self, size: int) -> None:
        UPLOAD_BYTES.labels(endpoint=self.endpoint).observe(size)

    def done(self) -> None:
        # The labelled children are looked up once per label set.
        count, duration = _children(self.model, self.endpoint, self.status, self.pool)
        count.inc()
        duration.observe(time.perf_counter() - self.started)
        if self.status == 200 and self.audio_seconds:
            AUDIO_SECONDS.labels(model=self.model, key=self.key).inc(self.audio_seconds)
