"""Smoke tests: the test bed's control plane is real, and each component does its job."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import testbed.cluster
import testbed.images
import toolchain
from testbed import kubeget
from testbed.kube import wait_for
from testbed.kubectl import Kubectl

GPU_NODES = {n["name"] for n in testbed.cluster.NODES if n["gpus"]}


def gpu_deployment(name: str, gpus: int, replicas: int = 1) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "tolerations": [testbed.cluster.GPU_TAINT | {"operator": "Equal"}],
                    "containers": [
                        {
                            "name": "engine",
                            "image": "example.invalid/engine:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def test_nodes_advertise_gpus(kubectl: Kubectl) -> None:
    nodes = {n["metadata"]["name"]: n for n in kubectl.json("get", "nodes")["items"]}
    for spec in testbed.cluster.NODES:
        node = nodes[spec["name"]]
        gpus = node["status"]["allocatable"].get("nvidia.com/gpu", "0")
        assert gpus == str(spec["gpus"])
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", "KWOK keeps the fake node Ready"


def test_server_reports_pinned_version(kubectl: Kubectl) -> None:
    version = json.loads(kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == toolchain.KUBERNETES.version
    assert version["clientVersion"]["gitVersion"] == toolchain.KUBERNETES.version


def test_gpu_deployment_is_scheduled_on_a_gpu_node_and_runs(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply(gpu_deployment("whisper", gpus=1), namespace)

    # The controller manager turns the Deployment into a ReplicaSet and a Pod...
    rs = wait_for(
        lambda: kubectl.json("get", "replicasets", "-n", namespace)["items"], what="ReplicaSet"
    )[0]
    assert rs["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    pod = wait_for(lambda: kubectl.json("get", "pods", "-n", namespace)["items"], what="Pod")[0]
    assert pod["metadata"]["ownerReferences"][0]["name"] == rs["metadata"]["name"]

    # ...the scheduler binds it to a node with a free GPU, and KWOK runs it.
    def running() -> dict[str, Any] | None:
        p = kubectl.json("get", "pod", "-n", namespace, pod["metadata"]["name"])
        return p if p["status"].get("phase") == "Running" else None

    pod = wait_for(running, what="the pod to be Running")
    assert pod["spec"]["nodeName"] in GPU_NODES
    events = kubectl.json("get", "events", "-n", namespace)["items"]
    scheduled = [e for e in events if e["reason"] == "Scheduled"]
    assert scheduled
    assert pod["spec"]["nodeName"] in scheduled[0]["message"]


def test_pod_wanting_more_gpus_than_any_node_stays_pending(
    kubectl: Kubectl, namespace: str
) -> None:
    most = max(n["gpus"] for n in testbed.cluster.NODES)
    kubectl.apply(gpu_deployment("too-big", gpus=most + 1), namespace)

    def unschedulable() -> dict[str, Any] | None:
        pods = kubectl.json("get", "pods", "-n", namespace)["items"]
        for p in pods:
            for c in p["status"].get("conditions", []):
                if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                    return c
        return None

    condition = wait_for(unschedulable, what="the scheduler to give up on the pod")
    assert "Insufficient nvidia.com/gpu" in condition["message"]
    pods = kubectl.json("get", "pods", "-n", namespace)["items"]
    assert pods[0]["status"]["phase"] == "Pending"
    assert not pods[0]["spec"].get("nodeName")


def test_deleting_a_deployment_garbage_collects_its_pods(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(gpu_deployment("short-lived", gpus=1, replicas=2), namespace)
    wait_for(
        lambda: len(kubectl.json("get", "pods", "-n", namespace)["items"]) == 2, what="two pods"
    )
    kubectl("delete", "deployment", "short-lived", "-n", namespace, "--wait=false")
    wait_for(
        lambda: not kubectl.json("get", "pods,replicasets", "-n", namespace)["items"],
        timeout=90,
        what="the garbage collector to remove the ReplicaSet and its pods",
    )


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.smoke.test"},
    "spec": {
        "group": "smoke.test",
        "scope": "Namespaced",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {"size": {"type": "integer", "maximum": 10}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_schema_rejects_invalid_objects_at_admission(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(WIDGET_CRD)
    kubectl("wait", "--for=condition=Established", "crd/widgets.smoke.test", "--timeout=30s")

    def widget(size: Any) -> str:
        obj = {"apiVersion": "smoke.test/v1", "kind": "Widget", "metadata": {"name": "w"}}
        return json.dumps(obj | {"spec": {"size": size}})

    bad = kubectl.run("apply", "-n", namespace, "-f", "-", input=widget(11), check=False)
    assert bad.returncode != 0
    assert (
        "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10"
        in bad.stderr
    )
    wrong_type = kubectl.run("apply", "-n", namespace, "-f", "-", input=widget("big"), check=False)
    assert (
        'spec.size: Invalid value: "string": spec.size in body must be of type integer'
        in wrong_type.stderr
    )
    # A valid object is still accepted afterwards.
    kubectl.run("apply", "-n", namespace, "-f", "-", input=widget(3))
    assert kubectl.json("get", "widget", "w", "-n", namespace)["spec"]["size"] == 3


def test_the_in_process_reads_answer_as_kubectl_does(kubectl: Kubectl, namespace: str) -> None:
    """testbed/kubeget.py's answers, held against kubectl's own on this API server: the
    same exit status, output and message, for objects, lists, a custom kind and the misses."""
    kubectl.apply(WIDGET_CRD)
    kubectl("wait", "--for=condition=Established", "crd/widgets.smoke.test", "--timeout=30s")
    kubectl.apply({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "1"},
                   "metadata": {"name": "c", "labels": {"k": "v"}}}, namespace)  # fmt: skip
    kubectl.apply({"apiVersion": "smoke.test/v1", "kind": "Widget", "metadata": {"name": "w"},
                   "spec": {"size": 2}}, namespace)  # fmt: skip
    assert kubectl.reader is not None
    plain = Kubectl(kubectl.kubeconfig, in_process=False)
    reads = [
        ("configmap", "c", "-n", namespace),
        ("cm", "-n", namespace, "-l", "k=v"),
        ("configmaps/c", "-n", namespace),
        ("widget", "w", "-n", namespace),
        ("widgets.smoke.test", "-n", namespace),
        ("namespace", namespace),
        ("crd", "widgets.smoke.test"),
        ("cm", "nothing", "-n", namespace),
        ("cm", "nothing", "-n", namespace, "--ignore-not-found"),
        ("cm", "-n", namespace, "-l", "k=none"),
        ("cm", "-n", namespace, "-l", "k=none", "--ignore-not-found"),
    ]
    for args in reads:
        command = ("get", *args, "-o", "json")
        get = kubeget.parse(command)
        assert get is not None, command
        ours = kubectl.reader.answer(get, timeout=60)
        assert ours is not None, f"{command}: left to kubectl"
        theirs = plain.run(*command, check=False)
        assert (ours.returncode, ours.stderr) == (theirs.returncode, theirs.stderr), command
        assert (json.loads(ours.stdout) if ours.stdout else None) == (
            json.loads(theirs.stdout) if theirs.stdout else None
        ), command


# --------------------------------------------------------------------------- the real node


def test_real_node_runs_the_pinned_kubelet_and_containerd(kubectl: Kubectl, real_node: str) -> None:
    node = kubectl.json("get", "node", real_node)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == toolchain.KUBERNETES.version
    assert info["kubeProxyVersion"] in ("", toolchain.KUBERNETES.version)
    containerd = toolchain.CONTAINERD.version.lstrip("v")
    assert info["containerRuntimeVersion"] == f"containerd://{containerd}"
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == testbed.realnode.NODE_IP
    # KWOK leaves it alone: the kubelet holds the node's lease, and it is not tainted. The
    # kubelet creates the lease once its Node exists: a try that comes before its
    # registration (they race) is retried at the next renewal, 10 s later.
    holder = wait_for(
        lambda: kubectl("get", "lease", real_node, "-n", "kube-node-lease", "--ignore-not-found",
                        "-o", "jsonpath={.spec.holderIdentity}"),
        timeout=30, what="the real node's lease",
    )  # fmt: skip
    assert holder == real_node
    assert not node["spec"].get("taints")
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})


def base_image_pod(name: str, command: list[str], image: str = "") -> dict[str, Any]:
    """A pod of the test bed's own base image (no registry is reachable), or of `image`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": image or testbed.images.ref(testbed.images.BASE),
                    "imagePullPolicy": "Never",
                    "command": command,
                }
            ],
        },
    }


