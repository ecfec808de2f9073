"""One reconcile of one resource: observe (from the watch cache), build, apply, report.

Level-triggered: whatever event arrives (the resource changed, a child changed or
vanished, a timer), the same function computes the whole desired state and converges to
it. Nothing is written when the cluster already matches: a child is applied only when
its live object differs from the desired one, and the status only when it changed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from transcription_api.capabilities import Capability, traffic_needs
from transcription_api.v1alpha1 import KIND as TD_KIND
from transcription_api.v1alpha1 import TranscriptionDeployment, TranscriptionDeploymentStatus

from . import metrics
from .cache import Cache, Pods
from .children import build
from .config import OperatorConfig
from .kinds import CHILD_KIND_NAMES, KINDS
from .kube import Kube, KubeError
from .names import MANAGED_BY_LABEL, PART_OF, POOL_LABEL
from .plan import Plan, plan
from .status import (
    Observed,
    compute_status,
    invalid_spec_status,
    status_body,
    status_changes,
    status_events,
)

log = logging.getLogger(__name__)
LOADING_RECHECK = 60.0


def now_rfc3339() -> str:
    return datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_subset(desired: Any, live: Any) -> bool:
    """Whether every field of `desired` is present and equal in `live`.

    The API server adds defaults to what we apply, so equality is checked only for the
    fields the operator sets. Lists must have the same length (an added container or env
    var is drift).
    """
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            k in live and is_subset(v, live[k]) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(is_subset(d, v) for d, v in zip(desired, live, strict=True))
        )
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired is live
    if isinstance(desired, int | float) and isinstance(live, int | float):
        return desired == live
    return str(desired) == str(live)


class RetryLater(Exception):
    """The reconcile reported what failed and should run again after a backoff."""


@dataclass
class Result:
    outcome: str  # "applied", "unchanged", "degraded", "gone", "error"
    writes: int = 0
    requeue_after: float | None = None
    messages: list[str] = field(default_factory=list)


def missing_api(manifest: dict[str, Any]) -> tuple[str, str]:
    """The problem of a child whose API the cluster does not serve (KEDA's ScaledObject)."""
    labels = manifest["metadata"].get("labels") or {}
    pool = labels.get(POOL_LABEL, "?")
    return (
        "AutoscalerMissing",
        f"pool {pool}: spec.pools[].autoscaling needs KEDA, and this cluster does not serve "
        f"{manifest['apiVersion']} {manifest['kind']}: install KEDA (https://keda.sh); "
        "until then the pool does not scale",
    )


class Reconciler:
    def __init__(
        self, kube: Kube, cache: Cache, cfg: OperatorConfig, pods: Pods | None = None
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.cfg = cfg
        self.pods = pods or Pods()

    def reconcile(self, namespace: str, name: str) -> Result:
        body = self.cache.get(TD_KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            metrics.forget(namespace, name)
            return Result("gone")  # children go with it: garbage collection
        try:
            td = TranscriptionDeployment.model_validate(body)
        except ValidationError as e:
            status = invalid_spec_status(body, "InvalidSpec", _validation_message(e), now_rfc3339())
            metrics.report_status(namespace, name, _conditions(status), (), ())
            return self._report(body, status, [("InvalidSpec", status.conditions[0].message)], 0)

        the_plan = plan(td.spec)
        desired = build(td, self.cfg, the_plan)
        observed = Observed(problems=self._missing_secrets(td))
        writes = 0
        transient: list[str] = []
        for manifest in desired:
            meta = manifest["metadata"]
            live = self.cache.get(manifest["kind"], meta["namespace"], meta["name"])
            if live is not None and is_subset(manifest, live):
                continue
            try:
                applied = self.kube.apply(manifest)
            except KubeError as e:
                if e.namespace_terminating:
                    # The namespace goes, and the resource with it: nothing to apply or
                    # report (its children went first).
                    metrics.forget(namespace, name)
                    return Result("gone")
                if e.status == 404 and manifest["kind"] == "PodMonitor":
                    # Monitoring asked for where prometheus-operator is not installed:
                    # nothing would scrape it; skipped, not a fault of the service.
                    log.info("%s/%s: PodMonitor skipped: the cluster does not serve the kind",
                             meta["namespace"], meta["name"])  # fmt: skip
                    continue
                if e.status == 404 and KINDS[manifest["kind"]].optional:
                    observed.problems.append(missing_api(manifest))
                    continue
                # Either way the user sees it in status. A refusal (400/403/422: a bad
                # affinity, say) waits for the spec to change; anything else (the cluster
                # out of Service IPs, an API server hiccup) is retried with backoff.
                msg = f"{manifest['kind']} {meta['name']}: {e.message}"
                observed.problems.append(("ApplyFailed", msg))
                if e.status not in (400, 403, 422):
                    transient.append(msg)
                continue
            writes += 1
            self.cache.put(applied)
        writes += self._prune(td, desired)
        for child in self.cache.children(namespace, name, str(td.metadata["uid"])):
            if child["kind"] == "Deployment":
                observed.deployments[child["metadata"]["name"]] = child
        observed.pods = self.pods.of(namespace, name)
        observed.events = self.pods.events(observed.pods)
        status = compute_status(td, the_plan, observed, self.cfg, now_rfc3339())
        report_metrics(td, the_plan, status)
        result = self._report(body, status, observed.problems, writes)
        if _loading(status):
            # The elapsed time in the message moves once a minute without any event.
            result.requeue_after = min(result.requeue_after or LOADING_RECHECK, LOADING_RECHECK)
        if transient:
            raise RetryLater("; ".join(transient))
        return result

    def _report(
        self,
        body: dict[str, Any],
        status: TranscriptionDeploymentStatus,
        problems: list[tuple[str, str]],
        writes: int,
    ) -> Result:
        """Write the status if it changed (with Events for changes users care about)."""
        meta = body["metadata"]
        old = body.get("status") or {}
        new = status_body(status)
        if _without_kopf(old) != new:
            log.info("status of %s/%s: %s changed", meta["namespace"], meta["name"],
                     ", ".join(status_changes(_without_kopf(old), new)))  # fmt: skip
            stored = self.kube.patch_status(meta["namespace"], meta["name"], new)
            writes += 1
            writes += self._events(body, old, new)
            # Cache what the server stored (its resourceVersion too): the watch event of an
            # earlier write, arriving later, must not bring back the older status.
            self.cache.put({**body, **(stored or {}), "status": new})
        degraded = any(c.type == "Degraded" and c.status == "True" for c in status.conditions)
        outcome = "degraded" if degraded else ("applied" if writes else "unchanged")
        # Missing Secrets are not watched: look again in a minute (not a retry storm).
        requeue = 60.0 if problems else None
        return Result(outcome, writes, requeue, [m for _, m in problems])

    def _prune(self, td: TranscriptionDeployment, desired: list[dict[str, Any]]) -> int:
        wanted = {(m["kind"], m["metadata"]["name"]) for m in desired}
        deleted = 0
        for child in self.cache.children(td.namespace, td.name, str(td.metadata["uid"])):
            key = (child["kind"], child["metadata"]["name"])
            labels = child["metadata"].get("labels") or {}
            managed = child["kind"] in CHILD_KIND_NAMES and labels.get(MANAGED_BY_LABEL) == PART_OF
            if key in wanted or not managed:
                continue
            log.info("deleting %s %s/%s: no longer desired", *key[:1], td.namespace, key[1])
            if self.kube.delete(child["kind"], td.namespace, key[1], child["metadata"]["uid"]):
                deleted += 1
            self.cache.drop(child["kind"], td.namespace, key[1])
        return deleted

    def _missing_secrets(self, td: TranscriptionDeployment) -> list[tuple[str, str]]:
        refs = []
        if td.spec.frontend.api_key_secret:
            refs.append(("frontend.apiKeySecret", td.spec.frontend.api_key_secret.name))
        if td.spec.model.hub_token_secret:
            refs.append(("model.hubTokenSecret", td.spec.model.hub_token_secret.name))
        problems = []
        for field_name, secret in refs:
            try:
                exists = self.kube.get("Secret", td.namespace, secret) is not None
            except KubeError as e:
                if e.status != 403:
                    raise
                exists = True  # not allowed to look: let the pod report it
            if not exists:
                problems.append(
                    (
                        "SecretNotFound",
                        f"{field_name}: Secret {td.namespace}/{secret} does not exist; "
                        "create it or remove the reference",
                    )
                )
        return problems

    def _events(self, body: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> int:
        """Post the Events the status change deserves (see `status_events`)."""
        posted = 0
        for event in status_events(old, new):
            try:
                self.kube.event(body, *event, now=now_rfc3339())
                posted += 1
            except KubeError as e:
                log.warning("could not post event %s: %s", event[1], e)
        return posted


def _conditions(status: TranscriptionDeploymentStatus) -> list[tuple[str, str, str]]:
    return [(c.type, c.status.value, c.reason) for c in status.conditions]


def capability_label(need: frozenset[Capability]) -> str:
    """'transcriptions+word_timestamps': the endpoint, then the features, sorted."""
    endpoints = (Capability.TRANSCRIPTIONS, Capability.TRANSLATIONS, Capability.CHAT)
    first = sorted(c.value for c in need if c in endpoints)
    return "+".join(first + sorted(c.value for c in need if c not in endpoints))


def report_metrics(
    td: TranscriptionDeployment, the_plan: Plan, status: TranscriptionDeploymentStatus
) -> None:
    """The resource's status as the operator's per-resource series: its conditions, its
    pools' replicas, and the replicas serving each kind of request its traffic declares."""
    pools = {p.name: p for p in status.pools}
    caps = []
    for need in traffic_needs(td.spec.traffic.endpoints, td.spec.traffic.features):
        serving = [pools[p.name] for p in the_plan.pools
                   if p.capabilities.covers(need) and p.name in pools]  # fmt: skip
        caps.append((capability_label(need), sum(p.replicas for p in serving),
                     sum(min(p.ready_replicas, p.replicas) for p in serving)))  # fmt: skip
    metrics.report_status(
        td.namespace,
        td.name,
        _conditions(status),
        [(p.name, p.engine.value, p.replicas, p.ready_replicas) for p in status.pools],
        caps,
    )


def _loading(status: TranscriptionDeploymentStatus) -> bool:
    not_ready = [p.not_ready for p in status.pools]
    if status.frontend:
        not_ready.append(status.frontend.not_ready)
    return any(nr and nr.reason == "StartupProbeFailing" for nr in not_ready)


def _without_kopf(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k != "kopf"}


def _validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "invalid spec: " + "; ".join(parts)
