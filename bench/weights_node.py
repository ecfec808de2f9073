"""Worker pod start-up by weights source (issue 38), side by side on the test bed's real node.

    python -m bench weights-node [--quick]

One faster-whisper pool (Whisper tiny.en, one replica, `cpu: 500m`, no frontend) is created
from each source in turn, the sources interleaved round after round, by the chart's operator
in the cluster:

- `image`: the weights baked into the worker image (/models/whisper-tiny.en);
- `pvc`: a PersistentVolumeClaim bound to a hostPath PersistentVolume on the node;
- `oci`: an image volume: the weights packed by `python -m transcription_api.weights pack`
  and imported into the node's containerd (as after a first pull: there is no registry
  here, so a pull's own time, which depends on the registry, is not in it);
- `hub`: tried once, to record what the cluster says (no hub is reachable from here).

Each start is timed from `kubectl apply` by polling: until the pod's container runs (the
kubelet mounted the volumes and started it), then until the worker's `/health` answers 200
on the pod's address (the model loaded). Kubernetes' own Ready comes from the startup probe,
every 10 s, so it is reported too but is not the measure.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import testbed.cluster
from testbed import realnode, weights
from testbed.kube import CRD_FILE, SAMPLES, create_namespace, wait_for
from testbed.kubectl import Kubectl
from testbed.operators import operator_in_cluster
from transcription_operator.diagnose import parse_time

from .common import say, table, write

SOURCES = ("image", "pvc", "oci")
RELEASE = "bench-weights-operator"
CLAIM = "bench-weights"
HOST_DIR = Path("/var/lib/transcription-testbed/bench-weights")  # the pvc source's files
PATH = "tiny.en"


def resource(source: str, name: str, oci_image: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(SAMPLES["cpu-faster-whisper"]))
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["pools"][0]["resources"]["cpu"] = "500m"
    spec["frontend"] = {"enabled": False}
    model = spec["model"]
    if source == "pvc":
        model.update(source="pvc", claimName=CLAIM, path=PATH)
    elif source == "oci":
        model.update(source="oci", image=oci_image, path=PATH)
    elif source == "hub":
        model.update(name="Systran/faster-whisper-tiny.en", source="hub")
        del model["path"]
    return doc


def claim(kubectl: Kubectl, ns: str, node: str) -> None:
    """tiny.en's files on the node, as a hostPath PersistentVolume bound to CLAIM."""
    subprocess.run(["rm", "-rf", str(HOST_DIR)], check=True)
    weights.tiny_en(HOST_DIR / PATH)
    HOST_DIR.chmod(0o755)
    pv = f"{ns}-weights"
    kubectl.apply({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"],
                 "storageClassName": CLAIM, "persistentVolumeReclaimPolicy": "Retain",
                 "hostPath": {"path": str(HOST_DIR), "type": "Directory"},
                 "claimRef": {"namespace": ns, "name": CLAIM},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
    })  # fmt: skip
    kubectl.apply({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "namespace": ns},
        "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": CLAIM, "volumeName": pv,
                 "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    wait_for(lambda: kubectl.json("get", "pvc", CLAIM, "-n", ns)["status"].get("phase") == "Bound",
             timeout=60, what="the weights claim bound")  # fmt: skip


def worker(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any] | None:
    pods = kubectl.pods(ns, name, "worker")
    return pods[0] if pods else None


def running(pod: dict[str, Any] | None) -> bool:
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
    return bool(statuses) and "running" in statuses[0].get("state", {})


