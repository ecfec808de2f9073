"""Desired state: the children built from each sample, and the rules they follow."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.operator import RecordingKube
from testkit.resources import SAMPLES_DIR, make_td, sample_docs, single_deployment_samples
from transcription_api.frontend import FrontendSettings
from transcription_api.routes import RouteTable
from transcription_api.telemetry import TELEMETRY_OFF
from transcription_api.v1alpha1 import (
    GATEWAY_KIND,
    KIND,
    ResourcesSpec,
    TranscriptionDeployment,
    TranscriptionGateway,
)
from transcription_api.worker import WorkerSettings
from transcription_operator.children import build, build_gateway, resource_requirements
from transcription_operator.config import OperatorConfig
from transcription_operator.kube import KubeError
from transcription_operator.names import GatewayRef
from transcription_operator.selection import select

SAMPLES = single_deployment_samples()
GOLDEN = Path(__file__).parent / "golden"
CFG = OperatorConfig()


def sample_td(path: Path) -> TranscriptionDeployment:
    doc = yaml.safe_load(path.read_text())
    doc["metadata"] |= {"namespace": "speech", "uid": "uid-1", "generation": 1}
    return TranscriptionDeployment.model_validate(doc)


def check_golden(name: str, manifests: list[dict[str, Any]]) -> None:
    """Golden files: `UPDATE_GOLDEN=1 pytest tests/test_children.py` rewrites them."""
    text = yaml.safe_dump_all(manifests, sort_keys=False)
    golden = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden.name} differs; review and UPDATE_GOLDEN=1"


def by_kind_name(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_sample_builds_the_expected_manifests(path: Path) -> None:
    check_golden(path.stem, build(sample_td(path), CFG))


def test_the_gateway_sample_builds_the_expected_manifests() -> None:
    """The gateway's children, then each deployment's as the gateway's routing shapes them
    (its frontend admitted to the workers; `tiny` without a frontend of its own)."""
    docs = sample_docs(SAMPLES_DIR / "gateway.yaml")
    [gw] = [TranscriptionGateway.model_validate(d) for d in docs if d["kind"] == GATEWAY_KIND]
    tds = [TranscriptionDeployment.model_validate(d) for d in docs if d["kind"] == KIND]
    selection = select(gw, tds, {})
    assert [(v.name, v.routed) for v in selection.verdicts] == [("base", True), ("tiny", True)]
    manifests = build_gateway(gw, CFG, selection)
    for td in tds:
        manifests += build(td, CFG, routed_by=[GatewayRef(gw.namespace, gw.name)])
    check_golden("gateway", manifests)


def test_every_child_is_owned_and_labelled(vllm_td: TranscriptionDeployment) -> None:
    for m in build(vllm_td, CFG):
        meta = m["metadata"]
        assert meta["namespace"] == "speech"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "transcription.dev/v1alpha1",
                "kind": "TranscriptionDeployment",
                "name": "whisper",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"]["app.kubernetes.io/instance"] == "whisper"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "transcription-operator"


def test_children_of_a_gpu_pool(vllm_td: TranscriptionDeployment) -> None:
    kids = by_kind_name(build(vllm_td, CFG))
    assert set(kids) == {
        ("ServiceAccount", "whisper-frontend"),
        ("Role", "whisper-frontend"),
        ("RoleBinding", "whisper-frontend"),
        ("ConfigMap", "whisper-routes"),
        ("Service", "whisper-batch"),
        ("Service", "whisper"),
        ("Deployment", "whisper-batch"),
        ("Deployment", "whisper-frontend"),
        ("PodDisruptionBudget", "whisper-batch"),
        ("PodDisruptionBudget", "whisper-frontend"),
        ("NetworkPolicy", "whisper-workers"),
        ("NetworkPolicy", "whisper-workers-egress"),
        ("NetworkPolicy", "whisper-frontend-internal"),
        ("NetworkPolicy", "whisper-frontend-egress"),
    }
    pod = kids[("Deployment", "whisper-batch")]["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    assert engine["resources"] == {
        "requests": {"nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    settings = WorkerSettings.model_validate_json(engine["env"][0]["value"])
    assert settings.served_names == ["openai/whisper-large-v3-turbo", "whisper-1"]
    assert (settings.engine, settings.mode, settings.gpus) == ("vllm", "continuous", 1)
    # Restricted pod security: non-root, no privilege escalation, no capabilities.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert engine["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert engine["securityContext"]["allowPrivilegeEscalation"] is False
    assert {p: engine[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {
        "startupProbe": "/health", "readinessProbe": "/health", "livenessProbe": "/health",
    }  # fmt: skip
    rollout = kids[("Deployment", "whisper-batch")]["spec"]["strategy"]["rollingUpdate"]
    assert rollout == {"maxUnavailable": 0, "maxSurge": 1}


def test_route_table_lists_aliases_and_pools(vllm_td: TranscriptionDeployment) -> None:
    cm = by_kind_name(build(vllm_td, CFG))[("ConfigMap", "whisper-routes")]
    table = RouteTable.model_validate_json(cm["data"]["routes.json"])
    assert table.resolve("whisper-1") == "openai/whisper-large-v3-turbo"
    assert table.resolve("nope") is None
    assert [(p.name, p.engine, p.mode, p.service) for p in table.pools] == [
        ("batch", "vllm", "continuous", "whisper-batch")
    ]


def test_frontend_rbac_is_least_privilege(vllm_td: TranscriptionDeployment) -> None:
    role = by_kind_name(build(vllm_td, CFG))[("Role", "whisper-frontend")]
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["whisper-routes"], "verbs": ["get", "list", "watch"]},
        # Warning Events about its own pod (why it is not ready), never read back
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]  # fmt: skip


def test_network_policy_admits_only_the_frontend_and_scrapers(
    vllm_td: TranscriptionDeployment,
) -> None:
    np = by_kind_name(build(vllm_td, CFG))[("NetworkPolicy", "whisper-workers")]
    assert np["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/instance": "whisper",
        "app.kubernetes.io/component": "worker",
    }
    frontend, scrapers = np["spec"]["ingress"]
    assert frontend["from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/instance": "whisper",
                    "app.kubernetes.io/component": "frontend",
                }
            }
        }
    ]
    assert scrapers["from"][0]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "prometheus"}
    }
    assert frontend["ports"] == [{"protocol": "TCP", "port": 8000}]
    off = make_td({"model": {"name": "m"}, "networkPolicy": {"enabled": False}})
    assert "NetworkPolicy" not in [m["kind"] for m in build(off, CFG)]


def test_the_frontends_internal_ports_admit_only_its_peers_and_keda(
    vllm_td: TranscriptionDeployment,
) -> None:
    np = by_kind_name(build(vllm_td, CFG))[("NetworkPolicy", "whisper-frontend-internal")]
    frontend = {"app.kubernetes.io/instance": "whisper", "app.kubernetes.io/component": "frontend"}
    assert np["spec"]["podSelector"]["matchLabels"] == frontend
    public, internal = np["spec"]["ingress"]
    assert public == {"ports": [{"protocol": "TCP", "port": 8080}]}  # open to every client
    assert internal["from"] == [
        {"podSelector": {"matchLabels": frontend}},
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "keda-operator"}}},
    ]  # fmt: skip
    assert internal["ports"] == [
        {"protocol": "TCP", "port": 9091},
        {"protocol": "TCP", "port": 9090},
    ]


def egress_of(manifests: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    np = by_kind_name(manifests)[("NetworkPolicy", name)]
    assert np["spec"]["policyTypes"] == ["Egress"]
    rules: list[dict[str, Any]] = np["spec"]["egress"]
    assert all(r.get("to") != [] for r in rules)  # an empty `to` would admit everything
    return rules


DNS = {"ports": [{"protocol": p, "port": n} for n in (53, 5353) for p in ("UDP", "TCP")]}
WORKERS = {"app.kubernetes.io/instance": "whisper", "app.kubernetes.io/component": "worker"}
FRONTENDS = {"app.kubernetes.io/instance": "whisper", "app.kubernetes.io/component": "frontend"}


@pytest.mark.parametrize("source", ["hub", "image"])
def test_workers_reach_dns_and_the_hub_only_for_hub_weights(source: str) -> None:
    model = {"name": "m", "source": source} | ({"path": "/models/m"} if source == "image" else {})
    manifests = build(make_td({"model": model}), CFG)
    rules = egress_of(manifests, "whisper-workers-egress")
    hub = [{"ports": [{"protocol": "TCP", "port": 443}]}] if source == "hub" else []
    assert rules == [DNS, *hub]
    np = by_kind_name(manifests)[("NetworkPolicy", "whisper-workers-egress")]
    assert np["spec"]["podSelector"]["matchLabels"] == WORKERS


def test_the_frontend_reaches_dns_the_api_server_its_workers_and_peers() -> None:
    td = make_td({"model": {"name": "m"}})
    cfg = OperatorConfig(api_server=(("10.0.0.1", 6443), ("10.0.0.2", 6443), ("fd00::1", 443)))
    rules = egress_of(build(td, cfg), "whisper-frontend-egress")
    dns, api443, api6443, workers, peers = rules
    assert dns == DNS
    assert api443 == {"to": [{"ipBlock": {"cidr": "fd00::1/128"}}],
                      "ports": [{"protocol": "TCP", "port": 443}]}  # fmt: skip
    assert api6443["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}},
                             {"ipBlock": {"cidr": "10.0.0.2/32"}}]  # fmt: skip
    assert workers == {
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "speech"}},
                "podSelector": {"matchLabels": WORKERS}}],
        "ports": [{"protocol": "TCP", "port": 8000}],
    }  # fmt: skip
    assert peers == {"to": [{"podSelector": {"matchLabels": FRONTENDS}}],
                     "ports": [{"protocol": "TCP", "port": 9091}]}  # fmt: skip
    # The API server's addresses unknown: its ports, anywhere.
    assert egress_of(build(td, CFG), "whisper-frontend-egress")[1] == {
        "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]
    }


@pytest.mark.parametrize(
    ("endpoint", "rule"),
    [
        ("http://10.1.2.3:4318", {"ports": [{"protocol": "TCP", "port": 4318}],
                                  "to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}]}),
        ("https://collector.observability.svc", {"ports": [{"protocol": "TCP", "port": 443}]}),
    ],
)  # fmt: skip
def test_the_tracing_endpoint_is_reachable_when_set(endpoint: str, rule: dict[str, Any]) -> None:
    manifests = build(make_td({"model": {"name": "m"}, "tracing": {"endpoint": endpoint}}), CFG)
    assert egress_of(manifests, "whisper-workers-egress")[-1] == rule
    assert egress_of(manifests, "whisper-frontend-egress")[-1] == rule


def test_the_api_servers_addresses_come_from_the_chart_else_from_its_endpoint_slices() -> None:
    env = {"API_SERVER_ENDPOINTS": "10.0.0.1:6443, [fd00::1]:443"}
    assert OperatorConfig.from_env(env).api_server == (("10.0.0.1", 6443), ("fd00::1", 443))
    kube = RecordingKube()
    kube.server.put({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "ports": [{"name": "https", "port": 6443}],
        "endpoints": [{"addresses": ["172.18.0.3"]}, {"addresses": ["172.18.0.2"]}],
    })  # fmt: skip
    assert kube.api_server_endpoints() == (("172.18.0.2", 6443), ("172.18.0.3", 6443))

    class Namespaced(RecordingKube):  # may not read the default namespace
        def request(self, method: str, path: str, *args: Any, **kw: Any) -> Any:
            raise KubeError(403, "Forbidden", "")

    assert Namespaced().api_server_endpoints() == ()  # none known: the ports, anywhere


def test_egress_policies_can_be_left_out() -> None:
    """For a CNI that does not enforce egress: the ingress policies stay."""
    td = make_td({"model": {"name": "m"}, "networkPolicy": {"egress": False}})
    names = {m["metadata"]["name"] for m in build(td, CFG) if m["kind"] == "NetworkPolicy"}
    assert names == {"whisper-workers", "whisper-frontend-internal"}


def test_single_replica_pools_get_no_disruption_budget() -> None:
    td = make_td({"model": {"name": "m"}, "frontend": {"replicas": 1}})
    kinds = [m["kind"] for m in build(td, CFG)]
    assert "PodDisruptionBudget" not in kinds


def test_tensor_parallelism_and_scheduling_fields() -> None:
    td = make_td(
        {
            "model": {
                "name": "m",
                "revision": "v2",
                "hubTokenSecret": {"name": "hf", "key": "token"},
            },
            "pools": [
                {
                    "name": "big",
                    "resources": {"gpus": 4, "gpuResourceName": "nvidia.com/mig-3g.40gb"},
                    "nodeSelector": {"gpu": "h100"},
                    "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                    "affinity": {"nodeAffinity": {"x": 1}},
                    "engineArgs": ["--max-model-len=448"],
                    "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
                }
            ],
            "pod": {
                "priorityClassName": "high",
                "serviceAccountName": "worker",
                "labels": {"team": "asr"},
            },
            "images": {"vllm": "registry.local/vllm:1", "pullSecrets": ["regcred"]},
        }
    )
    dep = by_kind_name(build(td, CFG))[("Deployment", "whisper-big")]
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    c = spec["containers"][0]
    settings = json.loads(c["env"][0]["value"])
    assert settings["gpus"] == 4
    assert settings["revision"] == "v2"
    assert settings["extra_args"] == ["--max-model-len=448"]
    assert c["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "4"}
    assert c["image"] == "registry.local/vllm:1"
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in c[
        "env"
    ]
    assert {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"} in c["env"]
    assert spec["nodeSelector"] == {"gpu": "h100"}
    assert spec["tolerations"][0] == {"key": "dedicated", "operator": "Exists"}
    assert spec["affinity"] == {"nodeAffinity": {"x": 1}}
    assert spec["priorityClassName"] == "high"
    assert spec["serviceAccountName"] == "worker"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["metadata"]["labels"]["team"] == "asr"


def test_pvc_weights_are_mounted_read_only() -> None:
    td = make_td(
        {"model": {"name": "m", "source": "pvc", "claimName": "weights", "path": "/whisper/"}}
    )
    dep = by_kind_name(build(td, CFG))[("Deployment", "whisper-default")]
    spec = dep["spec"]["template"]["spec"]
    assert {
        "name": "weights",
        "persistentVolumeClaim": {"claimName": "weights", "readOnly": True},
    } in spec["volumes"]
    settings = json.loads(spec["containers"][0]["env"][0]["value"])
    assert settings["model"] == "/weights/whisper"


DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("path", "model"), [(None, "/weights"), ("/tiny.en/", "/weights/tiny.en")])
def test_oci_weights_are_one_image_volume_every_pool_mounts_read_only(
    path: str | None, model: str
) -> None:
    image = f"registry.example.com/models/whisper-tiny.en:v1@{DIGEST}"
    spec = {"name": "m", "source": "oci", "image": image, **({"path": path} if path else {})}
    td = make_td({"model": spec, "engine": "faster-whisper",
                  "pools": [{"name": "a", "mode": "sequential"}, {"name": "b"}]})  # fmt: skip
    workers = [m for m in build(td, CFG) if m["kind"] == "Deployment"
               and m["metadata"]["name"] != "whisper-frontend"]  # fmt: skip
    assert len(workers) == 2
    for dep in workers:
        pod = dep["spec"]["template"]["spec"]
        assert {"name": "weights", "image": {"reference": image}} in pod["volumes"]
        [c] = pod["containers"]
        assert {"name": "weights", "mountPath": "/weights", "readOnly": True} in c["volumeMounts"]
        settings = json.loads(c["env"][0]["value"])
        assert settings["model"] == model
        assert {e["name"]: e.get("value") for e in c["env"]}["HF_HUB_OFFLINE"] == "1"


def test_api_key_secret_is_mounted_into_the_frontend() -> None:
    td = make_td(
        {"model": {"name": "m"}, "frontend": {"apiKeySecret": {"name": "keys", "key": "keys.txt"}}}
    )
    dep = by_kind_name(build(td, CFG))[("Deployment", "whisper-frontend")]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    settings = FrontendSettings.model_validate_json(c["env"][0]["value"])
    assert str(settings.api_keys_path) == "/etc/transcription/api-keys/keys.txt"
    assert {"name": "api-keys", "mountPath": "/etc/transcription/api-keys", "readOnly": True} in c[
        "volumeMounts"
    ]


@pytest.mark.parametrize("source", ["hub", "image", "pvc", "oci"])
def test_every_container_turns_telemetry_off_and_only_hub_pools_may_reach_the_hub(
    source: str,
) -> None:
    model = {"name": "m", "source": source, "path": "/w",
             **({"image": "weights:v1"} if source == "oci" else {"claimName": "weights"})}  # fmt: skip
    pool_env = [{"name": "DO_NOT_TRACK", "value": "0"}]  # the pool's own env wins
    td = make_td({"model": {k: v for k, v in model.items() if source != "hub" or k == "name"},
                  "engine": "faster-whisper",
                  "pools": [{"name": "cpu", "mode": "sequential", "env": pool_env}]})  # fmt: skip
    pods = {m["metadata"]["name"]: m["spec"]["template"]["spec"]
            for m in build(td, CFG) if m["kind"] == "Deployment"}  # fmt: skip
    for name, pod in pods.items():
        [c] = pod["containers"]
        names = [e["name"] for e in c["env"]]
        assert len(names) == len(set(names)), names  # server-side apply refuses duplicates
        env = {e["name"]: e.get("value") for e in c["env"]}
        worker = name == "whisper-cpu"
        expected = {**TELEMETRY_OFF, **({"DO_NOT_TRACK": "0"} if worker else {})}
        assert {k: env.get(k) for k in TELEMETRY_OFF} == expected, name
        offline = not worker or source != "hub"
        assert env.get("HF_HUB_OFFLINE") == ("1" if offline else None), name


def test_build_is_deterministic(vllm_td: TranscriptionDeployment) -> None:
    assert build(vllm_td, CFG) == build(vllm_td, CFG)


def test_faster_whisper_pools_get_decoding_settings_and_the_image_for_their_device() -> None:
    td = make_td(
        {
            "model": {"name": "m"},
            "engine": "faster-whisper",
            "pools": [
                {"name": "cpu", "resources": {"cpu": "1500m"}, "beamSize": 1, "vadFilter": True},
                {"name": "gpu", "resources": {"gpus": 1}, "maxBatchSize": 32, "threads": 4},
            ],
        }
    )
    kids = by_kind_name(build(td, CFG))

    def engine(pool: str) -> tuple[str, WorkerSettings]:
        c = kids[("Deployment", f"whisper-{pool}")]["spec"]["template"]["spec"]["containers"][0]
        return c["image"], WorkerSettings.model_validate_json(c["env"][0]["value"])

    image, s = engine("cpu")
    assert image == "ghcr.io/transcription-dev/worker-cpu:0.1.0"
    assert (s.mode, s.beam_size, s.vad_filter, s.max_batch_size) == ("continuous", 1, True, 8)
    assert (s.threads, s.compute_type, s.gpus) == (2, "int8", 0)  # threads: 1500m rounded up
    image, s = engine("gpu")
    assert image == "ghcr.io/transcription-dev/worker-cuda:0.1.0"
    assert (s.beam_size, s.max_batch_size, s.threads) == (5, 32, 4)
    assert (s.compute_type, s.gpus) == ("float16", 1)


def test_cuda_image_comes_from_the_spec_then_the_operator_config() -> None:
    spec = {
        "model": {"name": "m"},
        "engine": "faster-whisper",
        "pools": [{"name": "gpu", "resources": {"gpus": 2}}],
    }

    def image(td: TranscriptionDeployment, cfg: OperatorConfig) -> str:
        dep = by_kind_name(build(td, cfg))[("Deployment", "whisper-gpu")]
        return str(dep["spec"]["template"]["spec"]["containers"][0]["image"])

    cfg = OperatorConfig.from_env({"FASTER_WHISPER_CUDA_IMAGE": "registry.local/fw-cuda:1"})
    assert image(make_td(spec), cfg) == "registry.local/fw-cuda:1"
    td = make_td({**spec, "images": {"fasterWhisper": "cpu:1", "fasterWhisperCuda": "cuda:1"}})
    assert image(td, cfg) == "cuda:1"
    # The CPU image is never given to a GPU pool, even when it is the only one overridden.
    assert image(make_td({**spec, "images": {"fasterWhisper": "cpu:1"}}), CFG) == (
        "ghcr.io/transcription-dev/worker-cuda:0.1.0"
    )


def test_vllm_pools_get_no_faster_whisper_settings(vllm_td: TranscriptionDeployment) -> None:
    dep = by_kind_name(build(vllm_td, CFG))[("Deployment", "whisper-batch")]
    settings = json.loads(dep["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"])
    assert not {"beam_size", "vad_filter", "threads", "max_batch_size", "compute_type"} & set(
        settings
    )


def test_cpu_is_a_request_without_a_limit_as_the_crd_says() -> None:
    """resources.cpu: a request, no limit (issue 20 item 8); memory: request and limit."""
    out = resource_requirements(ResourcesSpec(cpu="2", memory="4Gi"))
    assert out == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert "No CPU limit" in (ResourcesSpec.model_fields["cpu"].description or "")
    crd = Path("crds/transcriptiondeployments.transcription.dev.yaml").read_text()
    assert "No CPU limit is set" in crd and "CPU request (and limit)" not in crd


def test_a_pool_that_runs_the_speaker_stage_mounts_its_model_and_says_so_in_the_route_table() -> (
    None
):
    td = make_td(
        {"model": {"name": "openai/whisper-large-v3"}, "traffic": {"features": ["diarization"]}}
    )
    cfg = OperatorConfig(speaker_model="registry.example/speakers/campplus@sha256:" + "a" * 64)
    objs = by_kind_name(build(td, cfg))
    auto = objs[("Deployment", "whisper-auto-faster-whisper")]["spec"]["template"]["spec"]
    [engine] = auto["containers"]
    assert {"name": "speakers", "image": {"reference": cfg.speaker_model}} in auto["volumes"]
    assert {"name": "speakers", "mountPath": "/speakers", "readOnly": True} in engine[
        "volumeMounts"
    ]
    assert {"name": "SPEAKER_MODEL", "value": "/speakers/campplus.onnx"} in engine["env"]
    vllm = objs[("Deployment", "whisper-default")]["spec"]["template"]["spec"]
    assert not any(v["name"] == "speakers" for v in vllm["volumes"])
    table = RouteTable.model_validate_json(
        objs[("ConfigMap", "whisper-routes")]["data"]["routes.json"]
    )
    assert {p.name: p.speakers for p in table.pools} == {
        "default": False,
        "auto-faster-whisper": True,
    }
    assert OperatorConfig.from_env({"SPEAKER_MODEL_IMAGE": "r/s:1"}).speaker_model == "r/s:1"
