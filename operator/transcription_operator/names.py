"""Names and labels of everything the operator creates, in one place.

Children are named after their resource (`<name>-<pool>`, `<name>-frontend`, ...) and carry
the `app.kubernetes.io/*` labels; `managed-by` marks what the operator watches and prunes,
`instance` which resource a child belongs to.
"""

from __future__ import annotations

from transcription_api.v1alpha1 import TranscriptionDeployment

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


def pool_object_name(td: TranscriptionDeployment, pool: str) -> str:
    return f"{td.name}-{pool}"


def frontend_name(td: TranscriptionDeployment) -> str:
    return f"{td.name}-frontend"


def routes_name(td: TranscriptionDeployment) -> str:
    return f"{td.name}-routes"


def frontend_service_name(td: TranscriptionDeployment) -> str:
    """The Service clients use: named after the resource itself."""
    return td.name


def scaler_service_name(td: TranscriptionDeployment) -> str:
    """The frontend's KEDA scaler endpoint (cluster-internal)."""
    return f"{td.name}-scaler"


def network_policy_name(td: TranscriptionDeployment) -> str:
    return f"{td.name}-workers"


def labels(td: TranscriptionDeployment, component: str, pool: str | None = None) -> dict[str, str]:
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


def selector(
    td: TranscriptionDeployment, component: str, pool: str | None = None
) -> dict[str, str]:
    out = {INSTANCE_LABEL: td.name, COMPONENT_LABEL: component}
    if pool:
        out[POOL_LABEL] = pool
    return out
