"""A small typed layer over the official client's ApiClient: generic REST by kind.

Server-side apply, delete with a UID precondition, status patches and Events, for the few
kinds the operator touches. Every request is counted (operator metrics and the benchmark
report API requests per reconcile).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from transcription_api.v1alpha1 import KIND

from . import metrics
from .config import FIELD_MANAGER
from .kinds import KINDS

log = logging.getLogger("transcription_operator")

# Every request but kopf's watches (which have their own) gives up after this long: an API
# server that stops answering mid-request (restarted, frozen, a connection dropped on the
# way) must fail the reconcile, which then retries, and never hold its key for good.
# Seconds to connect, seconds to read.
REQUEST_TIMEOUT = (5.0, 30.0)


class KubeError(Exception):
    def __init__(self, status: int, reason: str, body: str) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        try:
            self.message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            self.message = body
        super().__init__(f"{status} {reason}: {self.message}")

    @property
    def namespace_terminating(self) -> bool:
        """The namespace is being deleted: the API server refuses anything new in it."""
        try:
            causes = (json.loads(self.body).get("details") or {}).get("causes") or []
        except (ValueError, AttributeError):
            return False
        return self.status == 403 and any(
            c.get("reason") == "NamespaceTerminating" or c.get("type") == "NamespaceTerminating"
            for c in causes
        )


class Kube:
    """Thread-safe; one instance per process."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api = api_client

    @classmethod
    def connect(cls, kubeconfig: str | None = None) -> Kube:
        if kubeconfig:
            cfg = client.Configuration()
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            cfg = client.Configuration()
            try:
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cls(client.ApiClient(cfg))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = None,
    ) -> Any:
        """One REST request; `timeout` (seconds, or (connect, read)) defaults to
        REQUEST_TIMEOUT."""
        metrics.API_REQUESTS.labels(verb=method).inc()
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, _, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        try:
            # The REST client serializes dict bodies itself, for JSON and YAML content types.
            resp = self.api.call_api(
                method,
                url,
                header_params=headers,
                body=body,
                _request_timeout=timeout or REQUEST_TIMEOUT,
            )
        except ApiException as e:
            raise KubeError(e.status or 0, e.reason or "", e.body or "") from e
        raw = resp.read()  # type: ignore[no-untyped-call]
        if resp.status >= 400:
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            raise KubeError(resp.status, resp.reason or "", text)
        return json.loads(raw) if raw else None

    # ------------------------------------------------------------------ verbs

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.request("GET", KINDS[kind].path(namespace, name))
            return obj
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    def list(
        self, kind: str, namespace: str | None, label_selector: str = "", field_selector: str = ""
    ) -> list[dict[str, Any]]:
        """Objects of a kind in one namespace (None: all), with kind and apiVersion set."""
        query = {}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        out = self.request("GET", KINDS[kind].path(namespace), query=query or None)
        items: list[dict[str, Any]] = out.get("items", [])
        for item in items:
            item["kind"], item["apiVersion"] = kind, KINDS[kind].api_version
        return items

    def api_server_endpoints(self) -> tuple[tuple[str, int], ...]:
        """The API server as pods reach it once the `kubernetes` Service is translated: the
        addresses and ports of its EndpointSlices; none when they cannot be read (an
        operator that watches some namespaces only may not)."""
        try:
            slices = self.list("EndpointSlice", "default", "kubernetes.io/service-name=kubernetes")
        except KubeError as e:
            log.warning("the API server's addresses cannot be read (%s): the frontends' egress "
                        "policies admit any address on 443 and 6443", e.reason)  # fmt: skip
            return ()
        return tuple(sorted({
            (address, port["port"])
            for s in slices for port in s.get("ports") or [] if port.get("port")
            for ep in s.get("endpoints") or [] for address in ep.get("addresses") or []
        }))  # fmt: skip

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply under the operator's field manager (forcing conflicts)."""
        meta = manifest["metadata"]
        path = KINDS[manifest["kind"]].path(meta["namespace"], meta["name"])
        obj: dict[str, Any] = self.request(
            "PATCH",
            path,
            body=manifest,
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type="application/apply-patch+yaml",
        )
        return obj

    def delete(self, kind: str, namespace: str, name: str, uid: str | None = None) -> bool:
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", KINDS[kind].path(namespace, name), body=body)
            return True
        except KubeError as e:
            if e.status in (404, 409):
                return False
            raise

    def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], kind: str = KIND
    ) -> dict[str, Any]:
        """Merge-patch a resource's status; returns the object as the server stored it."""
        obj: dict[str, Any] = self.request(
            "PATCH",
            KINDS[kind].path(namespace, name, "status"),
            body={"status": status},
            content_type="application/merge-patch+json",
        )
        return obj

    def event(self, owner: dict[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        meta = owner["metadata"]
        self.request(
            "POST",
            KINDS["Event"].path(meta["namespace"]),
            body={
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "type": type_,
                "reason": reason,
                "message": message[:1024],
                "source": {"component": FIELD_MANAGER},
                "reportingComponent": FIELD_MANAGER,
                "reportingInstance": FIELD_MANAGER,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )
