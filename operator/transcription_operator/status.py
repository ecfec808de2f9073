"""`status(resource, observed) -> status`: a pure function.

Conditions follow two conventions at once so that every GitOps tool reads health without
custom scripts:
- `Ready`, `Progressing`, `Degraded` (Deployment-like; Argo CD and humans), and
- `Reconciling`, `Stalled` (kstatus "abnormal-true" conditions, which Flux and kpt use),
plus `AutoSplit`, which says whether the operator added sequential pools and why.
Each condition carries `observedGeneration`; `lastTransitionTime` only moves when the
status of the condition changes, so a steady resource gets an identical status and the
operator writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transcription_api.v1alpha1 import (
    Condition,
    ConditionStatus,
    PoolStatus,
    TranscriptionDeployment,
    TranscriptionDeploymentStatus,
)

from .children import endpoint_url
from .config import OperatorConfig
from .names import frontend_name, pool_object_name
from .plan import Plan, describe

T, F = ConditionStatus.TRUE, ConditionStatus.FALSE


@dataclass
class Observed:
    """What the operator saw of a resource's children, and problems it found."""

    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> object
    problems: list[tuple[str, str]] = field(default_factory=list)  # (reason, message)


@dataclass(frozen=True)
class Rollout:
    desired: int
    ready: int
    done: bool  # the controller has rolled out the current template to every replica


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
    return Rollout(desired, ready, done)


def _condition(
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


def compute_status(
    td: TranscriptionDeployment,
    the_plan: Plan,
    observed: Observed,
    cfg: OperatorConfig,
    now: str,
) -> TranscriptionDeploymentStatus:
    generation = int(td.metadata.get("generation") or 0)
    previous = {c.type: c for c in (td.status.conditions if td.status else [])}

    pools: list[PoolStatus] = []
    waiting: list[str] = []
    ready_pools = 0
    for p in the_plan.pools:
        name = pool_object_name(td, p.name)
        r = rollout(observed.deployments.get(name), p.spec.replicas)
        pools.append(
            PoolStatus(
                name=p.name,
                engine=p.engine,
                mode=p.mode,
                replicas=p.spec.replicas,
                ready_replicas=r.ready,
                capabilities=sorted(p.capabilities.capabilities),
                automatic=p.automatic,
                reason=p.reason,
                service=name,
            )
        )
        if r.done:
            ready_pools += 1
        else:
            waiting.append(f"pool {p.name} {r.ready}/{r.desired} ready")
    fe = rollout(observed.deployments.get(frontend_name(td)), td.spec.frontend.replicas)
    if not fe.done:
        waiting.append(f"frontend {fe.ready}/{fe.desired} ready")

    problems = list(observed.problems)
    for need in the_plan.uncovered:
        missing = f"no pool can serve {describe(need)}: missing " + ", ".join(sorted(need))
        if td.spec.auto_split.enabled:
            family = td.spec.model.family.value
            hint = f" in every pool, and no engine serves it for model family {family}"
        else:
            hint = " in every pool; add a pool whose engine serves it or enable autoSplit"
        problems.append(("TrafficNotCovered", missing + hint))
    # Serving needs at least one ready replica of a pool and of the frontend.
    serving = fe.ready > 0 and any(p.ready_replicas > 0 for p in pools)

    def cond(type_: str, status: ConditionStatus, reason: str, message: str) -> Condition:
        return _condition(type_, status, reason, message, generation, previous, now)

    conditions: list[Condition] = []
    if problems:
        reason, _ = problems[0]
        msg = "; ".join(m for _, m in problems)
        conditions += [
            cond("Ready", F, reason, msg),
            cond("Degraded", T, reason, msg),
            cond("Stalled", T, reason, msg),
        ]
    elif waiting:
        msg = "waiting for " + ", ".join(waiting)
        conditions += [
            cond("Ready", F, "RollingOut" if serving else "NotServing", msg),
            cond("Degraded", F, "AsExpected", ""),
            cond("Stalled", F, "AsExpected", ""),
        ]
    else:
        conditions += [
            cond("Ready", T, "Ready", f"{ready_pools} pool(s) and the frontend are ready"),
            cond("Degraded", F, "AsExpected", ""),
            cond("Stalled", F, "AsExpected", ""),
        ]
    if waiting and not problems:
        msg = "waiting for " + ", ".join(waiting)
        conditions += [
            cond("Progressing", T, "RollingOut", msg),
            cond("Reconciling", T, "RollingOut", msg),
        ]
    else:
        conditions += [
            cond("Progressing", F, "Complete" if not problems else "Failed", ""),
            cond("Reconciling", F, "Complete" if not problems else "Failed", ""),
        ]
    auto = the_plan.automatic
    if auto:
        conditions.append(
            cond(
                "AutoSplit",
                T,
                "SequentialPoolAdded",
                "; ".join(
                    f"added pool {p.name} ({p.engine.value}, sequential) for "
                    + ", ".join(sorted(p.covers))
                    for p in auto
                ),
            )
        )
    else:
        conditions.append(cond("AutoSplit", F, "NotNeeded", "the declared pools cover the traffic"))

    return TranscriptionDeploymentStatus(
        observed_generation=generation,
        conditions=conditions,
        pools=pools,
        ready_pools=f"{ready_pools}/{len(the_plan.pools)}",
        endpoint=endpoint_url(td, cfg),
        models=td.spec.model.served_names,
    )


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
            _condition(t, s, reason, message, generation, previous, now)
            for t, s in (("Ready", F), ("Degraded", T), ("Stalled", T))
        ],
    )


def status_body(status: TranscriptionDeploymentStatus) -> dict[str, Any]:
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")
