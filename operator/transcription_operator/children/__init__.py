"""Desired state: `build(resource) -> manifests` and `build_gateway(gateway) -> manifests`,
pure functions.

Every child carries an owner reference to its resource (so garbage collection removes it
with the resource) and the `app.kubernetes.io/*` labels (`meta`); the operator applies the
list with server-side apply and deletes owned children that are no longer in it. The kinds
of child are registered in the operator's `kinds` module. One module per job: `workers`,
`frontend` (a deployment's own and a gateway's), `gateway` (a gateway's children), `routes`,
`rbac`, `network` (NetworkPolicies), `scaling` (KEDA), `monitoring` (PodMonitor), `tracing`
(OpenTelemetry's variables), `pods` (what every pod shares) and `meta`.
"""

from __future__ import annotations

from collections.abc import Sequence

from transcription_api.v1alpha1 import TranscriptionDeployment

from ..config import OperatorConfig
from ..names import GatewayRef, frontend_name, pool_object_name
from ..plan import Plan, plan
from .frontend import endpoint_url, frontend_deployment, frontend_service
from .gateway import build_gateway, gateway_routes
from .meta import Manifest
from .monitoring import pod_monitor
from .network import (
    frontend_egress_policy,
    frontend_network_policy,
    worker_egress_policy,
    worker_network_policy,
)
from .pods import pod_disruption_budget, resource_requirements
from .rbac import frontend_rbac, gateways_rbac
from .routes import route_table, routes_configmap
from .scaling import autoscaled, scaled_object, scaler_service
from .workers import worker_deployment, worker_service, worker_settings

__all__ = [
    "Manifest",
    "build",
    "build_gateway",
    "endpoint_url",
    "frontend_rbac",
    "gateway_routes",
    "resource_requirements",
    "route_table",
    "worker_settings",
]


def build(
    td: TranscriptionDeployment,
    cfg: OperatorConfig,
    the_plan: Plan | None = None,
    routed_by: Sequence[GatewayRef] = (),
) -> list[Manifest]:
    """Every child the resource should have, in apply order. `routed_by`: the gateways that
    route it (their frontends reach its workers, and scale its pools)."""
    the_plan = the_plan or plan(td.spec)
    own = td.spec.frontend.enabled  # its own frontend; else served through gateways only
    scaler = own and autoscaled(the_plan)
    out: list[Manifest] = []
    if own:
        out += [*frontend_rbac(td), routes_configmap(td, route_table(td, the_plan))]
    out += gateways_rbac(td, routed_by)
    for pool in the_plan.pools:
        out.append(worker_service(td, pool))
    if own:
        out.append(frontend_service(td))
    if scaler:
        out.append(scaler_service(td))
    for pool in the_plan.pools:
        out.append(worker_deployment(td, pool, cfg))
    if own:
        out.append(frontend_deployment(td, cfg, scaler=scaler))
    for pool in the_plan.pools:
        if pool.spec.autoscaling:
            scaled = scaled_object(td, pool, cfg, routed_by)
            out += [scaled] if scaled else []
    for pool in the_plan.pools:
        a = pool.spec.autoscaling
        if (a.max_replicas if a else pool.spec.replicas) > 1:
            out.append(
                pod_disruption_budget(td, pool_object_name(td, pool.name), "worker", pool.name)
            )
    if own and td.spec.frontend.replicas > 1:
        out.append(pod_disruption_budget(td, frontend_name(td), "frontend", None))
    policy = td.spec.network_policy
    if policy.enabled:
        out.append(worker_network_policy(td, routed_by))
        out += [worker_egress_policy(td)] if policy.egress else []
        if own:
            out.append(frontend_network_policy(td))
            if policy.egress:
                out.append(frontend_egress_policy(td, cfg, [(td.namespace, td.name)]))
    if td.spec.monitoring.pod_monitor:
        out.append(pod_monitor(td))
    return out
