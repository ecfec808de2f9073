"""The cluster: a real control plane with fake (GPU) nodes and a real node.

Run it as ``python -m testbed build|up|status|down`` (see ``testbed/__main__.py``).

The binaries (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd,
kwok, kwokctl, ...) are the pinned tools (``toolchain``). kwokctl's ``binary`` runtime
runs the components as local processes on 127.0.0.1; KWOK's controller makes the fake
nodes Ready and runs their pods.

Only the standard library is used, so this works before the virtual environment exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import toolchain
from testbed import addons, gitops, images, realnode
from testbed.kubectl import Kubectl
from testkit import host
from toolchain import CACHE, CONTAINERD, ETCD, FLUX, KEDA, KUBE_ROUTER, KUBERNETES, KWOK, say

CLUSTER = os.environ.get("TESTBED_NAME", "transcription")
WORKDIR = CACHE / "kwok"
KUBECONFIG = CACHE / f"{CLUSTER}.kubeconfig"
SERVICE_CIDR = "10.96.0.0/16"
# kubectl against the test bed, for its own life cycle: no time limit (rollouts and
# deletions carry their own --timeout).
kubectl = Kubectl(KUBECONFIG, timeout=None)


def build_all(
    tools: tuple[toolchain.Tool, ...] = toolchain.ALL_TOOLS, scaling: bool = True
) -> dict[str, str]:
    """Binaries and images; return image name -> reference. The images that hold no
    binary build alongside the Go builds (those use the CPUs; image builds mostly wait on
    downloads and the disk), then the images of the add-on binaries. Without `scaling`,
    neither KEDA nor its images (the demo's first run: KEDA is its longest build after
    Kubernetes)."""
    if not scaling:
        tools = tuple(t for t in tools if t is not KEDA)
    with ThreadPoolExecutor(max_workers=1) as pool:
        own = pool.submit(images.build, images.WITHOUT_BINARY)
        toolchain.build(tools)
        own.result()
    return images.build(images.ALL if scaling else images.WITHOUT_KEDA)


# --------------------------------------------------------------------------- cluster

# Fake nodes registered on `up`: two GPU nodes and one CPU node. KWOK's controller keeps
# them Ready and moves the pods bound to them to Running.
NODES = [
    {"name": "gpu-node-1", "gpus": 2, "cpu": "32", "memory": "256Gi", "gpu_product": "H100"},
    {"name": "gpu-node-2", "gpus": 4, "cpu": "64", "memory": "512Gi", "gpu_product": "H100"},
    # Room for the operator benchmark's hundreds of (simulated) pods.
    {
        "name": "cpu-node-1",
        "gpus": 0,
        "cpu": "64",
        "memory": "256Gi",
        "gpu_product": "",
        "pods": "1000",
    },
]
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
# The simulated CPU node is tainted: pods run on the real node unless their namespace
# opts into simulation (see SIMULATED_NAMESPACE_ANNOTATIONS).
SIMULATED_TAINT = {"key": realnode.SIMULATED_TAINT, "value": "true", "effect": "NoSchedule"}
# A namespace with these annotations gets pods that run on KWOK's nodes only: the API
# server's admission plugins add a node selector (PodNodeSelector) and the toleration of
# the simulated CPU node (PodTolerationRestriction). Suites that only need the control
# plane's view (hundreds of pods, fake readiness) use them.
SIMULATED_NAMESPACE_ANNOTATIONS = {
    "scheduler.alpha.kubernetes.io/node-selector": "type=kwok",
    "scheduler.alpha.kubernetes.io/defaultTolerations": json.dumps(
        [{"key": realnode.SIMULATED_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    ),
}


def node_manifest(spec: dict[str, object]) -> dict[str, object]:
    gpus = int(str(spec["gpus"]))
    capacity = {"cpu": spec["cpu"], "memory": spec["memory"], "pods": spec.get("pods", "110")}
    labels = {
        "kubernetes.io/hostname": spec["name"],
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
        labels["nvidia.com/gpu.present"] = "true"
        labels["nvidia.com/gpu.product"] = str(spec["gpu_product"])
        labels["nvidia.com/gpu.count"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec["name"],
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        # GPU nodes carry the taint GPU clusters use (GKE, the NVIDIA GPU operator), so
        # workloads must tolerate it, as they must on a real cluster.
        "spec": {"taints": [GPU_TAINT] if gpus else [SIMULATED_TAINT]},
        "status": {
            "allocatable": capacity,
            "capacity": capacity,
        },
    }


def _kwokctl(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """kwokctl with the test bed's work directory and our binaries (it never downloads)."""
    env = {
        **os.environ,
        "KWOK_WORKDIR": str(WORKDIR),
        "KWOK_KUBE_VERSION": KUBERNETES.version,
        "KWOK_KUBECTL_BINARY": str(KUBERNETES.path("kubectl")),
    }
    return subprocess.run(
        [str(KWOK.path("kwokctl")), "--name", CLUSTER, *args],
        env=env,
        text=True,
        capture_output=capture,
    )