def healthy(ip: str) -> bool:
    try:
        return httpx.get(f"http://{ip}:8000/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def start(kubectl: Kubectl, ns: str, source: str, name: str, oci_image: str) -> dict[str, float]:
    """One pool from `source`, timed; deleted again (its pods gone) before it returns."""
    t0 = time.monotonic()
    kubectl.apply(resource(source, name, oci_image), ns)
    pod = wait_for(lambda: (p := worker(kubectl, ns, name)) and running(p) and p, timeout=300,
                   interval=0.1, what=f"the {source} worker's container running")  # fmt: skip
    t_run = time.monotonic() - t0
    ip = pod["status"]["podIP"]
    wait_for(lambda: healthy(ip), timeout=300, interval=0.1, what=f"the {source} worker healthy")
    t_health = time.monotonic() - t0

    def ready() -> dict[str, Any] | None:
        p = worker(kubectl, ns, name)
        conds = {c["type"]: c for c in (p or {}).get("status", {}).get("conditions") or []}
        return p if conds.get("Ready", {}).get("status") == "True" else None

    pod = wait_for(ready, timeout=300, what=f"the {source} worker Ready")
    ready_at = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    k8s_ready = (parse_time(ready_at["lastTransitionTime"])
                 - parse_time(pod["metadata"]["creationTimestamp"])).total_seconds()  # fmt: skip
    say(f"{source}: container running {t_run:.1f} s, /health 200 at {t_health:.1f} s, "
        f"Kubernetes Ready {k8s_ready:.0f} s after the pod's creation")  # fmt: skip
    stop(kubectl, ns, name)
    return {"running_s": t_run, "healthy_s": t_health, "load_s": t_health - t_run,
            "k8s_ready_s": k8s_ready}  # fmt: skip


def stop(kubectl: Kubectl, ns: str, name: str) -> None:
    kubectl("delete", "tdeploy", name, "-n", ns, "--wait=false")
    kubectl.run("delete", "pods", "-n", ns, "-l", f"app.kubernetes.io/instance={name}",
                "--grace-period=0", "--force", check=False)  # fmt: skip
    wait_for(lambda: not kubectl.json("get", "pods", "-n", ns, "-l",
                                      f"app.kubernetes.io/instance={name}")["items"],
             timeout=120, what=f"{name}'s pods gone")  # fmt: skip


def hub_attempt(kubectl: Kubectl, ns: str) -> str:
    """What the pool's status says of source 'hub' where no hub is reachable."""
    kubectl.apply(resource("hub", "from-hub", ""), ns)

    def said() -> str | None:
        td = kubectl.json("get", "tdeploy", "from-hub", "-n", ns)
        for pool in td.get("status", {}).get("pools", []):
            if message := (pool.get("notReady") or {}).get("message"):
                return f"{pool['notReady'].get('reason')}: {message}"
        return None

    try:
        return str(wait_for(said, timeout=240, interval=2, what="the hub pool's status"))
    finally:
        stop(kubectl, ns, "from-hub")


def run(quick: bool = False) -> dict[str, Any]:
    rounds = 1 if quick else 3
    say("bench weights-node: the test bed with its real node (building what is missing)")
    kubeconfig = testbed.cluster.up()
    kubectl = Kubectl(kubeconfig)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    node = realnode.NODE_NAME
    with tempfile.TemporaryDirectory() as tmp:
        oci_image = weights.on_the_node(weights.tiny_en(Path(tmp) / "m"), "bench", PATH, Path(tmp))
    ns = create_namespace(kubectl, "weights", simulated=False)
    kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    times: dict[str, list[dict[str, float]]] = {s: [] for s in SOURCES}
    try:
        claim(kubectl, ns, node)
        with operator_in_cluster(kubectl, kubeconfig, RELEASE, ns):
            for r in range(rounds):
                order = SOURCES[r % len(SOURCES) :] + SOURCES[: r % len(SOURCES)]
                for source in order:
                    say(f"round {r + 1}/{rounds}: {source}")
                    times[source].append(start(kubectl, ns, source, f"from-{source}", oci_image))
            hub = hub_attempt(kubectl, ns)
    finally:
        kubectl.run("delete", "namespace", ns, "--wait=false", check=False)
        kubectl.run("delete", "pv", f"{ns}-weights", "--wait=false", check=False)

    def med(source: str, key: str) -> float:
        return statistics.median(t[key] for t in times[source])

    rows = [[s, len(times[s]), med(s, "running_s"), med(s, "load_s"), med(s, "healthy_s"),
             med(s, "k8s_ready_s"), med(s, "healthy_s") / med("image", "healthy_s")]
            for s in SOURCES]  # fmt: skip
    table(f"Worker pod start-up by weights source (faster-whisper, tiny.en, 500m CPU; median of "
          f"{rounds}, interleaved)",
          ["source", "starts", "apply→running s", "running→/health s", "apply→/health s",
           "Kubernetes Ready s", "vs image"], rows)  # fmt: skip
    print(f"\n  hub: {hub}")
    result = {"rounds": rounds, "sources": times, "hub": hub, "oci_image": oci_image}
    write("weights-node", result)
    return result
