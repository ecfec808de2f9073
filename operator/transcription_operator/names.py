"""Names and labels of everything the operator creates, in one place.

Children are named after their resource (`<name>-<pool>`, `<name>-frontend`, ...) and carry
the `app.kubernetes.io/*` labels; `managed-by` marks what the operator watches and prunes,
`instance` which resource a child belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

APP = "transcription"
PART_OF = "transcription-operator"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
PART_OF_LABEL = "app.kubernetes.io/part-of"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
POOL_LABEL = "transcription.dev/pool"
# On worker pods only (not in any selector): the pool's engine, for metrics' `engine` label.
ENGINE_LABEL = "transcription.dev/engine"
# Selects every object the operator manages (its watches and its start-up listing).
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={PART_OF}"
# The label every namespace carries (Kubernetes sets it): NetworkPolicies select by it.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


class Named(Protocol):
    """A resource, of either kind, or a reference to one: its children are named after it."""

    @property
    def name(self) -> str: ...


@dataclass(frozen=True, order=True)
class GatewayRef:
    """A TranscriptionGateway, by namespace and name (what a deployment it routes knows)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def qualified_pool_name(namespace: str, deployment: str, pool: str, gateway_namespace: str) -> str:
    """A pool's name in a gateway's routes: `<deployment>/<pool>` in the gateway's own
    namespace, `<namespace>/<deployment>/<pool>` in another (unique across its tables; the
    name KEDA's trigger asks the gateway's scaler about)."""
    own = namespace == gateway_namespace
    return f"{deployment}/{pool}" if own else f"{namespace}/{deployment}/{pool}"


def pool_object_name(td: Named, pool: str) -> str:
    return f"{td.name}-{pool}"


def frontend_name(td: Named) -> str:
    return f"{td.name}-frontend"


def routes_name(td: Named) -> str:
    return f"{td.name}-routes"


def frontend_service_name(td: Named) -> str:
    """The Service clients use: named after the resource itself."""
    return td.name


def scaler_service_name(td: Named) -> str:
    """The frontend's KEDA scaler endpoint (cluster-internal)."""
    return f"{td.name}-scaler"


def network_policy_name(td: Named) -> str:
    return f"{td.name}-workers"


def gateways_rbac_name(td: Named) -> str:
    """The Role and RoleBinding that let gateways of other namespaces read the deployment's
    EndpointSlices."""
    return f"{td.name}-gateways"


def labels(td: Named, component: str, pool: str | None = None) -> dict[str, str]:
    out = {
        NAME_LABEL: APP,
        INSTANCE_LABEL: td.name,
        COMPONENT_LABEL: component,
        PART_OF_LABEL: PART_OF,
        MANAGED_BY_LABEL: PART_OF,
    }
    if pool:
        out[POOL_LABEL] = pool
    return out


def selector(td: Named, component: str, pool: str | None = None) -> dict[str, str]:
    out = {INSTANCE_LABEL: td.name, COMPONENT_LABEL: component}
    if pool:
        out[POOL_LABEL] = pool
    return out