def is_up() -> bool:
    if not (KUBECONFIG.exists() and KUBERNETES.path("kubectl").exists()):
        return False
    proc = subprocess.run(
        [
            str(KUBERNETES.path("kubectl")),
            "--kubeconfig",
            str(KUBECONFIG),
            "get",
            "--raw",
            "/readyz",
            "--request-timeout=3s",
        ],
        capture_output=True,
        text=True,
    )
    return proc.returncode == 0 and proc.stdout.strip() == "ok"


def up(scaling: bool = True) -> Path:
    """Start the cluster and the real node (idempotent); return the kubeconfig path.
    `scaling`: with KEDA on the real node (built first if missing; added to a test bed
    that runs without it)."""
    if REAL_NODE:
        build_all(toolchain.CLUSTER_TOOLS, scaling)
    else:
        toolchain.build(toolchain.CLUSTER_TOOLS if scaling else toolchain.CLUSTER_TOOLS_BUT_KEDA)
    if is_up():
        say(f"cluster {CLUSTER!r} already up")  # the real node's start below adds what is new
    else:
        if cluster_dir().exists():
            say("removing a stopped or broken earlier cluster")
            down()
        start_control_plane()
    register_nodes()
    if REAL_NODE:
        start_real_node(scaling)
    say(f"kubeconfig: {KUBECONFIG}")
    return KUBECONFIG


def cluster_dir(cache: Path = CACHE, name: str = CLUSTER) -> Path:
    """kwokctl's directory of the cluster: its binaries, PKI, PID files and logs."""
    return cache / "kwok" / "clusters" / name


def pki_dir() -> Path:
    return cluster_dir() / "pki"


def start_control_plane() -> None:
    say(f"starting cluster {CLUSTER!r} (kwokctl binary runtime on 127.0.0.1)")
    start = time.monotonic()
    binaries = {
        "kube-apiserver": KUBERNETES,
        "kube-controller-manager": KUBERNETES,
        "kube-scheduler": KUBERNETES,
        "etcd": ETCD,
    }
    args = [f"--{name}-binary={tool.path(name)}" for name, tool in binaries.items()]
    args.append(f"--kwok-controller-binary={KWOK.path('kwok')}")
    extra = {
        # The default Service range (a /24) runs out at ~250 Services; the operator
        # benchmark creates hundreds.
        "kube-apiserver": [
            f"service-cluster-ip-range={SERVICE_CIDR}",
            # Pods reach the API server through the `kubernetes` Service, whose endpoint
            # is this address on the test bed's own interface (forwarded to loopback).
            f"advertise-address={realnode.API_IP}",
            # logs, exec and port-forward: the API server calls the real kubelet with the
            # test bed's admin certificate, at the node's InternalIP (never a DNS name).
            f"kubelet-client-certificate={pki_dir() / 'admin.crt'}",
            f"kubelet-client-key={pki_dir() / 'admin.key'}",
            "kubelet-preferred-address-types=InternalIP",
            # The aggregation layer (KEDA's external metrics API): extension API servers
            # trust the front proxy's client certificate (the admin one) through this CA.
            f"requestheader-client-ca-file={pki_dir() / 'ca.crt'}",
            "requestheader-allowed-names=kwok-admin",  # only the proxy's certificate
            "requestheader-username-headers=X-Remote-User",
            "requestheader-group-headers=X-Remote-Group",
            "requestheader-extra-headers-prefix=X-Remote-Extra-",
            "enable-admission-plugins=PodNodeSelector,PodTolerationRestriction",
            # On SIGTERM, close the open watches (their clients reconnect) instead of
            # waiting for them until the request timeout: a restart took 65 s, 60 of them
            # waiting on watches that never end (k0s and OpenShift set it for the same
            # reason). The API-server-restart scenario restarts it this way.
            "shutdown-watch-termination-grace-period=5s",
        ],
        # One instance of each, so no leader election: with it they exit when the API
        # server is away longer than the renew deadline (the API-server-restart scenario),
        # and nothing restarts them.
        "kube-controller-manager": [
            f"service-cluster-ip-range={SERVICE_CIDR}",
            "leader-elect=false",
        ],
        "kube-scheduler": ["leader-elect=false"],
        # KWOK manages only the fake nodes; the real node belongs to its kubelet.
        "kwok-controller": [
            "manage-all-nodes=false",
            "manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        ],
    }
    # In the configuration file rather than --extra-args: kwokctl 0.8 mis-indexes repeated
    # --extra-args once more than one component has them.
    patches = [
        {
            "name": c,
            "extraArgs": [
                dict(zip(("key", "value"), v.split("=", 1), strict=True)) for v in values
            ],
        }
        for c, values in extra.items()
    ]
    CACHE.mkdir(parents=True, exist_ok=True)
    config = CACHE / f"{CLUSTER}.kwokctl.yaml"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
                "kind": "KwokctlConfiguration",
                "componentsPatches": patches,
                "options": {
                    # Every component on loopback only (kwokctl's default is 0.0.0.0).
                    "bindAddress": "127.0.0.1",
                    # The names pods use for the API server: the `kubernetes` Service's IP.
                    "kubeApiserverCertSANs": [realnode.API_IP, service_ip(1)],
                },
            }
        )
    )
    proc = _kwokctl(
        "create", "cluster", "--runtime=binary", f"--kubeconfig={KUBECONFIG}",
        f"--config={config}", *args, "--wait=120s", capture=True,
    )  # fmt: skip
    if proc.returncode:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(
            f"kwokctl could not start the cluster (exit {proc.returncode}); "
            f"component logs: {cluster_dir() / 'logs'}"
        )
    say(f"control plane ready in {time.monotonic() - start:.1f}s")


