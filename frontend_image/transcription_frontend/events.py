"""Kubernetes Events about the frontend's own pod: what makes it not ready, in words the
operator puts into the resource's status.

A readiness probe that fails says only its status code ("HTTP probe failed with statuscode:
503"), not why. When the gateway cannot serve for a reason of its own (an API key file that
is missing, unreadable or empty: auth.py), it says so in a Warning Event about its pod, as
the kubelet and the scheduler do for theirs; the operator reads Warning Events of its pods
(its diagnosis of pods) and names the reason, `APIKeysUnavailable`, in the resource's conditions.

The pod is named by the downward API (`POD_NAME`, `POD_NAMESPACE`, `POD_UID`); without them
(a local run) nothing is posted.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("transcription_frontend.events")

COMPONENT = "transcription-frontend"
KEYS_UNAVAILABLE = "APIKeysUnavailable"
# Keys whose `group=` names no declared tenant (tenants.py): those keys get 403, the pod
# stays ready.
UNKNOWN_TENANT = "APIKeyUnknownTenant"


def event_body(reason: str, message: str, pod: str, namespace: str, uid: str,
               now: datetime) -> dict[str, Any]:  # fmt: skip
    """A core/v1 Warning Event about the pod."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod,
            "namespace": namespace,
            "uid": uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": pod,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class PodEvents:
    """Posts Warning Events about this pod, from a thread (the client blocks)."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        self.pod = os.environ.get("POD_NAME", "")
        self.namespace = os.environ.get("POD_NAMESPACE", "")
        self.uid = os.environ.get("POD_UID", "")
        self.kubeconfig = kubeconfig

    @property
    def enabled(self) -> bool:
        return bool(self.pod and self.namespace and self.uid)

    def warn(self, reason: str, message: str) -> None:
        if self.enabled:
            body = event_body(reason, message, self.pod, self.namespace, self.uid,
                              datetime.now(UTC))  # fmt: skip
            threading.Thread(target=self._post, args=(body,), daemon=True).start()

    def _post(self, body: dict[str, Any]) -> None:
        from kubernetes import client, config

        try:
            if self.kubeconfig:
                config.load_kube_config(config_file=self.kubeconfig)  # type: ignore[no-untyped-call]
            else:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            client.CoreV1Api().create_namespaced_event(self.namespace, body)  # type: ignore[arg-type]
        except Exception as e:  # an Event is best effort: the log line says the same
            log.warning("could not post the %s Event about pod %s: %s", body["reason"],
                        self.pod, e)  # fmt: skip