def test_a_pod_really_runs_and_stays_inside_the_test_bed(
    kubectl: Kubectl, real_node: str, real_namespace: str
) -> None:
    """A real container on the real node: its logs, its address on the test bed's bridge,
    the API server reachable through the `kubernetes` Service, and no route out."""
    script = (
        "import socket, ssl, os\n"
        "for line in open('/proc/net/route').read().splitlines()[1:]: print('route', line)\n"
        "s = socket.create_connection((os.environ['KUBERNETES_SERVICE_HOST'], int(os.environ['KUBERNETES_SERVICE_PORT'])), timeout=5)\n"
        "ctx = ssl.create_default_context(cafile='/var/run/secrets/kubernetes.io/serviceaccount/ca.crt')\n"
        "t = ctx.wrap_socket(s, server_hostname=os.environ['KUBERNETES_SERVICE_HOST'])\n"
        "print('api server certificate ok', t.version())\n"
    )
    kubectl.apply(base_image_pod("probe", ["python3", "-c", script]), real_namespace)

    def done() -> dict[str, Any] | None:
        p = kubectl.json("get", "pod", "probe", "-n", real_namespace)
        return p if p["status"].get("phase") in ("Succeeded", "Failed") else None

    pod = wait_for(done, timeout=120, what="the probe pod to finish")
    logs = kubectl("logs", "probe", "-n", real_namespace)
    assert pod["status"]["phase"] == "Succeeded", logs
    assert pod["spec"]["nodeName"] == real_node
    assert pod["status"]["podIP"].startswith("10.244.")
    assert "api server certificate ok" in logs
    # /proc/net/route (interface, destination, gateway, ...): 00000000 is a default route.
    routes = [line.split()[1:] for line in logs.splitlines() if line.startswith("route ")]
    assert routes and all(r[1] != "00000000" for r in routes), routes


