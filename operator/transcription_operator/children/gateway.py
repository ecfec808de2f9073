"""A TranscriptionGateway's children: the frontend of a deployment (the same builders, from
the gateway's own `spec.frontend`), whose routes are the tables of every deployment it
routes to. Its scaler is always on (KEDA asks it about any routed pool that autoscales), so
that its pods do not roll when a deployment behind it starts or stops autoscaling."""

from __future__ import annotations

from transcription_api.routes import RefusedDeployment, Routes
from transcription_api.v1alpha1 import TranscriptionGateway

from ..config import OperatorConfig
from ..names import frontend_name
from ..plan import plan
from ..selection import Selection
from .frontend import frontend_deployment, frontend_service
from .meta import Manifest
from .network import frontend_egress_policy, frontend_network_policy
from .pods import pod_disruption_budget
from .rbac import frontend_rbac
from .routes import gateway_table, routes_configmap
from .scaling import scaler_service


def gateway_routes(gw: TranscriptionGateway, selection: Selection) -> Routes:
    """What the gateway's frontend serves: each routed deployment's table, in routing order,
    and the refused ones, so that a request for one of their names can say why."""
    return Routes(
        deployments=[gateway_table(td, plan(td.spec), gw.namespace) for td in selection.routed],
        refused=[
            RefusedDeployment(
                deployment=v.ref, names=list(v.names), reason=v.reason, message=v.message
            )
            for v in selection.refused
        ],
        max_upload_bytes=gw.spec.frontend.max_upload_bytes,
    )


def build_gateway(
    gw: TranscriptionGateway, cfg: OperatorConfig, selection: Selection
) -> list[Manifest]:
    """Every child the gateway should have, in apply order."""
    out = [
        *frontend_rbac(gw),
        routes_configmap(gw, gateway_routes(gw, selection)),
        frontend_service(gw),
        scaler_service(gw),
        frontend_deployment(gw, cfg, scaler=True),
    ]
    if gw.spec.frontend.replicas > 1:
        out.append(pod_disruption_budget(gw, frontend_name(gw), "frontend", None))
    if gw.spec.network_policy.enabled:
        out.append(frontend_network_policy(gw))
        if gw.spec.network_policy.egress:
            routed = [(td.namespace, td.name) for td in selection.routed]
            out.append(frontend_egress_policy(gw, cfg, routed))
    return out
