"""One reconcile of one resource, a TranscriptionDeployment or a TranscriptionGateway:
observe (from the watch cache), build, apply, report.

Level-triggered: whatever event arrives (the resource changed, a child changed or
vanished, a gateway or a deployment it routes changed, a timer), the same function computes
the whole desired state and converges to it. Nothing is written when the cluster already
matches: a child is applied only when its live object differs from the desired one, and
the status only when it changed. Which deployments each gateway routes is computed from the
cache by the same pure `select` on both sides, so that both statuses agree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from transcription_api.capabilities import Capability, traffic_needs
from transcription_api.v1alpha1 import (
    GATEWAY_KIND,
    GatewayRouting,
    TranscriptionDeployment,
    TranscriptionGateway,
)
from transcription_api.v1alpha1 import KIND as TD_KIND
from transcription_api.v1alpha1 import TranscriptionDeploymentStatus as TDStatus
from transcription_api.v1alpha1 import TranscriptionGatewayStatus as GatewayStatus

from . import metrics
from .cache import Cache, Pods
from .children import build, build_gateway, endpoint_url
from .config import OperatorConfig
from .gateway_status import gateway_status
from .kinds import CHILD_KIND_NAMES, KINDS
from .kube import Kube, KubeError
from .names import MANAGED_BY_LABEL, PART_OF, POOL_LABEL
from .plan import Plan, plan
from .selection import Candidate, Invalid, Selection, select, verdicts_on
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


IMAGE_VOLUMES = (
    "this cluster does not serve image volumes (spec.model.source 'oci'): they need "
    "Kubernetes 1.35+, or 1.33-1.34 with the ImageVolume feature gate on the API server and "
    "every kubelet, and containerd 2.1+ or CRI-O 1.31+ on the nodes. Turn the gate on, or "
    "use source 'pvc' or 'image'"
)


def dropped_image_volumes(desired: dict[str, Any], stored: dict[str, Any]) -> list[str]:
    """The image volumes of a pod template that the API server did not store as such: one
    without the ImageVolume feature drops them without an error (1.33-1.34 with the gate
    off), and one that predates the field drops it, leaving an emptyDir by that name."""

    def image_volumes(obj: dict[str, Any]) -> set[str]:
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        return {v["name"] for v in pod.get("volumes") or [] if "image" in v}

    return sorted(image_volumes(desired) - image_volumes(stored))


class RetryLater(Exception):
    """The reconcile reported what failed and should run again after a backoff."""


@dataclass
class Result:
    outcome: str  # "applied", "unchanged", "degraded", "gone", "error"
    writes: int = 0
    requeue_after: float | None = None
    messages: list[str] = field(default_factory=list)
    status_changed: bool = False
    # Other resources to reconcile now, as their status follows this one's (the watch's echo
    # of the operator's own write is no news): the gateways that select a deployment whose
    # status changed (they copy its Ready), the deployments a gateway selects or selected
    # when its status changed (a conflict or a refusal came or went).
    enqueue: list[tuple[str, str, str]] = field(default_factory=list)


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
        self,
        kube: Kube,
        cache: Cache,
        cfg: OperatorConfig,
        pods: Pods | None = None,
        cluster_wide: bool = True,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.cfg = cfg
        self.pods = pods or Pods()
        # Whether the operator reads namespaces (their labels, for gateways that select
        # namespaces by label): only when it watches every namespace.
        self.cluster_wide = cluster_wide
        # Deployments as parsed, by (namespace, name, uid, resourceVersion).
        self._parsed: dict[tuple[str, ...], Candidate] = {}

    def reconcile(self, kind: str, namespace: str, name: str) -> Result:
        if kind == GATEWAY_KIND:
            return self.reconcile_gateway(namespace, name)
        return self.reconcile_deployment(namespace, name)

    def reconcile_deployment(self, namespace: str, name: str) -> Result:
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
        verdicts = verdicts_on(td, self.selections())
        routed_by = [g for g, v in verdicts if v.routed]
        desired = build(td, self.cfg, the_plan, routed_by)
        observed = Observed(problems=self._missing_secrets(td.namespace, _secret_refs(td)))
        observed.gateways = [
            GatewayRouting(
                namespace=g.namespace, name=g.name, routed=v.routed, reason=v.reason,
                message=v.message,
            )
            for g, v in verdicts
        ]  # fmt: skip
        for g in routed_by[:1]:
            gw = self._gateway(g.namespace, g.name)
            observed.gateway_endpoint = endpoint_url(gw, self.cfg) if gw else None
        converged = self._converge(body, desired, observed)
        if converged is None:
            metrics.forget(namespace, name)
            return Result("gone")
        writes, transient = converged
        observed.pods = self.pods.of(namespace, name)
        observed.events = self.pods.events(observed.pods)
        status = compute_status(td, the_plan, observed, self.cfg, now_rfc3339())
        report_metrics(td, the_plan, status)
        result = self._report(body, status, observed.problems, writes)
        if result.status_changed:
            result.enqueue = [(GATEWAY_KIND, g.namespace, g.name) for g, _ in verdicts]
        if _loading(status):
            # The elapsed time in the message moves once a minute without any event.
            result.requeue_after = min(result.requeue_after or LOADING_RECHECK, LOADING_RECHECK)
        if transient:
            raise RetryLater("; ".join(transient))
        return result

    def reconcile_gateway(self, namespace: str, name: str) -> Result:
        body = self.cache.get(GATEWAY_KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return Result("gone")  # children go with it: garbage collection
        try:
            gw = TranscriptionGateway.model_validate(body)
        except ValidationError as e:
            invalid = invalid_spec_status(
                body, "InvalidSpec", _validation_message(e), now_rfc3339()
            )
            return self._report(body, invalid, [("InvalidSpec", invalid.conditions[0].message)], 0)
        selection = self.select(gw)
        desired = build_gateway(gw, self.cfg, selection)
        fe = gw.spec.frontend
        secrets = [("frontend.apiKeySecret", fe.api_key_secret.name)] if fe.api_key_secret else []
        observed = Observed(problems=self._missing_secrets(namespace, secrets))
        converged = self._converge(body, desired, observed)
        if converged is None:
            return Result("gone")
        writes, transient = converged
        observed.pods = self.pods.of(namespace, name)
        observed.events = self.pods.events(observed.pods)
        status = gateway_status(gw, selection, observed, self.cfg, now_rfc3339())
        listed = (body.get("status") or {}).get("deployments") or []
        result = self._report(body, status, observed.problems, writes)
        if result.status_changed:
            # Whom it routes, or refuses, changed: their status says so (or said so).
            before = {(d["namespace"], d["name"]) for d in listed}
            after = {(v.namespace, v.name) for v in selection.verdicts}
            result.enqueue = [(TD_KIND, ns, n) for ns, n in sorted(before | after)]
        if transient:
            raise RetryLater("; ".join(transient))
        return result

    # ------------------------------------------------------------------ gateways

    def _parse(self, body: dict[str, Any]) -> Candidate:
        """The deployment a cached body holds (or why it cannot be read), parsed once per
        version of it."""
        meta = body["metadata"]
        key = tuple(str(meta.get(k)) for k in ("namespace", "name", "uid", "resourceVersion"))
        parsed = self._parsed.get(key)
        if parsed is None:
            try:
                parsed = TranscriptionDeployment.model_validate(body)
            except ValidationError as e:
                parsed = Invalid(meta, _validation_message(e))
            if len(self._parsed) > 10_000:
                self._parsed.clear()
            self._parsed[key] = parsed
        return parsed

    def _gateway(self, namespace: str, name: str) -> TranscriptionGateway | None:
        body = self.cache.get(GATEWAY_KIND, namespace, name)
        try:
            return TranscriptionGateway.model_validate(body) if body else None
        except ValidationError:
            return None

    def select(self, gw: TranscriptionGateway) -> Selection:
        """What `gw` routes, from the cache."""
        deployments = [self._parse(b) for b in self.cache.objects(TD_KIND)]
        labels = self.cache.namespace_labels() if self.cluster_wide else None
        return select(gw, deployments, labels)

    def selections(self) -> list[Selection]:
        """What every cached gateway (whose spec can be read) routes."""
        out = []
        for body in self.cache.objects(GATEWAY_KIND):
            meta = body["metadata"]
            gw = self._gateway(meta["namespace"], meta["name"])
            if gw is not None and not meta.get("deletionTimestamp"):
                out.append(self.select(gw))
        return out

    # ------------------------------------------------------------------ applying

    def _converge(
        self, body: dict[str, Any], desired: list[dict[str, Any]], observed: Observed
    ) -> tuple[int, list[str]] | None:
        """Apply what differs from the cache, prune what is no longer desired and observe
        the owner's Deployments; returns the writes and the transient failures, or None when
        the namespace is being deleted (nothing to apply or report: the resource goes)."""
        owner = body["metadata"]
        writes = 0
        transient: list[str] = []
        for manifest in desired:
            meta = manifest["metadata"]
            live = self.cache.get(manifest["kind"], meta["namespace"], meta["name"])
            if live is not None and is_subset(manifest, live):
                continue
            taken = _taken(live, body)
            if taken:
                observed.problems.append(("NameTaken", taken))
                continue
            try:
                applied = self.kube.apply(manifest)
            except KubeError as e:
                if e.namespace_terminating:
                    return None  # its children went first
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
            if dropped := dropped_image_volumes(manifest, applied):
                observed.problems.append(("ImageVolumesUnsupported",
                    f"{manifest['kind']} {meta['name']}: the API server dropped its image "
                    f"volume {', '.join(dropped)}: {IMAGE_VOLUMES}"))  # fmt: skip
        children = self.cache.children(owner["namespace"], owner["name"], str(owner["uid"]))
        writes += self._prune(children, desired)
        for child in children:
            if child["kind"] == "Deployment":
                observed.deployments[child["metadata"]["name"]] = child
        return writes, transient

    def _report(
        self,
        body: dict[str, Any],
        status: TDStatus | GatewayStatus,
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
            stored = self.kube.patch_status(meta["namespace"], meta["name"], new, body["kind"])
            writes += 1
            writes += self._events(body, old, new)
            # Cache what the server stored (its resourceVersion too): the watch event of an
            # earlier write, arriving later, must not bring back the older status.
            self.cache.put({**body, **(stored or {}), "status": new})
        degraded = any(c.type == "Degraded" and c.status == "True" for c in status.conditions)
        outcome = "degraded" if degraded else ("applied" if writes else "unchanged")
        # Missing Secrets are not watched: look again in a minute (not a retry storm).
        requeue = 60.0 if problems else None
        changed = _without_kopf(old) != new
        return Result(outcome, writes, requeue, [m for _, m in problems], changed)

    def _prune(self, children: list[dict[str, Any]], desired: list[dict[str, Any]]) -> int:
        """Delete the owner's managed children that are no longer desired."""
        wanted = {(m["kind"], m["metadata"]["name"]) for m in desired}
        deleted = 0
        for child in children:
            meta = child["metadata"]
            key = (child["kind"], meta["name"])
            labels = meta.get("labels") or {}
            managed = child["kind"] in CHILD_KIND_NAMES and labels.get(MANAGED_BY_LABEL) == PART_OF
            if key in wanted or not managed:
                continue
            log.info("deleting %s %s/%s: no longer desired", key[0], meta["namespace"], key[1])
            if self.kube.delete(child["kind"], meta["namespace"], key[1], meta["uid"]):
                deleted += 1
            self.cache.drop(child["kind"], meta["namespace"], key[1])
        return deleted

    def _missing_secrets(
        self, namespace: str, refs: list[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        """The Secrets (field, name) of the namespace that do not exist."""
        problems = []
        for field_name, secret in refs:
            try:
                exists = self.kube.get("Secret", namespace, secret) is not None
            except KubeError as e:
                if e.status != 403:
                    raise
                exists = True  # not allowed to look: let the pod report it
            if not exists:
                problems.append(
                    (
                        "SecretNotFound",
                        f"{field_name}: Secret {namespace}/{secret} does not exist; "
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


def _secret_refs(td: TranscriptionDeployment) -> list[tuple[str, str]]:
    """The Secrets a deployment names (field, name)."""
    refs = []
    if td.spec.frontend.enabled and td.spec.frontend.api_key_secret:
        refs.append(("frontend.apiKeySecret", td.spec.frontend.api_key_secret.name))
    if td.spec.model.hub_token_secret:
        refs.append(("model.hubTokenSecret", td.spec.model.hub_token_secret.name))
    return refs


def _taken(live: dict[str, Any] | None, owner: dict[str, Any]) -> str | None:
    """Why a child's name is taken: its live object belongs to another resource (a gateway
    and a deployment of one name in one namespace). The same resource recreated (another
    UID, same kind and name) adopts it, as before."""
    for ref in (live or {}).get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller") and (ref.get("kind"), ref.get("name")) != (
            owner["kind"],
            owner["metadata"]["name"],
        ):
            meta = live["metadata"] if live else {}
            return (
                f"{live['kind'] if live else ''} {meta.get('name')} belongs to {ref.get('kind')} "
                f"{meta.get('namespace')}/{ref.get('name')}: a TranscriptionGateway and a "
                "TranscriptionDeployment of one namespace need different names"
            )
    return None


def _conditions(status: TDStatus) -> list[tuple[str, str, str]]:
    return [(c.type, c.status.value, c.reason) for c in status.conditions]


def capability_label(need: frozenset[Capability]) -> str:
    """'transcriptions+word_timestamps': the endpoint, then the features, sorted."""
    endpoints = (Capability.TRANSCRIPTIONS, Capability.TRANSLATIONS, Capability.CHAT)
    first = sorted(c.value for c in need if c in endpoints)
    return "+".join(first + sorted(c.value for c in need if c not in endpoints))


def report_metrics(td: TranscriptionDeployment, the_plan: Plan, status: TDStatus) -> None:
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


def _loading(status: TDStatus) -> bool:
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