def service_ip(n: int) -> str:
    import ipaddress

    return str(ipaddress.ip_network(SERVICE_CIDR)[n])


# The real node: on for the default cluster, off with TESTBED_REAL_NODE=0 (a control-plane-
# only test bed). One machine has one real node: other clusters (another TESTBED_NAME) run
# without it unless TESTBED_REAL_NODE=1 and no other cluster has it.
REAL_NODE = os.environ.get("TESTBED_REAL_NODE", "1" if CLUSTER == "transcription" else "0") != "0"


def node_binary(name: str) -> Path:
    """The real node's programs: containerd's, kube-router, and Kubernetes' own."""
    if name == "kube-router":
        return KUBE_ROUTER.path(name)
    return (KUBERNETES if name.startswith("kube") else CONTAINERD).path(name)


def node() -> realnode.Node:
    server = json.loads(kubectl("config", "view", "--minify", "-o", "json"))["clusters"][0]
    port = int(server["cluster"]["server"].rsplit(":", 1)[1])
    return realnode.Node(
        cache=CACHE,
        binaries=node_binary,
        kubeconfig=KUBECONFIG,
        pki=pki_dir(),
        service_cidr=SERVICE_CIDR,
        api_port=port,
        sandbox_image=images.ref(images.PAUSE),
        cluster=CLUSTER,
        dns_ip=service_ip(10),
    )


def start_real_node(scaling: bool = True) -> None:
    owner = realnode.owner(CACHE)
    if owner and owner != CLUSTER:
        say(f"the real node belongs to cluster {owner!r}; {CLUSTER!r} runs without one")
        return
    start = time.monotonic()
    refs = images.refs()  # built by up() (build_all)
    n = node()
    say(
        f"starting the real node {realnode.NODE_NAME} (containerd, kubelet, kube-proxy, kube-router)"
    )
    n.up()
    import_images()
    wait_node_ready(realnode.NODE_NAME, timeout=120)
    n.enforce_network_policies()
    say(f"real node ready in {time.monotonic() - start:.1f}s; images: "
        + ", ".join(refs[i.name] for i in images.ALL if images.built(i)))  # fmt: skip
    install_dns(refs)
    if scaling:
        install_keda(refs)


def import_images(*also: images.Image) -> dict[str, str]:
    """Put every image into the real node's containerd (the base too: tests run throwaway
    pods from it), with the on-demand ones asked for; remove the rest, but for the
    on-demand ones not asked for, which stay as they are: an earlier build's layers stay
    unpacked until its next build is imported, which then sends only the layers that
    changed (`images.source`). (`make test` builds the torch images beside the e2e suite:
    they are imported by the modules that run on them, not by the first import after.)"""
    built = [i for i in images.ALL if images.built(i)]
    wanted = {images.ref(i): i for i in (*built, *also)}
    n = node()
    whole = {r: images.source(i) for r, i in wanted.items()}
    present, unpacked = n.images(), n.unpacked()
    lean = {r: whole[r] if r in present else images.source(i, unpacked) for r, i in wanted.items()}
    keep = frozenset(images.repository(i) for i in images.ON_DEMAND if images.ref(i) not in wanted)
    try:
        n.import_images(lean, keep)
    except RuntimeError as e:  # a layer it counted on went (containerd's garbage collector)
        say(f"importing without the unpacked layers failed ({e}); importing whole")
        n.import_images(whole, keep)
    return images.refs()


def on_demand_image(image: images.Image) -> str:
    """Build (once) and import an image `up` does not build; return its reference."""
    images.build((image,))
    return import_images(image)[image.name]


def install_dns(refs: dict[str, str]) -> None:
    """Cluster DNS, as pods on the real node (see addons.py)."""
    start = time.monotonic()
    addons.apply(kubectl, addons.coredns(refs["coredns"], service_ip(10)))
    kubectl("rollout", "status", "-n", addons.DNS_NAMESPACE, "deployment/coredns", "--timeout=180s")
    say(f"cluster DNS ready in {time.monotonic() - start:.1f}s: CoreDNS")


def keda_installed() -> bool:
    return bool(kubectl("get", "deployment", "keda-operator", "-n", addons.KEDA_NAMESPACE,
                        "--ignore-not-found", "-o", "name", check=False))  # fmt: skip


def add_keda() -> None:
    """KEDA on the running test bed, unless it runs there: its binaries and images built
    first if missing (or waited for while another process builds them: `make test` builds
    KEDA beside the e2e suite's first modules), imported, installed."""
    if keda_installed():
        return
    build_all(toolchain.CLUSTER_TOOLS, scaling=True)
    import_images()
    install_keda(images.refs())


def install_keda(refs: dict[str, str]) -> None:
    """KEDA, as pods on the real node (see addons.py)."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        # kustomize takes relative paths only: a copy of KEDA's config/ next to ours.
        shutil.copytree(KEDA.source(KEDA.module, "config"), Path(d) / "keda")
        kustomization = addons.keda_kustomization(Path("keda") / "minimal", refs)
        (Path(d) / "kustomization.yaml").write_text(json.dumps(kustomization))
        manifests = kubectl("kustomize", "--load-restrictor=LoadRestrictionsNone", d)
    kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=testbed", "-f", "-",
            input=manifests)  # fmt: skip
    for name in ("keda-operator", "keda-metrics-apiserver"):
        kubectl("rollout", "status", "-n", addons.KEDA_NAMESPACE, f"deployment/{name}",
                "--timeout=180s")  # fmt: skip
    kubectl("wait", "--for=condition=Available", "apiservice/v1beta1.external.metrics.k8s.io",
            "--timeout=120s")  # fmt: skip
    say(f"KEDA {KEDA.version} ready in {time.monotonic() - start:.1f}s")


# --------------------------------------------------------------------------- GitOps


def flux_crds() -> list[Path]:
    """Flux's CRDs as its controllers' modules ship them (``config/crd/bases``, copied out
    when Flux was built): source-controller's six kinds (it watches them all) and
    Kustomization."""
    return sorted(
        crd for module, folder in FLUX.data for crd in FLUX.source(module, folder).glob("*.yaml")
    )


@contextlib.contextmanager
def flux() -> Iterator[gitops.Flux]:
    """Flux's source-controller and kustomize-controller against the running test bed, with
    their CRDs. On the way out the Flux objects are deleted while the controllers still run
    (their finalizers go, a Kustomization's pruned objects with it), then the controllers
    stop and the CRDs go: nothing is left."""
    toolchain.build((FLUX,))
    files = [arg for crd in flux_crds() for arg in ("-f", str(crd))]
    kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=testbed", *files)
    kubectl("wait", "--for=condition=Established", "--timeout=60s", *files)
    say(f"starting Flux {FLUX.version} (source-controller, kustomize-controller)")
    running = gitops.start(CACHE, KUBECONFIG, FLUX.path)
    try:
        yield running
    finally:
        kinds = ",".join(gitops.KINDS)
        kubectl("delete", kinds, "--all", "--all-namespaces", "--timeout=120s", check=False)
        gitops.stop(CACHE)
        # Whatever the controllers could not finalize in time: its finalizers would hold
        # the CRDs' deletion.
        left = json.loads(kubectl("get", kinds, "--all-namespaces", "-o", "json", check=False)
                          or '{"items": []}')["items"]  # fmt: skip
        for obj in left:
            meta = obj["metadata"]
            kubectl("patch", obj["kind"].lower(), meta["name"], "-n", meta["namespace"],
                    "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
        kubectl("delete", "--ignore-not-found", "--timeout=60s", *files, check=False)
        say("Flux stopped, its objects and CRDs removed")


def wait_node_ready(name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = kubectl("get", "node", name, "-o", "json", check=False)
        if out:
            conditions = json.loads(out).get("status", {}).get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return
        time.sleep(1)
    raise SystemExit(
        f"the real node {name} did not become Ready within {timeout:.0f}s; "
        f"logs: {CACHE / 'node' / 'logs'}"
    )


def register_nodes() -> None:
    manifests = {"apiVersion": "v1", "kind": "List", "items": [node_manifest(n) for n in NODES]}
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(manifests))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
        ready = {
            n["metadata"]["name"]
            for n in nodes
            for c in n.get("status", {}).get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True"
        }
        if {n["name"] for n in NODES} <= ready:
            say(f"nodes ready: {', '.join(sorted(ready))}")
            return
        time.sleep(0.5)
    raise SystemExit("the fake nodes did not become Ready within 60s; is the kwok controller up?")


def down() -> None:
    """Stop the cluster and the real node; fail, naming them, if any of the node's
    processes survive (they would hold memory and CPU under the next run)."""
    gitops.stop(CACHE)  # Flux's controllers, if a test that started them was killed
    ours = realnode.owner(CACHE) in (CLUSTER, "")  # the node, not another cluster's
    kept = keep_logs(node=ours)
    if ours:
        realnode.teardown(CACHE, node_binary)
        if left := realnode.leftovers(CACHE):
            lines = "\n".join(f"  {pid} {cmd}" for pid, cmd in sorted(left.items()))
            raise SystemExit(f"the real node left {len(left)} process(es) running:\n{lines}")
        if rules := realnode.leftover_rules():
            raise SystemExit(f"kube-router left iptables chains or ipsets: {', '.join(rules)}")
    if not KWOK.path("kwokctl").exists():
        return
    _kwokctl("delete", "cluster", "--kubeconfig", str(KUBECONFIG), capture=True)
    _stop_leftovers(cluster_dir())
    KUBECONFIG.unlink(missing_ok=True)
    shutil.rmtree(cluster_dir(), ignore_errors=True)
    say(f"cluster {CLUSTER!r} removed" + (f"; its logs kept in {kept}" if kept else ""))


def keep_logs(cache: Path = CACHE, cluster: str = CLUSTER, node: bool = True) -> Path | None:
    """Move the control plane's and the real node's logs (kubelet, containerd, kube-router,
    kube-apiserver, ...) to `<cache>/last-logs`, replacing the previous run's: what a failed
    e2e test needs to be understood outlives `testbed down`. A rename on the same file
    system: the daemons still running write on into the moved files until they stop.
    `node`: the real node's too (False when it belongs to another cluster, still running).
    Returns where they are; None when there were none."""
    sources = {"cluster": cluster_dir(cache, cluster) / "logs"}
    if node:
        sources["node"] = realnode.node_dir(cache) / "logs"
    present = {name: src for name, src in sources.items() if src.is_dir()}
    if not present:
        return None
    kept = cache / "last-logs"
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    for name, src in present.items():
        src.rename(kept / name)
    return kept


def _stop_leftovers(cluster: Path) -> None:
    """Stop what still runs from the cluster's directory after kwokctl's delete (a component
    restarted outside kwokctl, as the e2e API-server restart does): it would hold the
    cluster's ports, and a later run would take it for the cluster's own."""
    for pid in host.pids():
        program = next(iter(host.argv(pid)), "")
        if program.startswith(f"{cluster}/"):  # kwokctl starts them as <cluster>/bin/<name>
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def status() -> int:
    for t in toolchain.ALL_TOOLS:
        state = "built" if t.built else "not built"
        print(f"{t.name:12} {t.version:10} {state:10} {t.dir}")
    for image in images.ALL:
        state = "built" if images.built(image) else "not built"
        print(f"{'image':12} {image.name:10} {state:10} {images.ref(image)}")
    processes = realnode.running(CACHE)
    owner = realnode.owner(CACHE)
    print(
        f"real node {realnode.NODE_NAME}: "
        + (f"running for cluster {owner!r}" if owner else "down")
        + "".join(f", {n} {'up' if up else 'DOWN'}" for n, up in processes.items() if owner)
    )
    if is_up():
        print(f"cluster {CLUSTER!r}: up, kubeconfig {KUBECONFIG}")
        print(kubectl("get", "nodes", "-o", "wide"))
        return 0
    print(f"cluster {CLUSTER!r}: down")
    return 1