def test_a_rebuilt_image_reaches_containerd_without_the_layers_it_has_unpacked(
    kubectl: Kubectl, real_node: str, real_namespace: str, tmp_path: Path
) -> None:
    """An image rebuilt after a change to the source: containerd gets only its new top
    layer, unpacks it on the snapshots it has, and a pod runs from it (the file the new
    layer holds, on the layers below)."""
    images, node = testbed.images, testbed.cluster.node()
    probe = f"{images.REGISTRY}/lean-probe:{secrets.token_hex(4)}"
    (tmp_path / "marker").write_text(probe)
    with images.using_store():  # `make test` builds the torch images meanwhile
        box = images.buildah("from", "--pull=never", images.ref(images.OPERATOR), capture=True)
        try:
            images.buildah("copy", "--quiet", box.strip(), str(tmp_path / "marker"), "/marker")
            images.buildah("commit", "--quiet", box.strip(), probe, capture=True)
        finally:
            images.buildah("rm", box.strip(), capture=True, check=False)
    try:
        stack = images.layers(probe)
        unpacked = node.unpacked()
        assert [chain in unpacked for *_, chain in stack] == [True] * (len(stack) - 1) + [False]
        command = images.push_command(probe, unpacked)
        assert "stream" in command, command
        sent = subprocess.run(command, capture_output=True, check=True).stdout
        whole = sum(size for _, size, _ in stack)
        assert len(sent) < 64 * 1024 < whole, (len(sent), whole)  # the marker's layer alone

        node.import_image(probe, command)
        assert probe in node.images()
        assert stack[-1][2] in node.unpacked()
        pod = base_image_pod("lean", ["cat", "/marker"], image=probe)
        kubectl.apply(pod, real_namespace)
        wait_for(
            lambda: kubectl.json("get", "pod", "lean", "-n", real_namespace)["status"].get("phase")
            == "Succeeded",
            timeout=60, what="the pod of the rebuilt image to finish",
        )  # fmt: skip
        assert kubectl("logs", "lean", "-n", real_namespace).strip() == probe
    finally:
        kubectl.run("delete", "pod", "lean", "-n", real_namespace, "--wait", check=False)
        node.ctr("images", "rm", "--sync", probe, check=False)
        images.buildah("rmi", probe, capture=True, check=False)
