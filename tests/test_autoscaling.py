"""Per-pool autoscaling: the API, the children it adds (a KEDA ScaledObject, the frontend's
scaler endpoint), and what status says at zero or without KEDA."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from testkit.operator import World, conditions, deployment, run
from testkit.resources import make_td
from transcription_api.capabilities import Engine, Mode
from transcription_api.engines import capability_set
from transcription_api.frontend import FrontendSettings
from transcription_operator.children import build
from transcription_operator.config import OperatorConfig

SCALED = {
    "model": {"name": "openai/whisper-large-v3-turbo"},
    "pools": [
        {"name": "batch", "resources": {"gpus": 1},
         "autoscaling": {"minReplicas": 0, "maxReplicas": 4, "scaleDownDelay": "2m"}},
        {"name": "fixed", "replicas": 2},
    ],
}  # fmt: skip


def children(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in build(make_td(spec), OperatorConfig())}


def test_an_autoscaled_pool_gets_a_scaled_object_and_leaves_replicas_to_it() -> None:
    out = children(SCALED)
    dep = out[("Deployment", "whisper-batch")]
    assert "replicas" not in dep["spec"]  # owned by KEDA's HPA, never by the operator
    assert out[("Deployment", "whisper-fixed")]["spec"]["replicas"] == 2
    so = out[("ScaledObject", "whisper-batch")]
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert so["metadata"]["ownerReferences"][0]["kind"] == "TranscriptionDeployment"
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"name": "whisper-batch"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (0, 4, 120)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 120
    (trigger,) = spec["triggers"]
    default = capability_set(Engine.VLLM, Mode.CONTINUOUS)
    assert default is not None
    assert trigger == {
        "type": "external-push",
        "metadata": {
            "scalerAddress": "whisper-scaler.speech.svc.cluster.local:9090",
            "pool": "batch",
            "targetQueueSeconds": "10",
            "audioSecondsPerReplica": f"{default.audio_seconds_per_replica:g}",
        },
    }
    assert ("ScaledObject", "whisper-fixed") not in out
    # A PodDisruptionBudget once the pool can have more than one replica.
    assert ("PodDisruptionBudget", "whisper-batch") in out


def test_the_frontend_serves_the_scaler_on_an_internal_service() -> None:
    out = children(SCALED)
    svc = out[("Service", "whisper-scaler")]
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "scaler", "port": 9090, "targetPort": "scaler"}]
    fe = out[("Deployment", "whisper-frontend")]["spec"]["template"]["spec"]["containers"][0]
    settings = FrontendSettings.model_validate_json(fe["env"][0]["value"])
    assert (settings.scaler_port, settings.peers_service) == (9090, "whisper")
    assert {"name": "scaler", "containerPort": 9090, "protocol": "TCP"} in fe["ports"]
    # Without autoscaled pools, none of it.
    plain = children({"model": {"name": "m"}})
    assert ("Service", "whisper-scaler") not in plain
    container = plain[("Deployment", "whisper-frontend")]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert FrontendSettings.model_validate_json(container["env"][0]["value"]).peers_service is None
    assert [p["name"] for p in container["ports"]] == ["http"]


def test_the_target_and_rate_can_be_set_and_sequential_pools_default_to_half_the_rate() -> None:
    spec = {"model": {"name": "m"}, "engine": "faster-whisper",
            "pools": [{"name": "cpu", "autoscaling": {"maxReplicas": 3, "targetQueueSeconds": 2.5,
                                                      "audioSecondsPerReplica": 40}},
                      {"name": "seq", "mode": "sequential", "autoscaling": {"maxReplicas": 3}}]}  # fmt: skip
    out = children(spec)
    metadata = out[("ScaledObject", "whisper-cpu")]["spec"]["triggers"][0]["metadata"]
    assert (metadata["targetQueueSeconds"], metadata["audioSecondsPerReplica"]) == ("2.5", "40")
    seq = out[("ScaledObject", "whisper-seq")]["spec"]
    metadata = seq["triggers"][0]["metadata"]
    # faster-whisper's 4 s of audio a second, halved one request at a time; 10 s of work.
    assert (metadata["targetQueueSeconds"], metadata["audioSecondsPerReplica"]) == ("10", "2")
    assert (seq["minReplicaCount"], seq["cooldownPeriod"]) == (1, 300)  # the defaults


def test_an_earlier_releases_request_target_is_accepted_and_ignored() -> None:
    """Pools scale on audio alone; `target` (requests per replica) still applies, so that
    resources written for earlier releases, and objects stored with it, keep working."""
    spec = {"model": {"name": "m"},
            "pools": [{"name": "batch", "autoscaling": {"maxReplicas": 3, "target": 1.5}}]}  # fmt: skip
    (trigger,) = children(spec)[("ScaledObject", "whisper-batch")]["spec"]["triggers"]
    assert "target" not in trigger["metadata"]
    assert trigger["metadata"]["targetQueueSeconds"] == "10"


@pytest.mark.parametrize(
    ("autoscaling", "message"),
    [
        ({"minReplicas": 3, "maxReplicas": 2}, "minReplicas must not exceed maxReplicas"),
        ({"maxReplicas": 0}, "greater than or equal to 1"),
        ({"maxReplicas": 2, "scaleDownDelay": "5 minutes"}, "should match pattern"),
        ({"maxReplicas": 2, "targetQueueSeconds": 0}, "greater than 0"),
        ({"maxReplicas": 2, "audioSecondsPerReplica": -1}, "greater than 0"),
    ],
)
def test_bad_autoscaling_is_refused_with_its_reason(
    autoscaling: dict[str, Any], message: str
) -> None:
    spec = {"model": {"name": "m"}, "pools": [{"name": "a", "autoscaling": autoscaling}]}
    with pytest.raises(ValidationError, match=message):
        make_td(spec)


def test_a_pool_at_zero_that_wakes_on_demand_is_ready_as_scaled_to_zero() -> None:
    td = make_td(SCALED)
    st = run(td, [deployment("whisper-batch", 0, 0), deployment("whisper-fixed", 2, 2),
                  deployment("whisper-frontend", 2, 2)])  # fmt: skip
    assert conditions(st)["Ready"] == ("True", "ScaledToZero")
    ready = next(c for c in st.conditions if c.type == "Ready")
    assert "pool batch scaled to zero, woken by the first request" in ready.message
    batch = next(p for p in st.pools if p.name == "batch")
    assert (batch.replicas, batch.ready_replicas) == (0, 0)
    # Its only pool at zero: still no NoCapacity, the pool can wake.
    only = make_td({"model": {"name": "m"},
                    "pools": [{"name": "batch", "autoscaling": {"minReplicas": 0, "maxReplicas": 2}}]})  # fmt: skip
    st = run(only, [deployment("whisper-batch", 0, 0), deployment("whisper-frontend", 2, 2)])
    assert conditions(st)["Ready"] == ("True", "ScaledToZero")


def test_an_autoscaled_pool_waits_for_the_replicas_its_autoscaler_asked_for() -> None:
    td = make_td(SCALED)
    st = run(td, [deployment("whisper-batch", 3, 1), deployment("whisper-fixed", 2, 2),
                  deployment("whisper-frontend", 2, 2)])  # fmt: skip
    # Serving on the ready replica while the autoscaler's others come.
    assert conditions(st)["Ready"] == ("True", "RollingOut")
    assert conditions(st)["Progressing"] == ("True", "RollingOut")
    batch = next(p for p in st.pools if p.name == "batch")
    assert (batch.replicas, batch.ready_replicas) == (3, 1)


def test_without_keda_the_resource_says_so_and_the_rest_is_applied() -> None:
    w = World(SCALED)
    w.kube.unserved.add("ScaledObject")
    result = w.reconcile()
    assert ("Deployment", "whisper-batch") in w.kube.objects  # everything else is applied
    degraded = w.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "AutoscalerMissing")
    assert degraded["message"].startswith(
        "pool batch: spec.pools[].autoscaling needs KEDA, and this cluster does not serve "
        "keda.sh/v1alpha1 ScaledObject: install KEDA"
    )
    assert ("Warning", "AutoscalerMissing") in w.kube.events
    assert result.requeue_after == 60.0  # looked at again in a minute, not a retry storm
