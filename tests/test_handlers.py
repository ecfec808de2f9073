"""kopf wiring: the watch streams status reads are filtered by the API server."""

from __future__ import annotations

import kopf
from kopf._cogs.structs.references import Resource

from transcription_operator import handlers


def test_pods_and_events_are_filtered_server_side() -> None:
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    pods = Resource("", "v1", "pods", kind="Pod", namespaced=True)
    events = Resource("", "v1", "events", kind="Event", namespaced=True)
    deployments = Resource("apps", "v1", "deployments", kind="Deployment", namespaced=True)
    # Only the operator's own pods, and only Warning Events about pods, leave the API server.
    assert settings.watching.label_selectors.collect(pods) == [
        "app.kubernetes.io/managed-by=transcription-operator"
    ]
    assert settings.watching.field_selectors.collect(events) == [
        "involvedObject.kind=Pod,type=Warning"
    ]
    assert settings.watching.label_selectors.collect(deployments) == []
    assert settings.watching.field_selectors.collect(pods) == []
