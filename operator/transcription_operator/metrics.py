"""Prometheus metrics of the operator (served on --metrics-port)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

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

# Per resource: what its status says, for alerts and the dashboard. Labelled with the
# resource's namespace and name (`resource_namespace`, `resource`: the operator's own
# `namespace` target label stays the operator's; the chart's ServiceMonitor copies them
# to `namespace` and `deployment`, the labels the frontends' and workers' series carry).
CONDITION = Gauge(
    "transcription_operator_condition",
    "A TranscriptionDeployment's status conditions: 1 while True, 0 while False or Unknown, "
    "by condition type and its reason.",
    ["resource_namespace", "resource", "condition", "reason"],
)
POOL_REPLICAS = Gauge(
    "transcription_operator_pool_replicas",
    "Worker replicas of each pool: desired (what the pool, or its autoscaler, asks for now) "
    "and ready.",
    ["resource_namespace", "resource", "pool", "engine", "state"],
)
CAPABILITY_WORKERS = Gauge(
    "transcription_operator_capability_workers",
    "For each kind of request the resource declares (spec.traffic: an endpoint alone or "
    "with a feature, e.g. transcriptions+word_timestamps), the worker replicas of the pools "
    "that serve it: desired and ready. Desired > 0 with none ready: that traffic fails.",
    ["resource_namespace", "resource", "capability", "state"],
)
_PER_RESOURCE = (CONDITION, POOL_REPLICAS, CAPABILITY_WORKERS)
# The label sets each resource has set, so that a changed reason or a removed pool (or
# the resource gone) leaves no stale series behind.
_SERIES: dict[tuple[str, str], set[tuple[Gauge, tuple[str, ...]]]] = {}


def report_status(
    namespace: str,
    name: str,
    conditions: Iterable[tuple[str, str, str]],
    pools: Iterable[tuple[str, str, int, int]],
    capabilities: Iterable[tuple[str, int, int]],
) -> None:
    """The series of one resource's status: conditions as (type, status, reason), pools
    as (name, engine, desired, ready), declared kinds of request as (capability, desired,
    ready). Replaces what was reported before for the resource."""
    values: dict[tuple[Gauge, tuple[str, ...]], float] = {}
    for type_, status, reason in conditions:
        values[(CONDITION, (namespace, name, type_, reason))] = 1.0 if status == "True" else 0.0
    for pool, engine, desired, ready in pools:
        values[(POOL_REPLICAS, (namespace, name, pool, engine, "desired"))] = desired
        values[(POOL_REPLICAS, (namespace, name, pool, engine, "ready"))] = ready
    for capability, desired, ready in capabilities:
        values[(CAPABILITY_WORKERS, (namespace, name, capability, "desired"))] = desired
        values[(CAPABILITY_WORKERS, (namespace, name, capability, "ready"))] = ready
    forget(namespace, name, keep=set(values))
    for (gauge, labels), value in values.items():
        gauge.labels(*labels).set(value)
    _SERIES[(namespace, name)] = set(values)


def forget(
    namespace: str, name: str, keep: set[tuple[Gauge, tuple[str, ...]]] | None = None
) -> None:
    """Remove a resource's series (those not in `keep`): it is gone, or they changed."""
    for gauge, labels in _SERIES.pop((namespace, name), set()) - (keep or set()):
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)


def forget_all() -> None:
    """Remove every resource's series (this replica no longer reconciles: a standby)."""
    for namespace, name in list(_SERIES):
        forget(namespace, name)
