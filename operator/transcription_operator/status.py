"""`status(resource, observed) -> status`: a pure function.

Conditions follow two conventions at once so that every GitOps tool reads health without
custom scripts:
- `Ready`, `Progressing`, `Degraded` (Deployment-like; Argo CD and humans), and
- `Reconciling`, `Stalled` (kstatus "abnormal-true" conditions, which Flux and kpt use),
plus `AutoSplit`, which says whether the operator added sequential pools and why.
Each condition carries `observedGeneration`; `lastTransitionTime` only moves when the
status of the condition changes, so a steady resource gets an identical status and the
operator writes nothing.

`Ready` means "a request of every declared kind would be served now": a ready frontend
(without one of its own, `spec.frontend.enabled: false`, a gateway that routes it; else
NotRouted, a failure), and for each kind a pool covering it with a ready replica, old or
new (or one at zero, which wakes on demand). So it stays True while old replicas serve
through a rollout, stuck or not, as a Deployment stays Available. The rest says where the
rollout stands; exactly one of three states holds:
- *failed* (something needs a human: a missing Secret, traffic no pool covers, no replica
  for a declared endpoint, a spec finding, pods that crash-loop or cannot pull their image,
  a rollout past its Deployment's progressDeadlineSeconds): Degraded=Stalled=True,
  Progressing=Reconciling=False, all with the failure's reason. Ready=False, unless only
  a rollout failed and the old replicas serve (Ready=True, with that reason);
- *progressing* (replicas are on their way): Progressing=Reconciling=True, with the pods'
  reason when they have one (Unschedulable, a startup probe still failing) and the
  cluster's words; Degraded=Stalled=False; Ready=True (RollingOut) while serving, else
  False with the pods' reason;
- *done*: Ready=True, all four others False.
Argo CD's health check (gitops/argocd-health.lua) and kstatus read the same: Progressing
while rolling, Degraded after the deadline, Healthy when done.
Ready's message names what is not ready and why, in the words the cluster used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transcription_api.capabilities import Capability, traffic_needs
from transcription_api.findings import findings
from transcription_api.schema import CrdModel
from transcription_api.v1alpha1 import (
    Condition,
    ConditionStatus,
    FrontendStatus,
    GatewayRouting,
    NotReady,
    PoolStatus,
    ResourcesSpec,
    TranscriptionDeployment,
    TranscriptionDeploymentStatus,
    WeightsSource,
    WeightsStatus,
)

from .children import endpoint_url
from .config import OperatorConfig
from .diagnose import is_failing, parse_time, progress_deadline_exceeded, summarise
from .names import COMPONENT_LABEL, POOL_LABEL, frontend_name, pool_object_name
from .plan import Plan, PlannedPool, describe
from .selection import REFUSALS

T, F = ConditionStatus.TRUE, ConditionStatus.FALSE
ENDPOINTS = (Capability.TRANSCRIPTIONS, Capability.TRANSLATIONS)
# Not-ready reasons worth a Warning Event (the others, a model loading, are Normal).
WARN = frozenset({"Unschedulable", "ProgressDeadlineExceeded"})
SERVING = "serving every declared kind of request; "  # Ready=True's, while not done


@dataclass
class Observed:
    """What the operator saw of a resource's children, and problems it found."""

    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> object
    problems: list[tuple[str, str]] = field(default_factory=list)  # (reason, message)
    pods: list[dict[str, Any]] = field(default_factory=list)  # the resource's pods
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # pod UID -> Warnings
    # The gateways that select the resource (routing it or not), and the endpoint of the
    # first that routes it (where clients reach a deployment without a frontend of its own).
    gateways: list[GatewayRouting] = field(default_factory=list)
    gateway_endpoint: str | None = None


@dataclass(frozen=True)
class Rollout:
    desired: int
    ready: int  # old and new replicas alike: those serving now
    done: bool  # the controller has rolled out the current template to every replica
    old: int = 0  # replicas of an older template, still there

    def text(self, what: str) -> str:
        """'pool cpu 0/1 ready' or, while old replicas serve, 'pool cpu 0/1 ready on the
        new spec, 1 old replica serving'."""
        if not self.old:
            return f"{what} {self.ready}/{self.desired} ready"
        new = max(0, self.ready - self.old)
        serving = min(self.old, self.ready)
        return (
            f"{what} {new}/{self.desired} ready on the new spec, {serving} old "
            f"replica{'s' if serving != 1 else ''} serving"
        )


