"""The reconciler: drift detection, and each decision of one reconcile -- what it applies,
prunes, reports and retries -- against a recording API client (the real one needs a
cluster: e2e/test_operator.py runs the same code against the real API server)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from testkit.operator import World
from testkit.resources import make_gateway
from transcription_api.v1alpha1 import GATEWAY_KIND, KIND
from transcription_operator.cache import Cache
from transcription_operator.kube import KubeError
from transcription_operator.names import MANAGED_BY_LABEL
from transcription_operator.reconciler import RetryLater, dropped_image_volumes, is_subset


def test_fields_the_api_server_adds_are_not_drift() -> None:
    desired = {"spec": {"ports": [{"name": "http", "port": 8000}], "type": "ClusterIP"}}
    live = {"spec": {"ports": [{"name": "http", "port": 8000, "protocol": "TCP"}], "type": "ClusterIP",
                     "clusterIP": "10.0.0.1"}, "status": {}}  # fmt: skip
    assert is_subset(desired, live)


def test_changed_removed_or_added_items_are_drift() -> None:
    desired = {"spec": {"replicas": 2, "env": [{"name": "A", "value": "1"}]}}
    assert not is_subset(desired, {"spec": {"replicas": 5, "env": [{"name": "A", "value": "1"}]}})
    assert not is_subset(desired, {"spec": {"env": [{"name": "A", "value": "1"}]}})
    assert not is_subset(
        desired, {"spec": {"replicas": 2, "env": [{"name": "A", "value": "1"}, {"name": "B"}]}}
    )


def test_scalars_compare_by_value() -> None:
    assert is_subset({"limits": {"nvidia.com/gpu": "1"}}, {"limits": {"nvidia.com/gpu": "1"}})
    assert is_subset({"port": 8000}, {"port": 8000.0})
    assert not is_subset({"enabled": True}, {"enabled": 1})
    assert not is_subset({"a": {"b": 1}}, {"a": "x"})


# --------------------------------------------------------------------------- decisions


SPEC = {"model": {"name": "openai/whisper-large-v3-turbo"},
        "pools": [{"name": "batch", "replicas": 2}, {"name": "words", "engine": "faster-whisper"}]}  # fmt: skip


def applied(writes: list[tuple[str, ...]]) -> list[tuple[str, str]]:
    return [(w[1], w[2]) for w in writes if w[0] == "apply"]


def test_first_reconcile_applies_every_child_once_and_reports() -> None:
    w = World(SPEC)
    result = w.reconcile()
    kinds = [k for k, _ in applied(w.kube.writes)]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Service",
                     "Service", "Deployment", "Deployment", "Deployment", "PodDisruptionBudget",
                     "PodDisruptionBudget", "NetworkPolicy", "NetworkPolicy", "NetworkPolicy",
                     "NetworkPolicy"]  # fmt: skip
    assert w.kube.writes[-1] == ("status", "whisper")
    assert result.outcome == "applied" and result.writes == 17
    assert w.condition("Ready")["status"] == "False"  # nothing rolled out yet


def test_a_steady_state_reconcile_writes_nothing() -> None:
    w = World(SPEC)
    w.reconcile()
    result = w.reconcile()
    assert w.kube.writes == []
    assert (result.outcome, result.writes) == ("unchanged", 0)


def test_a_steady_state_reconcile_of_a_gateway_and_what_it_routes_writes_nothing() -> None:
    w = World(SPEC)
    labelled = copy.deepcopy(w.kube.server.get(KIND, "speech", "whisper"))
    assert labelled is not None
    labelled["metadata"]["labels"] = {"team": "speech"}
    w.observe(labelled)
    w.observe(make_gateway({"selector": {"matchLabels": {"team": "speech"}}}).model_dump(
        by_alias=True, exclude_none=True, mode="json"))  # fmt: skip
    keys = [(GATEWAY_KIND, "speech", "gw"), (KIND, "speech", "whisper")]
    for key in (*keys, *keys):  # the gateway's status copies the deployment's Ready
        w.reconciler.reconcile(*key)
    w.kube.writes.clear()
    results = [w.reconciler.reconcile(*key) for key in keys]
    assert w.kube.writes == []
    assert [(r.outcome, r.writes, r.enqueue) for r in results] == [("unchanged", 0, [])] * 2


def test_only_a_drifted_child_is_applied_again() -> None:
    w = World(SPEC)
    w.reconcile()
    live = w.cache.get("Deployment", "speech", "whisper-batch")
    assert live is not None
    edited = copy.deepcopy(live)
    edited["spec"]["replicas"] = 7  # someone scaled it by hand
    w.cache.put(edited)
    w.reconcile()
    assert w.kube.writes == [("apply", "Deployment", "whisper-batch")]


def test_a_removed_pool_is_pruned_and_foreign_objects_are_kept() -> None:
    w = World(SPEC)
    w.reconcile()
    # Owned by the resource but not labelled as managed (a user's own object): kept.
    foreign = copy.deepcopy(w.kube.objects[("ConfigMap", "whisper-routes")])
    foreign["metadata"].update(name="users-notes", uid="uid-notes")
    del foreign["metadata"]["labels"][MANAGED_BY_LABEL]
    w.cache.put(foreign)
    w.set_spec({**SPEC, "pools": SPEC["pools"][:1]}, generation=4)
    w.reconcile()
    deleted = {(w_[1], w_[2], w_[3]) for w_ in w.kube.writes if w_[0] == "delete"}
    assert deleted == {("Deployment", "whisper-words", "uid-Deployment-whisper-words"),
                       ("Service", "whisper-words", "uid-Service-whisper-words")}  # fmt: skip
    assert w.cache.get("Deployment", "speech", "whisper-words") is None
    assert w.cache.get("ConfigMap", "speech", "users-notes") is not None


def test_a_refused_child_degrades_and_waits_for_a_new_spec() -> None:
    w = World(SPEC)
    w.kube.refuse["whisper-batch"] = KubeError(
        422, "Unprocessable Entity", '{"message": "spec.template.spec.affinity: Invalid value"}'
    )
    result = w.reconcile()  # no RetryLater: only a spec change can fix it
    assert ("Deployment", "whisper-words") in applied(w.kube.writes)  # the others still go on
    degraded = w.condition("Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ApplyFailed"
    assert "whisper-batch: spec.template.spec.affinity: Invalid value" in degraded["message"]
    assert ("Warning", "ApplyFailed") in w.kube.events
    assert result.outcome == "degraded"


OCI = {"model": {"name": "whisper-tiny.en", "source": "oci", "path": "tiny.en",
                 "image": f"registry.example/weights/tiny.en@sha256:{'a' * 64}"},
       "engine": "faster-whisper", "pools": [{"name": "cpu", "mode": "sequential"}]}  # fmt: skip


def test_a_server_that_drops_image_volumes_is_a_status_naming_the_feature() -> None:
    """Kubernetes 1.33-1.34 with the ImageVolume gate off drops the weights volume (and its
    mount) from the Deployment it stores, without an error: pods would start without their
    weights. Status says why instead, and comes back when the server keeps them."""
    w = World(OCI)
    w.kube.server.image_volumes = False
    assert w.reconcile().outcome == "degraded"
    stored = w.kube.objects[("Deployment", "whisper-cpu")]["spec"]["template"]["spec"]
    assert "weights" not in {v["name"] for v in stored["volumes"]}
    degraded = w.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ImageVolumesUnsupported")
    assert degraded["message"].startswith(
        "Deployment whisper-cpu: the API server dropped its image volume weights: this "
        "cluster does not serve image volumes (spec.model.source 'oci'): they need Kubernetes "
        "1.35+, or 1.33-1.34 with the ImageVolume feature gate on"
    ), degraded["message"]
    assert ("Warning", "ImageVolumesUnsupported") in w.kube.events
    w.reconcile()  # the next reconcile applies it again, and says so again
    assert w.condition("Degraded")["reason"] == "ImageVolumesUnsupported"
    w.kube.server.image_volumes = True  # the gate turned on
    w.reconcile()
    assert w.condition("Degraded")["status"] == "False"
    stored = w.kube.objects[("Deployment", "whisper-cpu")]["spec"]["template"]["spec"]
    assert {"name": "weights", "image": {"reference": OCI["model"]["image"]}} in stored["volumes"]


def test_a_server_older_than_the_field_leaves_an_empty_dir_which_is_no_image_volume() -> None:
    def template(*volumes: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"template": {"spec": {"volumes": list(volumes)}}}}

    image = {"name": "weights", "image": {"reference": "r/w:1"}}
    tmp = {"name": "tmp", "emptyDir": {}}
    assert dropped_image_volumes(template(image, tmp), template(image, tmp)) == []
    assert dropped_image_volumes(template(image, tmp), template(tmp)) == ["weights"]
    # Before 1.31 the API server does not know the field: defaulting makes it an emptyDir.
    old = template({"name": "weights", "emptyDir": {}}, tmp)
    assert dropped_image_volumes(template(image, tmp), old) == ["weights"]
    assert dropped_image_volumes(template(tmp), template(tmp)) == []
    assert dropped_image_volumes({"kind": "Service", "spec": {}}, {"spec": {}}) == []


TERMINATING = json.dumps({
    "kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
    "message": 'deployments.apps "whisper-batch" is forbidden: unable to create new content '
               "in namespace speech because it is being terminated",
    "details": {"name": "whisper-batch", "kind": "deployments", "causes": [{
        "reason": "NamespaceTerminating", "field": "metadata.namespace",
        "message": "namespace speech is being terminated"}]},
})  # fmt: skip


def test_a_namespace_being_deleted_gets_no_status_and_no_event() -> None:
    """Its children go first: re-applying one is refused (the API server's cause
    NamespaceTerminating), and the resource follows them; nothing is reported."""
    w = World(SPEC)
    w.kube.refuse["whisper-batch"] = KubeError(403, "Forbidden", TERMINATING)
    assert w.reconcile().outcome == "gone"
    assert ("status", "whisper") not in w.kube.writes and not w.kube.events
    # Any other 403 is a refusal the user must see.
    other = KubeError(403, "Forbidden", '{"message": "forbidden by policy"}')
    assert not other.namespace_terminating
    w.kube.refuse["whisper-batch"] = other
    w.reconcile()
    assert w.condition("Degraded")["reason"] == "ApplyFailed"


def test_a_transient_failure_is_reported_then_retried() -> None:
    w = World(SPEC)
    w.kube.refuse["whisper"] = KubeError(
        500, "Internal Server Error", '{"message": "etcdserver: request timed out"}'
    )
    with pytest.raises(RetryLater, match="etcdserver: request timed out"):
        w.reconcile()
    assert ("status", "whisper") in w.kube.writes  # the user sees it meanwhile
    del w.kube.refuse["whisper"]
    w.reconcile()
    assert applied(w.kube.writes) == [("Service", "whisper")]


def test_a_missing_secret_degrades_and_is_looked_for_again() -> None:
    w = World({**SPEC, "frontend": {"apiKeySecret": {"name": "keys", "key": "k"}}})
    result = w.reconcile()
    assert w.condition("Degraded")["reason"] == "SecretNotFound"
    assert result.requeue_after == 60.0
    w.secret("keys")
    result = w.reconcile()
    assert w.condition("Degraded")["status"] == "False"
    assert result.requeue_after is None
    # Not allowed to look (no rbac.secretNames): the pod will say whether it exists.
    w.secret("keys", present=False)
    w.kube.secret_error = KubeError(403, "Forbidden", "{}")
    assert w.reconcile().requeue_after is None


def test_an_invalid_spec_applies_nothing_and_says_why() -> None:
    w = World(SPEC)
    body = w.cache.get("TranscriptionDeployment", "speech", "whisper")
    assert body is not None
    body["spec"]["pools"] = [{"name": "x"}, {"name": "x"}]  # pool names must be unique
    w.cache.put(body)
    w.reconcile()
    assert w.kube.writes == [("status", "whisper"), ("event", "InvalidSpec")]
    assert w.condition("Ready")["reason"] == "InvalidSpec"


def test_a_deleted_resource_is_left_to_garbage_collection() -> None:
    w = World(SPEC)
    body = w.cache.get("TranscriptionDeployment", "speech", "whisper")
    assert body is not None
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert w.reconcile().outcome == "gone"
    assert w.kube.writes == []


def test_the_automatic_split_is_announced_once() -> None:
    w = World({"model": {"name": "m"}, "traffic": {"features": ["word_timestamps"]}})
    w.reconcile()
    assert ("Normal", "SequentialPoolAdded") in w.kube.events
    assert ("Deployment", "whisper-auto-faster-whisper") in applied(w.kube.writes)
    w.kube.events.clear()
    w.reconcile()
    assert w.kube.events == []


def test_pods_and_their_events_are_indexed_by_resource() -> None:
    import json
    from pathlib import Path

    from transcription_operator.cache import Pods

    doc = json.loads(
        (Path(__file__).parent / "fixtures" / "pods" / "startup-probe.json").read_text()
    )
    pod, events = doc["pod"], doc["events"]
    pods = Pods()
    other = {**events[0], "involvedObject": {"kind": "Pod", "uid": "someone-else"}}
    assert pods.put_event(other) is None  # another pod's Event is not kept
    assert pods.put(pod) == ("speech", "whisper")
    assert pods.put_event(events[0]) == ("speech", "whisper")
    [kept] = pods.of("speech", "whisper")
    # Only what status reads is kept: no env, no volumes, no managedFields.
    assert "env" not in kept["spec"]["containers"][0]
    assert kept["spec"]["containers"][0]["startupProbe"]["failureThreshold"] == 180
    [event] = pods.events([kept])[pod["metadata"]["uid"]]
    assert (event["reason"], event["message"], event["count"]) == (
        "Unhealthy", events[0]["message"], 41,
    )  # fmt: skip
    assert "uid" not in event["metadata"] and "apiVersion" not in event
    assert pods.counts() == (1, 1)
    assert pods.put_event(events[0], deleted=True) == ("speech", "whisper")
    assert pods.counts() == (1, 0)
    pods.put_event(events[0])
    assert pods.drop(pod) == ("speech", "whisper")  # its Events go with it
    assert pods.of("speech", "whisper") == [] and pods.counts() == (0, 0)
    unlabelled = {**pod, "metadata": {**pod["metadata"], "labels": {}}}
    assert pods.put(unlabelled) is None


def test_the_cache_never_goes_back_to_an_older_version() -> None:

    cache = Cache()

    def obj(rv: str, uid: str = "u1", status: str = "") -> dict[str, object]:
        meta = {"namespace": "ns", "name": "a", "uid": uid, "resourceVersion": rv}
        return {"kind": "TranscriptionDeployment", "metadata": meta, "status": status}

    cache.put(obj("120", status="written by us"))
    cache.put(obj("119", status="a late watch event"))  # older: ignored
    assert cache.get("TranscriptionDeployment", "ns", "a")["status"] == "written by us"
    cache.put(obj("121", status="newer"))
    assert cache.get("TranscriptionDeployment", "ns", "a")["status"] == "newer"
    cache.put(obj("5", uid="u2", status="recreated"))  # another object of that name: taken
    assert cache.get("TranscriptionDeployment", "ns", "a")["status"] == "recreated"


def test_a_relist_forgets_what_was_deleted_while_the_watch_was_away() -> None:
    """As an informer's relist: the listing is the truth, except for what the watches
    stored or dropped after the listing began (they are newer)."""

    cache = Cache()

    def svc(name: str, rv: str, ns: str = "ns") -> dict[str, Any]:
        meta = {"namespace": ns, "name": name, "uid": f"u-{name}", "resourceVersion": rv}
        return {"kind": "Service", "metadata": meta}

    for o in (svc("kept", "1"), svc("gone", "2"), svc("changed", "3"), svc("other-ns", "4", "b")):
        cache.put(o)
    mark = cache.mark()
    cache.put(svc("new-on-watch", "9"))  # arrived while the list was in flight
    changed = cache.replace("Service", "ns", [svc("kept", "1"), svc("changed", "7")], mark)
    assert sorted(o["metadata"]["name"] for o in changed) == ["changed", "gone"]
    assert cache.get("Service", "ns", "gone") is None
    assert cache.get("Service", "ns", "changed")["metadata"]["resourceVersion"] == "7"
    assert cache.get("Service", "ns", "new-on-watch") is not None  # newer than the list
    assert cache.get("Service", "b", "other-ns") is not None  # another namespace's listing
    # A deletion seen on the watch after the listing began is not undone by it.
    mark = cache.mark()
    cache.drop("Service", "ns", "kept")
    listed = [svc("kept", "1"), svc("changed", "7"), svc("new-on-watch", "9")]
    assert cache.replace("Service", "ns", listed, mark) == []
    assert cache.get("Service", "ns", "kept") is None
    # Listing every namespace (None) reaches all of them.
    mark = cache.mark()
    changed = cache.replace("Service", None, [], mark)
    assert sorted(o["metadata"]["name"] for o in changed) == ["changed", "new-on-watch", "other-ns"]
    assert cache.count("Service") == 0
