"""Desired state: `build(resource) -> manifests`, a pure function.

Every child carries an owner reference to the resource (so garbage collection removes it
with the resource) and the `app.kubernetes.io/*` labels (`meta`); the operator applies the
list with server-side apply and deletes owned children that are no longer in it. The kinds
of child are registered in the operator's `kinds` module. One module per job: `workers`,
`frontend`, `routes`, `rbac`, `network` (NetworkPolicies), `scaling` (KEDA), `monitoring`
(PodMonitor), `tracing` (OpenTelemetry's variables), `pods` (what every pod shares) and
`meta`.
"""

from __future__ import annotations

from transcription_api.v1alpha1 import TranscriptionDeployment

from ..config import OperatorConfig
from ..names import frontend_name, pool_object_name
from ..plan import Plan, plan
from .frontend import endpoint_url, frontend_deployment, frontend_service
from .meta import Manifest
from .monitoring import pod_monitor
from .network import frontend_network_policy, worker_network_policy
from .pods import pod_disruption_budget, resource_requirements
from .rbac import frontend_rbac
from .routes import route_table, routes_configmap
from .scaling import autoscaled, scaled_object, scaler_service
from .workers import worker_deployment, worker_service, worker_settings

__all__ = [
    "Manifest",
    "build",
    "endpoint_url",
    "frontend_rbac",
    "resource_requirements",
    "route_table",
    "worker_settings",
]


def build(
    td: TranscriptionDeployment, cfg: OperatorConfig, the_plan: Plan | None = None
) -> list[Manifest]:
    """Every child the resource should have, in apply order."""
    the_plan = the_plan or plan(td.spec)
    out: list[Manifest] = [*frontend_rbac(td), routes_configmap(td, route_table(td, the_plan))]
    for pool in the_plan.pools:
        out.append(worker_service(td, pool))
    out.append(frontend_service(td))
    if autoscaled(the_plan):
        out.append(scaler_service(td))
    for pool in the_plan.pools:
        out.append(worker_deployment(td, pool, cfg))
    out.append(frontend_deployment(td, cfg, scaler=autoscaled(the_plan)))
    for pool in the_plan.pools:
        if pool.spec.autoscaling:
            out.append(scaled_object(td, pool, cfg))
    for pool in the_plan.pools:
        a = pool.spec.autoscaling
        if (a.max_replicas if a else pool.spec.replicas) > 1:
            out.append(
                pod_disruption_budget(td, pool_object_name(td, pool.name), "worker", pool.name)
            )
    if td.spec.frontend.replicas > 1:
        out.append(pod_disruption_budget(td, frontend_name(td), "frontend", None))
    if td.spec.network_policy.enabled:
        out.append(worker_network_policy(td))
        out.append(frontend_network_policy(td))
    if td.spec.monitoring.pod_monitor:
        out.append(pod_monitor(td))
    return out