def rollout(dep: dict[str, Any] | None, desired: int) -> Rollout:
    if dep is None:
        return Rollout(desired, 0, False)  # not created yet
    st = dep.get("status") or {}
    ready = int(st.get("readyReplicas") or 0)
    current = st.get("observedGeneration", 0) >= dep["metadata"].get("generation", 0)
    updated = int(st.get("updatedReplicas") or 0)
    total = int(st.get("replicas") or 0)
    done = (
        current
        and updated >= desired
        and ready >= desired
        and total <= desired  # old replicas are gone
    )
    return Rollout(desired, ready, done, old=max(0, total - updated) if current else 0)


def desired_replicas(pool: PlannedPool, dep: dict[str, Any] | None) -> int:
    """What the pool should run now: its replicas, or, when it autoscales, the count the
    autoscaler set on the Deployment (1 until the Deployment exists)."""
    if pool.spec.autoscaling is None:
        return pool.spec.replicas
    return int(((dep or {}).get("spec") or {}).get("replicas", 1))


def can_serve(pool: PlannedPool) -> bool:
    """Whether the pool has, or can wake, a replica."""
    a = pool.spec.autoscaling
    return a.max_replicas > 0 if a else pool.spec.replicas > 0


def requests_text(res: ResourcesSpec) -> str:
    """'1 nvidia.com/gpu, 4 CPU, 24Gi memory'"""
    parts = []
    if res.gpus:
        parts.append(f"{res.gpus} {res.gpu_resource_name}")
    if res.cpu:
        parts.append(f"{res.cpu} CPU")
    if res.memory:
        parts.append(f"{res.memory} memory")
    return ", ".join(parts) or "no GPU, CPU or memory"


def not_ready_text(nr: NotReady) -> str:
    if not nr.pods:
        return f"{nr.reason}: {nr.message}"
    return f"{nr.pods} pod{'s' if nr.pods != 1 else ''} {nr.reason}: {nr.message}"


def pods_of(pods: list[dict[str, Any]], component: str, pool: str | None) -> list[dict[str, Any]]:
    out = []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        if labels.get(COMPONENT_LABEL) == component and labels.get(POOL_LABEL) == pool:
            out.append(pod)
    return out


def no_capacity(td: TranscriptionDeployment, the_plan: Plan) -> list[tuple[str, str]]:
    """Declared traffic that no replica can serve: every pool that covers it has 0 replicas."""
    out = []
    if td.spec.frontend.enabled and td.spec.frontend.replicas == 0:
        out.append(
            ("NoCapacity", "spec.frontend.replicas is 0: nothing receives requests; scale it up")
        )
    empty: list[frozenset[Capability]] = []
    idle: list[PlannedPool] = []
    endpoints_without = set()
    for need in traffic_needs(td.spec.traffic.endpoints, td.spec.traffic.features):
        covering = [p for p in the_plan.pools if p.capabilities.covers(need)]
        if not covering or any(can_serve(p) for p in covering):
            continue
        endpoint = next(c for c in need if c in ENDPOINTS)
        if len(need) == 1:
            endpoints_without.add(endpoint)
        elif endpoint in endpoints_without:
            continue  # the endpoint itself is already named
        empty.append(need)
        idle += [p for p in covering if p not in idle]
    if empty:
        fields = sorted(
            {"spec.autoSplit.replicas" if p.automatic else "spec.pools[].replicas" for p in idle}
        )
        out.append(
            (
                "NoCapacity",
                "no replica can serve "
                + ", ".join(describe(n) for n in empty)
                + ": "
                + ("pool " if len(idle) == 1 else "pools ")
                + ", ".join(p.name for p in idle)
                + (" has" if len(idle) == 1 else " have")
                + " 0 replicas; scale up "
                + " or ".join(fields),
            )
        )
    return out


def make_condition(
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int,
    previous: dict[str, Condition],
    now: str,
) -> Condition:
    prev = previous.get(type_)
    since = prev.last_transition_time if prev and prev.status == status else now
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


