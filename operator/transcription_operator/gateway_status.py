"""`gateway_status(gateway, selection, observed) -> status`: a pure function, with the
deployment's conventions (`status`): the same five conditions, each with its
`observedGeneration`, read alike by kstatus (Flux), Argo CD's health check and humans.

`Ready` means "a request for every routed model would be served now": a ready frontend,
and every routed deployment Ready by its own status. Each selected deployment's entry says
whether it is routed, and then whether it is ready and why not, in its own Ready
condition's words (which are the cluster's); or why it is refused.
- *failed* (Degraded=Stalled=True): the gateway routes nothing it could (it selects no
  deployment, may not read the namespaces it should look in, has no frontend replica, a
  child cannot be applied, its API key Secret is missing), or a selected deployment is
  refused (NameConflict, NotPermitted, InvalidSpec), or a routed one is Degraded, or the
  frontend's rollout failed. Ready stays True while the routed deployments all serve,
  except for the first kind;
- *progressing*: the frontend rolls out, or a routed deployment is not Ready yet;
- *done*: everything routed is ready.
"""

from __future__ import annotations

from transcription_api.v1alpha1 import (
    ConditionStatus,
    FrontendStatus,
    RoutedDeployment,
    TranscriptionGateway,
    TranscriptionGatewayStatus,
)

from .children import endpoint_url
from .config import OperatorConfig
from .diagnose import parse_time, summarise
from .names import frontend_name
from .selection import Selection, Verdict
from .status import Observed, Progress, health, make_condition, pods_of, rollout

T = ConditionStatus.TRUE
SERVING_ROUTED = "serving every routed deployment; "


def routed_entry(v: Verdict) -> RoutedDeployment:
    """A selected deployment, as the gateway's status lists it."""
    entry = RoutedDeployment(
        namespace=v.namespace,
        name=v.name,
        routed=v.routed,
        ready=False,
        reason=v.reason,
        message=v.message,
        models=list(v.names),
    )
    if not v.routed:
        return entry
    status = v.deployment.status if v.deployment else None
    ready = next((c for c in status.conditions if c.type == "Ready"), None) if status else None
    if ready is None:
        return entry.model_copy(
            update={"reason": "NotReported", "message": "its status is not reported yet"}
        )
    return entry.model_copy(
        update={"ready": ready.status == T, "reason": ready.reason, "message": ready.message}
    )


def _degraded(v: Verdict) -> bool:
    status = v.deployment.status if v.deployment else None
    return bool(status) and any(
        c.type == "Degraded" and c.status == T for c in (status.conditions if status else [])
    )


def gateway_status(
    gw: TranscriptionGateway,
    selection: Selection,
    observed: Observed,
    cfg: OperatorConfig,
    now: str,
) -> TranscriptionGatewayStatus:
    generation = int(gw.metadata.get("generation") or 0)
    previous = {c.type: c for c in (gw.status.conditions if gw.status else [])}

    progress = Progress()
    fe_dep = observed.deployments.get(frontend_name(gw))
    fe = rollout(fe_dep, gw.spec.frontend.replicas)
    fe_nr = None
    if not fe.done:
        pods = pods_of(observed.pods, "frontend", None)
        fe_nr = summarise(fe_dep, pods, observed.events, parse_time(now))
        progress.add("frontend", fe, fe_nr, fe_dep)

    # What keeps the gateway from routing anything it could.
    blocking = list(observed.problems)
    if selection.problem:
        blocking.append(selection.problem)
    elif not selection.verdicts:
        blocking.append(
            (
                "NoDeployments",
                f"spec.selector selects no TranscriptionDeployment in {selection.where}",
            )
        )
    if gw.spec.frontend.replicas == 0:
        blocking.append(
            ("NoCapacity", "spec.frontend.replicas is 0: nothing receives requests; scale it up")
        )
    problems = blocking + [(v.reason, f"{v.ref}: {v.message}") for v in selection.refused]
    entries = [routed_entry(v) for v in selection.verdicts]
    routed = [(v, e) for v, e in zip(selection.verdicts, entries, strict=True) if v.routed]
    for v, e in routed:
        if _degraded(v):
            problems.append(("DeploymentDegraded", f"{v.ref}: {e.reason}: {e.message}"))
        elif not e.ready:
            progress.waiting.append(("DeploymentNotReady", f"{v.ref}: {e.reason}: {e.message}"))
    serving = not blocking and fe.ready > 0 and bool(routed) and all(e.ready for _, e in routed)
    problems += progress.failed

    done = ("Ready", f"{len(routed)} deployment(s) routed and ready, and the frontend")
    return TranscriptionGatewayStatus(
        observed_generation=generation,
        conditions=health(
            lambda t, s, r, m: make_condition(t, s, r, m, generation, previous, now),
            problems,
            serving,
            progress.waiting,
            done,
            SERVING_ROUTED,
        ),
        frontend=FrontendStatus(
            replicas=gw.spec.frontend.replicas, ready_replicas=fe.ready, not_ready=fe_nr
        ),
        deployments=entries,
        routed_deployments=f"{len(routed)}/{len(entries)}",
        endpoint=endpoint_url(gw, cfg),
    )
