"""Prometheus metrics of the operator (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "transcription_operator_reconciles_total",
    "Reconciles of TranscriptionDeployments by result (applied, unchanged, degraded, gone, error).",
    ["result"],
)
RECONCILE_SECONDS = Histogram(
    "transcription_operator_reconcile_duration_seconds",
    "Time one reconcile took.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
API_REQUESTS = Counter(
    "transcription_operator_api_requests_total",
    "Requests the operator sent to the Kubernetes API, by verb.",
    ["verb"],
)
MANAGED = Gauge(
    "transcription_operator_managed_resources",
    "Objects the operator manages, by kind (TranscriptionDeployment and its children).",
    ["kind"],
)
ENQUEUED = Counter(
    "transcription_operator_enqueued_total",
    "Reconciles asked for (before deduplication), by what asked: a watch event of a kind "
    "(TranscriptionDeployment, a child kind, Pod, Event), a requeue, the periodic resync, "
    "a relist, or this replica starting to lead.",
    ["by"],
)
QUEUE_DEPTH = Gauge("transcription_operator_queue_depth", "Resources waiting for a reconcile.")
LEADER = Gauge(
    "transcription_operator_leader",
    "1 while this replica is the leader (reconciles), 0 while it stands by; 1 without "
    "leader election.",
)