@dataclass
class Progress:
    """Rollouts still waiting (with their pods' reason) and those that failed."""

    waiting: list[tuple[str | None, str]] = field(default_factory=list)  # (reason, text)
    failed: list[tuple[str, str]] = field(default_factory=list)

    def add(self, what: str, r: Rollout, nr: NotReady | None, dep: dict[str, Any] | None) -> None:
        text = r.text(what)
        if nr:
            text += f", {not_ready_text(nr)}"
        if progress_deadline_exceeded(dep):
            deadline = (dep or {}).get("spec", {}).get("progressDeadlineSeconds")
            past = f"its progressDeadlineSeconds ({deadline}s)" if deadline else "its deadline"
            self.failed.append(("ProgressDeadlineExceeded", f"rollout stuck past {past}: {text}"))
        elif nr and is_failing(nr.reason):
            self.failed.append((nr.reason, text))
        else:
            self.waiting.append((nr.reason if nr else None, text))


def compute_status(
    td: TranscriptionDeployment,
    the_plan: Plan,
    observed: Observed,
    cfg: OperatorConfig,
    now: str,
) -> TranscriptionDeploymentStatus:
    generation = int(td.metadata.get("generation") or 0)
    previous = {c.type: c for c in (td.status.conditions if td.status else [])}
    at = parse_time(now)

    pools: list[PoolStatus] = []
    progress = Progress()
    ready_pools = 0
    asleep: list[str] = []  # autoscaled pools at zero, which wake on demand
    for p in the_plan.pools:
        name = pool_object_name(td, p.name)
        dep = observed.deployments.get(name)
        r = rollout(dep, desired_replicas(p, dep))
        if p.spec.autoscaling and r.desired == 0 and r.done:
            asleep.append(p.name)
        nr = None
        if not r.done:
            nr = summarise(dep, pods_of(observed.pods, "worker", p.name), observed.events, at)
            progress.add(f"pool {p.name}", r, nr, dep)
        else:
            ready_pools += 1
        pools.append(
            PoolStatus(
                name=p.name,
                engine=p.engine,
                mode=p.mode,
                replicas=r.desired,
                ready_replicas=r.ready,
                capabilities=sorted(p.capabilities.capabilities),
                automatic=p.automatic,
                reason=p.reason,
                service=name,
                resources=p.spec.resources,
                not_ready=nr,
            )
        )
    own = td.spec.frontend.enabled  # else served through gateways only
    routing = [g for g in observed.gateways if g.routed]
    fe_dep = observed.deployments.get(frontend_name(td))
    fe = rollout(fe_dep, td.spec.frontend.replicas)
    fe_nr = None
    if own and not fe.done:
        fe_nr = summarise(fe_dep, pods_of(observed.pods, "frontend", None), observed.events, at)
        progress.add("frontend", fe, fe_nr, fe_dep)

    problems = list(observed.problems)
    if not own and not routing:
        problems.append(("NotRouted", not_routed(observed.gateways)))
    for need in the_plan.uncovered:
        missing = f"no pool can serve {describe(need)}: missing " + ", ".join(sorted(need))
        if td.spec.auto_split.enabled:
            family = td.spec.model.family.value
            hint = f" in every pool, and no engine serves it for model family {family}"
        else:
            hint = " in every pool; add a pool whose engine serves it or enable autoSplit"
        problems.append(("TrafficNotCovered", missing + hint))
    problems += findings(td.spec)
    problems += no_capacity(td, the_plan)
    problems += weights_problems(td, observed.pods)
    frontends = fe.ready if own else len(routing)
    serving = not problems and _serving(td, the_plan, pools, asleep, frontends)
    problems += progress.failed

    def cond(type_: str, status: ConditionStatus, reason: str, message: str) -> Condition:
        return make_condition(type_, status, reason, message, generation, previous, now)

    ready_reason, ready_msg = "Ready", f"{ready_pools} pool(s) and the frontend are ready"
    if not own:
        through = ", ".join(f"{g.namespace}/{g.name}" for g in routing)
        ready_msg = f"{ready_pools} pool(s) are ready, served through gateway {through}"
    if asleep:
        ready_reason = "ScaledToZero"
        ready_msg += (
            f"; pool{'s' if len(asleep) > 1 else ''} {', '.join(asleep)} scaled to zero, "
            "woken by the first request (the frontend holds it meanwhile)"
        )
    conditions = health(cond, problems, serving, progress.waiting, (ready_reason, ready_msg))
    conditions.append(cond("AutoSplit", *_auto_split(td, the_plan)))

    desired = sum(p.replicas for p in pools)
    ready = sum(min(p.ready_replicas, p.replicas) for p in pools)
    return TranscriptionDeploymentStatus(
        observed_generation=generation,
        conditions=conditions,
        pools=pools,
        frontend=FrontendStatus(
            replicas=td.spec.frontend.replicas, ready_replicas=fe.ready, not_ready=fe_nr
        )
        if own
        else None,
        ready_pools=f"{ready_pools}/{len(the_plan.pools)}",
        worker_replicas=f"{ready}/{desired}",
        endpoint=endpoint_url(td, cfg) if own else observed.gateway_endpoint,
        models=td.spec.model.served_names,
        gateways=observed.gateways,
        weights=weights_status(td, observed.pods),
    )


