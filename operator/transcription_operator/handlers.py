"""kopf wiring: thin handlers that feed the watch caches and the work queue (`manager.py`).

kopf is used for what it does well -- watching, login, liveness, graceful shutdown -- and
only through *event* handlers, which kopf keeps no bookkeeping for: no annotations, no
finalizers, no status fields are written by kopf (GitOps tools see no drift). Every event
of a resource (a TranscriptionDeployment or a TranscriptionGateway) or of one of its
children records the object and enqueues the resource; a deployment's also enqueues the
gateways, a gateway's the deployments it selected before and after; the manager's workers
reconcile them.

Importing this module registers the handlers with kopf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from transcription_api.v1alpha1 import (
    API_VERSION,
    GATEWAY_KIND,
    GATEWAY_PLURAL,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
)

from . import manager
from .cache import EVENT_SELECTOR, POD_SELECTOR, owner_of
from .kinds import CHILDREN, NAMESPACE, Kind
from .kube import Kube
from .names import MANAGED_BY_LABEL, PART_OF


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings, each chosen on purpose."""
    # Event handlers only: kopf stores nothing on our objects. Should a change handler
    # ever be added, its bookkeeping goes to status.kopf, never to annotations.
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(field="status.kopf.diffbase")
    # Handler log lines must not become Kubernetes Events (each one a write): we post the
    # Events users need ourselves.
    settings.posting.enabled = False
    # No kopf peering objects: replicas coordinate through a Lease (`leader.py`), the
    # Kubernetes standard, and a single replica needs none.
    settings.peering.standalone = True
    # Watches are restarted by the server every 5 minutes at most; reconnect quickly.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.reconnect_backoff = 1.0
    # A request (a watch's listing included) retries for about 3 minutes before it gives up:
    # an API-server restart (a 60 s graceful shutdown, then the start) must not exhaust the
    # retries, since a 5xx that escalates ends kopf's watch-stream and the operator with it.
    settings.networking.error_backoffs = [1, 2, 5] + [10] * 18
    # Named namespaces (the chart's watchNamespaces): kopf would otherwise list every
    # namespace to match them, which a namespaced operator may not (403 at each start).
    settings.scanning.disabled = not manager.RUNTIME.scope.cluster_wide
    # Only our pods, and only Warning Events about pods, leave the API server.
    settings.watching.label_selectors["v1", "pods"] = POD_SELECTOR
    settings.watching.field_selectors["v1", "events"] = EVENT_SELECTOR


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The same credentials as our own client: --kubeconfig, else in-cluster, else default."""
    if not manager.RUNTIME.kubeconfig:
        return kopf.login_via_client(**kwargs)
    cfg = Kube.connect(manager.RUNTIME.kubeconfig).api.configuration
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        token=_token(cfg),
    )


def _token(cfg: Any) -> str | None:
    """The bearer token of a client configuration, if it has one."""
    # The client keeps a token as "Bearer <token>" under "BearerToken" (older releases:
    # "authorization"), with or without an api_key_prefix.
    token = None
    for key, value in (cfg.api_key or {}).items():
        prefix = (cfg.api_key_prefix or {}).get(key, "")
        token = f"{prefix} {value}".strip().removeprefix("Bearer ").strip() or None
    return token


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    configure(settings)
    await manager.start()


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    await manager.stop()


@kopf.on.probe(id="queue_depth")
def queue_depth(**_: Any) -> int:
    return manager.queue_depth()


# The event handlers are coroutines: kopf runs them on its event loop, where the work
# queue lives (a plain function would run in a thread, and asyncio's queue is not
# thread-safe). Each only records the object and queues a key.
@kopf.on.event(GROUP, VERSION, PLURAL)
async def resource_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    rt = manager.RUNTIME
    obj, news = rt.remember(KIND, API_VERSION, event.get("type"), body)
    if news:
        rt.enqueue((KIND, obj["metadata"]["namespace"], obj["metadata"]["name"]), KIND)
        rt.enqueue_gateways(KIND)  # any may route it: their routes and status follow


@kopf.on.event(GROUP, VERSION, GATEWAY_PLURAL)
async def gateway_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    rt = manager.RUNTIME
    meta = body["metadata"]
    before = rt.selected_by(rt.cache.get(GATEWAY_KIND, meta["namespace"], meta["name"]))
    obj, news = rt.remember(GATEWAY_KIND, API_VERSION, event.get("type"), body)
    if not news:
        return
    rt.enqueue((GATEWAY_KIND, meta["namespace"], meta["name"]), GATEWAY_KIND)
    after = set() if event.get("type") == "DELETED" else rt.selected_by(obj)
    for key in sorted(before | after):  # their status names the gateway, or did
        rt.enqueue(key, GATEWAY_KIND)


async def namespace_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    """A namespace's labels: what gateways that select namespaces by label look at."""
    _, news = manager.RUNTIME.remember(NAMESPACE.kind, "v1", event.get("type"), body)
    if news:
        manager.RUNTIME.enqueue_gateways(NAMESPACE.kind)


def watch_namespaces() -> None:
    """Register the namespaces' watch: only for an operator that reads every namespace (all
    of them, or a pattern's; one that watches named namespaces may not, and does not)."""
    kopf.on.event("", "v1", NAMESPACE.plural, id="watch-namespaces")(namespace_event)


def child_seen(kind: Kind, event_type: str | None, body: Mapping[str, Any]) -> None:
    """A child's watch event: record it, and enqueue its resource if it is news."""
    obj, news = manager.RUNTIME.remember(kind.kind, kind.api_version, event_type, body)
    owner = owner_of(obj)
    if owner and news:
        manager.RUNTIME.enqueue(owner, kind.kind)


def _register_child(kind: Kind) -> None:
    group, _, version = kind.api_version.rpartition("/")
    plural = kind.plural

    async def child_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        child_seen(kind, event.get("type"), body)

    child_event.__name__ = f"{kind.kind.lower()}_event"
    kopf.on.event(
        group,
        version,
        plural,
        labels={MANAGED_BY_LABEL: PART_OF},
        id=f"watch-{plural}",
    )(child_event)


for _kind in CHILDREN:
    _register_child(_kind)


@kopf.on.event("", "v1", "pods", labels={MANAGED_BY_LABEL: PART_OF}, id="watch-pods")
async def pod_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    key = manager.RUNTIME.remember_pod(dict(body), deleted=event.get("type") == "DELETED")
    if key:
        manager.RUNTIME.enqueue_instance(key, "Pod")


@kopf.on.event("", "v1", "events", id="watch-pod-events")
async def pod_warning_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    obj = dict(body)
    if obj.get("type") != "Warning" or (obj.get("involvedObject") or {}).get("kind") != "Pod":
        return  # the field selector already keeps these out; a list without it might not
    key = manager.RUNTIME.remember_pod_event(obj, deleted=event.get("type") == "DELETED")
    if key:
        manager.RUNTIME.enqueue_instance(key, "Event")