def weights_status(td: TranscriptionDeployment, pods: list[dict[str, Any]]) -> WeightsStatus | None:
    """Source 'oci': the image the spec names, and the digests the workers' kubelets report
    mounting (pod status: containerStatuses[].volumeMounts[].volumeStatus.image.imageRef)."""
    m = td.spec.model
    if m.source != WeightsSource.OCI or m.image is None:
        return None
    digests = {digest for _, digest in _mounted(pods)}
    return WeightsStatus(image=m.image, pinned="@sha256:" in m.image, digests=sorted(digests))


def _mounted(pods: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(reference, digest) of each worker pod's weights image, where its kubelet reports the
    digest (containerStatuses[].volumeMounts[].volumeStatus.image.imageRef)."""
    out = []
    for pod in pods:
        if (pod["metadata"].get("labels") or {}).get(COMPONENT_LABEL) != "worker":
            continue
        volumes = (pod.get("spec") or {}).get("volumes") or []
        reference = next((v["image"].get("reference") for v in volumes
                          if v.get("name") == "weights" and "image" in v), None)  # fmt: skip
        for c in (pod.get("status") or {}).get("containerStatuses") or []:
            for mount in c.get("volumeMounts") or []:
                image = (mount.get("volumeStatus") or {}).get("image") or {}
                if mount.get("name") == "weights" and image.get("imageRef"):
                    out.append((reference or "", str(image["imageRef"])))
    return out


def weights_problems(
    td: TranscriptionDeployment, pods: list[dict[str, Any]]
) -> list[tuple[str, str]]:
    """Source 'oci' named by a tag that moved: pods with the same reference mount different
    digests (a pod started after the move got the new one), so replicas serve different
    weights. A rollout to a new reference is no problem: its pods name another reference."""
    if td.spec.model.source != WeightsSource.OCI:
        return []
    by_reference: dict[str, set[str]] = {}
    for reference, digest in _mounted(pods):
        by_reference.setdefault(reference, set()).add(digest.rpartition("@")[2] or digest)
    return [
        ("WeightsDigestChanged",
         f"worker pods mount {reference} as {len(digests)} different images "
         f"({', '.join(sorted(digests))}): the tag moved under running pools, so replicas "
         "serve different weights. Pin spec.model.image by digest (@sha256:...)")
        for reference, digests in sorted(by_reference.items())
        if len(digests) > 1
    ]  # fmt: skip


def not_routed(gateways: list[GatewayRouting]) -> str:
    """NotRouted's message: no frontend of its own, and no gateway routes it (why not)."""
    why = "; ".join(f"gateway {g.namespace}/{g.name} refuses it: {g.message}" for g in gateways)
    return (
        "spec.frontend.enabled is false and no TranscriptionGateway routes this deployment"
        + (f": {why}" if why else " (none selects it)")
        + "; add the labels a gateway selects, or enable spec.frontend"
    )


Cond = Callable[[str, ConditionStatus, str, str], Condition]


def health(
    cond: Cond,
    problems: list[tuple[str, str]],
    serving: bool,
    waiting: list[tuple[str | None, str]],
    done: tuple[str, str],
    serving_prefix: str = SERVING,
) -> list[Condition]:
    """Ready, Degraded, Stalled, Progressing and Reconciling: *failed* (problems), else
    *progressing* (waiting), else *done* (Ready with `done`'s reason and message); Ready
    True while `serving` (its message then opens with `serving_prefix`)."""
    waiting_msg = "waiting for " + "; ".join(t for _, t in waiting)
    still = f"; {waiting_msg}" if waiting else ""
    if problems:
        reason, _ = problems[0]
        msg = "; ".join(m for _, m in problems)
        return [
            cond("Ready", T, reason, serving_prefix + msg + still)
            if serving
            else cond("Ready", F, reason, msg + still),
            cond("Degraded", T, reason, msg),
            cond("Stalled", T, reason, msg),
            cond("Progressing", F, reason, msg),
            cond("Reconciling", F, reason, msg),
        ]
    if waiting:
        why = next((r for r, _ in waiting if r), None) or "RollingOut"
        return [
            cond("Ready", T, "RollingOut", serving_prefix + waiting_msg)
            if serving
            else cond("Ready", F, why if why != "RollingOut" else "NotServing", waiting_msg),
            cond("Degraded", F, "AsExpected", ""),
            cond("Stalled", F, "AsExpected", ""),
            cond("Progressing", T, why, waiting_msg),
            cond("Reconciling", T, why, waiting_msg),
        ]
    return [
        cond("Ready", T, *done),
        cond("Degraded", F, "AsExpected", ""),
        cond("Stalled", F, "AsExpected", ""),
        cond("Progressing", F, "Complete", ""),
        cond("Reconciling", F, "Complete", ""),
    ]


def _serving(
    td: TranscriptionDeployment,
    the_plan: Plan,
    pools: list[PoolStatus],
    asleep: list[str],
    frontends_ready: int,
) -> bool:
    """Whether a request of every declared kind would be served now: a ready frontend, and
    for each kind a pool that covers it with a ready replica (old or new), or asleep at
    zero (it wakes on demand; the frontend holds the request meanwhile)."""
    ready = {p.name for p in pools if p.ready_replicas > 0} | set(asleep)
    return frontends_ready > 0 and all(
        any(p.name in ready for p in the_plan.pools if p.capabilities.covers(need))
        for need in traffic_needs(td.spec.traffic.endpoints, td.spec.traffic.features)
    )


def _auto_split(td: TranscriptionDeployment, the_plan: Plan) -> tuple[ConditionStatus, str, str]:
    uncovered = ", ".join(describe(n) for n in the_plan.uncovered)
    if not td.spec.auto_split.enabled:
        return (
            F,
            "Disabled",
            "spec.autoSplit.enabled is false"
            + (f"; no declared pool serves {uncovered} (see Degraded)" if uncovered else ""),
        )
    if the_plan.automatic:
        return (
            T,
            "SequentialPoolAdded",
            "; ".join(
                f"added pool {p.name} ({p.engine.value}, sequential) for "
                + ", ".join(sorted(p.covers))
                + f": {p.spec.replicas} replica{'s' if p.spec.replicas != 1 else ''}, each "
                f"requesting {requests_text(p.spec.resources)}"
                for p in the_plan.automatic
            ),
        )
    if uncovered:
        return F, "NoEngineCovers", f"no engine can serve {uncovered} in sequential mode"
    return F, "NotNeeded", "the declared pools cover the traffic"


def status_events(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events a status change deserves: an added pool (and
    what it requests), a pool's or the frontend's not-ready reason changing, the resource
    becoming Degraded for another reason, or Ready again."""
    out: list[tuple[str, str, str]] = []
    before = {c["type"]: c for c in old.get("conditions", [])}
    after = {c["type"]: c for c in new.get("conditions", [])}

    def changed(type_: str, *keys: str) -> bool:
        a, b = before.get(type_) or {}, after.get(type_) or {}
        return any(a.get(k) != b.get(k) for k in keys)

    auto = after.get("AutoSplit") or {}
    if auto.get("status") == "True" and changed("AutoSplit", "status", "message"):
        out.append(("Normal", auto["reason"], auto["message"]))

    old_reasons = {p["name"]: (p.get("notReady") or {}).get("reason") for p in old.get("pools", [])}
    old_reasons[None] = ((old.get("frontend") or {}).get("notReady") or {}).get("reason")
    pod_reasons = set()
    targets: list[tuple[str | None, str, dict[str, Any]]] = [
        (p["name"], f"pool {p['name']}", p) for p in new.get("pools", [])
    ]
    if new.get("frontend"):
        targets.append((None, "frontend", new["frontend"]))
    for key, what, st in targets:
        nr = st.get("notReady")
        if not nr:
            continue
        pod_reasons.add(nr["reason"])
        if nr["reason"] != old_reasons.get(key):
            text = not_ready_text(NotReady.model_validate(nr))
            kind = "Warning" if is_failing(nr["reason"]) or nr["reason"] in WARN else "Normal"
            out.append((kind, nr["reason"], f"{what}: {text}"))

    routing = routing_events(old.get("gateways", []), new.get("gateways", []), "gateway ")
    # A gateway's routed entries carry the deployment's own Ready reason: not a refusal.
    refused = [e for e in new.get("deployments", []) if not e["routed"]]
    routing += routing_events(old.get("deployments", []), refused, "")
    out += routing
    posted = pod_reasons | {reason for _, reason, _ in routing}
    degraded = after.get("Degraded") or {}
    if (
        degraded.get("status") == "True"
        and changed("Degraded", "status", "reason")
        and degraded.get("reason") not in posted
    ):
        out.append(("Warning", degraded["reason"], degraded["message"]))
    ready = after.get("Ready") or {}
    if ready.get("status") == "True" and "Ready" in before and changed("Ready", "status"):
        out.append(("Normal", "Ready", ready["message"]))
    return out


def routing_events(
    old: list[dict[str, Any]], new: list[dict[str, Any]], what: str
) -> list[tuple[str, str, str]]:
    """A Warning for each new refusal or conflict between a gateway and a deployment (an
    entry of a deployment's status.gateways, `what` "gateway ", or of a gateway's
    status.deployments), once: not again while it says the same."""
    before = {(e["namespace"], e["name"]): e for e in old}
    out = []
    for e in new:
        prev = before.get((e["namespace"], e["name"])) or {}
        said = (prev.get("reason"), prev.get("message"))
        if e["reason"] in REFUSALS and said != (e["reason"], e.get("message")):
            out.append(
                (
                    "Warning",
                    e["reason"],
                    f"{what}{e['namespace']}/{e['name']}: {e.get('message', '')}",
                )
            )
    return out


def status_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The paths that differ between two status bodies, list items named by their `type`
    or `name`: ['conditions[Ready].message', 'pools[cpu].readyReplicas']. What a status
    write changed, for the log."""
    out: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if (
            isinstance(a, list)
            and isinstance(b, list)
            and all(isinstance(x, dict) for x in (*a, *b))
        ):
            a, b = _keyed(a), _keyed(b)
            path += "[]"
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                sub = f"{path[:-2]}[{k}]" if path.endswith("[]") else f"{path}.{k}" if path else k
                walk(a.get(k), b.get(k), sub)
        elif a != b:
            out.append(path)

    walk(old, new, "")
    return out


def _keyed(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {str(x.get("type") or x.get("name") or i): x for i, x in enumerate(items)}


def invalid_spec_status(
    body: dict[str, Any], reason: str, message: str, now: str
) -> TranscriptionDeploymentStatus:
    """Status of a resource whose spec cannot be read (the CRD's rules should prevent it)."""
    generation = int(body["metadata"].get("generation") or 0)
    previous = {}
    for c in (body.get("status") or {}).get("conditions", []):
        try:
            previous[c["type"]] = Condition.model_validate(c)
        except ValueError:
            continue
    return TranscriptionDeploymentStatus(
        observed_generation=generation,
        conditions=[
            make_condition(t, s, reason, message, generation, previous, now)
            for t, s in (("Ready", F), ("Degraded", T), ("Stalled", T))
        ],
    )


def status_body(status: CrdModel) -> dict[str, Any]:
    """A status (of either kind) as the resource stores it."""
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")
