"""The test bed's real worker node: kubelet, kube-proxy, containerd and runc on this machine.

KWOK simulates the GPU nodes; this node really runs what the operator deploys (the CPU
worker, the frontend, the operator itself). Everything it needs is created by the test bed
and removed by `down()`:

- an interface ``tbhost0`` (one end of a veth pair) holding the node's address (``NODE_IP``) and the address the
  API server is reachable on from pods (``API_IP``); nothing listens on an external interface;
- a CNI bridge ``tbcni0`` for the pod network (``POD_CIDR``): no masquerading and no default
  route in the pods, only routes to the Service range and the test bed's own addresses;
- containerd v2 (built from Go modules) with Debian's runc, its state in the cache
  directory and in ``/run/transcription-testbed``;
- the kubelet (cgroups v1 with the cgroupfs driver, swap tolerated, loose eviction) and
  kube-proxy in iptables mode, both built from the same pinned Kubernetes modules as the
  control plane;
- kube-router's firewall controller alone, which enforces NetworkPolicies with iptables and
  ipset on the pods' addresses (the bridge CNI enforces none); traffic from the node itself
  (the kubelet's probes, the tests on this machine) is always let through, as kube-router
  does on any cluster.

The API server authenticates to the kubelet with the test bed's admin client certificate;
the kubelet checks it against the test bed's CA and authorizes through the API server.

Only the standard library is used (with ``toolchain`` and ``testkit.host``, which use
nothing else), like cluster.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

from testkit import host
from toolchain import say

NODE_NAME = "real-node-1"
HOST_IF = "tbhost0"
BRIDGE = "tbcni0"
# TEST-NET-3 (RFC 5737): documentation addresses, on an interface the test bed creates.
API_IP = "203.0.113.1"
NODE_IP = "203.0.113.2"
TESTBED_NET = "203.0.113.0/24"
POD_CIDR = "10.244.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
RUN = Path("/run/transcription-testbed")
CNI_BIN = Path("/usr/lib/cni")
RUNC = shutil.which("runc") or "/usr/sbin/runc"
SOCKET = RUN / "containerd" / "containerd.sock"
PROCESSES = ("apiserver-proxy", "containerd", "kubelet", "kube-proxy", "kube-router")
SIMULATED_TAINT = "testbed.transcription.dev/simulated"


def sh(*args: str, check: bool = True, input: str | None = None) -> str:
    proc = subprocess.run(list(args), capture_output=True, text=True, input=input)
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


class Node:
    """One real node: its directories, configuration files and processes."""

    def __init__(
        self,
        cache: Path,
        binaries: Callable[[str], Path],
        kubeconfig: Path,
        pki: Path,
        service_cidr: str,
        api_port: int,
        sandbox_image: str,
        cluster: str,
        dns_ip: str,
    ) -> None:
        self.dir = node_dir(cache)
        self.cluster = cluster
        self.bin = binaries
        self.kubeconfig = kubeconfig
        self.pki = pki
        self.service_cidr = service_cidr
        self.api_port = api_port
        self.sandbox_image = sandbox_image
        self.dns_ip = dns_ip
        self.logs = self.dir / "logs"

    # ----------------------------------------------------------------- paths

    @property
    def containerd_root(self) -> Path:
        return containerd_root(self.dir.parent)

    @property
    def socket(self) -> Path:
        return SOCKET

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    # ----------------------------------------------------------------- up

    def up(self) -> None:
        for d in (self.dir, self.logs, RUN):
            d.mkdir(parents=True, exist_ok=True)
        (self.dir / "owner").write_text(self.cluster)
        self._network()
        self._start("apiserver-proxy", self._proxy_cmd())
        self._containerd()
        self._start("kubelet", self._kubelet_cmd())
        self._start("kube-proxy", self._kube_proxy_cmd())

    def enforce_network_policies(self) -> None:
        """Start kube-router's firewall; it needs the Node object, so after registration."""
        self._start("kube-router", self._kube_router_cmd())

    def _network(self) -> None:
        state = self.dir / "host-state.json"
        if not state.exists():
            forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
            state.write_text(json.dumps({"ip_forward": forward}))
        if not Path(f"/sys/class/net/{HOST_IF}").exists():
            # What a `dummy` link does (the kernel here has none): one end of a veth pair
            # whose peer stays down, so anything sent through it is dropped.
            sh("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", f"{HOST_IF}p")
        sh("ip", "link", "set", HOST_IF, "up")
        for ip in (API_IP, NODE_IP):
            sh("ip", "addr", "replace", f"{ip}/32", "dev", HOST_IF)
        # Service IPs no rule matches stay on the dummy interface (dropped), never leave
        # through the default route; kube-proxy's rules rewrite the rest before routing.
        sh("ip", "route", "replace", self.service_cidr, "dev", HOST_IF)
        # Pods reply to the test bed's addresses through the bridge; the host routes
        # between the bridge and its own addresses only.
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        net_d = self.dir / "cni" / "net.d"
        net_d.mkdir(parents=True, exist_ok=True)
        _write(net_d / "10-testbed.conflist", json.dumps(self.cni_config(), indent=2))

    def cni_config(self) -> dict[str, object]:
        return {
            "cniVersion": "1.0.0",
            "name": "testbed",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.dir / "cni" / "ipam"),
                        "ranges": [[{"subnet": POD_CIDR}]],
                        # No default route: pods reach Services and the test bed, nothing else.
                        "routes": [{"dst": self.service_cidr}, {"dst": TESTBED_NET}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _proxy_cmd(self) -> list[str]:
        """The API server listens on loopback only; pods reach it (through the `kubernetes`
        Service, whose endpoint is API_IP) via this forwarder on the test bed's address."""
        return [
            "socat",
            f"TCP-LISTEN:{self.api_port},bind={API_IP},fork,reuseaddr",
            f"TCP:127.0.0.1:{self.api_port}",
        ]

    def containerd_config(self) -> str:
        state = RUN / "containerd"
        return f"""\
version = 3
root = "{self.containerd_root}"
state = "{state}"

[grpc]
  address = "{self.socket}"

[ttrpc]
  address = "{self.socket}.ttrpc"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{self.sandbox_image}"

[plugins."io.containerd.cri.v1.runtime"]
  # Root here lacks CAP_SYS_RESOURCE: nothing may lower oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{self.dir / "cni" / "net.d"}"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        Root = "{RUN / "runc"}"
        SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""

    def _containerd(self) -> None:
        cfg = self.dir / "containerd.toml"
        _write(cfg, self.containerd_config())
        shim_dir = self.bin("containerd-shim-runc-v2").parent
        env = {"PATH": f"{shim_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self._start("containerd", [str(self.bin("containerd")), "--config", str(cfg)], env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.ctr("version", check=False) is not None:
                return
            time.sleep(0.5)
        raise SystemExit(f"containerd did not start; see {self.logs / 'containerd.log'}")

    def ctr(self, *args: str, check: bool = True, timeout: float = 60,
            stdin: IO[bytes] | None = None) -> str | None:  # fmt: skip
        proc = subprocess.run(
            [str(self.bin("ctr")), "--address", str(self.socket), "-n", "k8s.io", *args],
            capture_output=True,
            stdin=stdin,
            timeout=timeout,
        )
        if proc.returncode:
            if check:
                raise RuntimeError(f"ctr {' '.join(args)}: {proc.stderr.decode().strip()}")
            return None
        return str(proc.stdout.decode())

    def images(self) -> dict[str, str]:
        """Every image reference in containerd -> the digest it points at."""
        out = self.ctr("images", "ls") or ""
        rows = [line.split() for line in out.splitlines()[1:]]
        return {row[0]: row[2] for row in rows if len(row) > 2}

    def unpacked(self) -> frozenset[str]:
        """The chain IDs of the layers unpacked here: the names of containerd's committed
        snapshots (overlayfs, the CRI's snapshotter)."""
        out = self.ctr("snapshots", "--snapshotter", "overlayfs", "ls") or ""
        rows = [line.split() for line in out.splitlines()[1:]]
        return frozenset(row[0] for row in rows if row and row[-1] == "Committed")

    def import_images(
        self, sources: dict[str, Path | list[str]], keep: frozenset[str] = frozenset()
    ) -> None:
        """Import each wanted reference that is missing, from its archive or from the
        standard output of its command (an image streamed from the builder's store), then
        remove every other image but those of the repositories in `keep`.

        Imported blobs are discarded once unpacked (``--discard-unpacked-layers``): the
        snapshots are what containers run from, and a second copy of a torch image's layers
        would cost gigabytes. The CRI plugin names each image a second time by its ID
        (``sha256:...``); removing only the tag would leave that name holding the old
        layers, and the store would grow with every rebuild. So every reference is dropped
        whose target no wanted reference shares, and containerd's garbage collector frees
        the content and snapshots."""
        present = self.images()
        for ref, source in sources.items():
            if ref not in present:
                self.import_image(ref, source)
        present = self.images()
        missing = [ref for ref in sources if ref not in present]
        if missing:
            raise SystemExit(f"importing did not yield {', '.join(missing)}")
        stale = stale_images(present, sources, keep)
        if stale:
            say(f"removing {len(stale)} stale image references from containerd")
            self.ctr("images", "rm", "--sync", *stale, check=False, timeout=300)

    def import_image(self, ref: str, source: Path | list[str]) -> None:
        """Import one image from its archive or from its command's standard output."""
        say(f"importing {ref} into containerd")
        if isinstance(source, Path):
            self.ctr("images", "import", "--local", "--discard-unpacked-layers", str(source),
                     timeout=900)  # fmt: skip
            return
        producer = subprocess.Popen(source, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            self.ctr("images", "import", "--local", "--discard-unpacked-layers", "-",
                     stdin=producer.stdout, timeout=1800)  # fmt: skip
        finally:
            assert producer.stdout is not None
            producer.stdout.close()
            err = producer.stderr.read().decode() if producer.stderr else ""
            if producer.wait() != 0:
                raise RuntimeError(f"{shlex.join(source)[:200]} failed: {err.strip()}")

    def kubelet_config(self) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # this machine has cgroups v1
            "cgroupDriver": "cgroupfs",  # no systemd
            "failSwapOn": False,
            # Pods resolve the cluster's names through its CoreDNS, and nothing else: the
            # node's own resolver is not passed on.
            "resolvConf": "",
            "clusterDNS": [self.dns_ip],
            "clusterDomain": "cluster.local",
            "makeIPTablesUtilChains": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": NODE_IP,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.pki / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "podCIDR": POD_CIDR,
            "maxPods": 110,
            "serializeImagePulls": False,
            # A shared development machine: evict only when it is nearly full.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "nodeStatusReportFrequency": "10s",
        }

    def _kubelet_cmd(self) -> list[str]:
        cfg = self.dir / "kubelet.json"
        _write(cfg, json.dumps(self.kubelet_config(), indent=2))
        labels = {
            "kubernetes.io/os": "linux",
            "type": "real",
            "node.transcription.dev/real": "true",
        }
        return [
            str(self.bin("kubelet")),
            f"--config={cfg}",
            f"--kubeconfig={self.kubeconfig}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            f"--root-dir={self.kubelet_root}",
            f"--cert-dir={self.dir / 'kubelet-pki'}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
            "--v=1",
        ]

    def kube_proxy_config(self) -> dict[str, object]:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig)},
            "hostnameOverride": NODE_NAME,
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            "mode": "iptables",
            "clusterCIDR": CLUSTER_CIDR,
            "nodePortAddresses": ["127.0.0.1/32"],
            # Leave the machine's conntrack sysctls alone.
            "conntrack": {"maxPerCore": 0, "min": 0},
        }

    def _kube_proxy_cmd(self) -> list[str]:
        cfg = self.dir / "kube-proxy.json"
        _write(cfg, json.dumps(self.kube_proxy_config(), indent=2))
        return [str(self.bin("kube-proxy")), f"--config={cfg}", "--v=1"]

    def _kube_router_cmd(self) -> list[str]:
        """NetworkPolicy only: no pod routing, service proxy, load balancer or CNI of its
        own, and nothing listening (health and metrics off)."""
        return [
            str(self.bin("kube-router")),
            f"--kubeconfig={self.kubeconfig}",
            f"--hostname-override={NODE_NAME}",
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            "--run-loadbalancer=false",
            "--enable-cni=false",
            f"--service-cluster-ip-range={self.service_cidr}",
            "--health-port=0",
            "--metrics-port=0",
            "--v=1",
        ]

    def stop(self, name: str) -> None:
        """Stop one of the node's daemons as systemd would (SIGTERM, then SIGKILL after a
        grace period); pods keep running (their containers belong to the shims)."""
        _stop(self.dir, name)

    def start(self, name: str) -> None:
        """Start the kubelet or containerd (again) with its usual command line."""
        if name == "containerd":
            self._containerd()
        elif name == "kubelet":
            self._start("kubelet", self._kubelet_cmd())
        else:
            raise ValueError(f"cannot start {name!r} alone: kubelet or containerd")

    # ----------------------------------------------------------------- processes

    def _start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        pid = self._pid(name)
        if pid and host.alive(pid):
            return
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        (self.dir / f"{name}.pid").write_text(str(proc.pid))

    def _pid(self, name: str) -> int | None:
        return _pid(self.dir, name)


def stale_images(present: dict[str, str], wanted: Iterable[str], keep: frozenset[str]) -> list[str]:
    """The references to remove from containerd (`present`: reference -> target digest):
    those whose target no wanted reference, nor any reference of a repository in `keep`,
    points at. The CRI's second name of each image (its ID, ``sha256:...``) goes with it."""
    targets = {present[ref] for ref in wanted} | {
        digest for ref, digest in present.items() if ref.rsplit(":", 1)[0] in keep
    }
    return [ref for ref, digest in present.items() if digest not in targets]


def _write(path: Path, text: str) -> None:
    """Write a component's configuration only when it changed, and atomically: kube-proxy
    exits when its file changes under it (a second `up` rewrote it while it ran)."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def node_dir(cache: Path) -> Path:
    return cache / "node"


def containerd_root(cache: Path) -> Path:
    """containerd's root; kept across down/up, because the imported images live there."""
    return cache / "containerd-root"


def _pid(d: Path, name: str) -> int | None:
    try:
        return int((d / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None


def running(cache: Path) -> dict[str, bool]:
    d = node_dir(cache)
    return {n: bool((pid := _pid(d, n)) and host.alive(pid)) for n in PROCESSES}


def owner(cache: Path) -> str:
    """The cluster whose real node runs on this machine; empty when none does."""
    if not any(running(cache).values()):
        return ""
    try:
        return (node_dir(cache) / "owner").read_text().strip()
    except OSError:
        return ""


def _stop(d: Path, name: str, grace: float = 10.0) -> None:
    pid = _pid(d, name)
    if pid and host.alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while host.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if host.alive(pid):
            os.kill(pid, signal.SIGKILL)
    (d / f"{name}.pid").unlink(missing_ok=True)


def teardown(cache: Path, binary: Callable[[str], Path]) -> None:
    """Stop the node and put the machine back as it was; the image store stays."""
    d = node_dir(cache)
    _stop(d, "kube-router")
    _remove_kube_router_rules()
    _stop(d, "kubelet")
    _kill_containers()
    _kill_pod_processes()
    _stop(d, "containerd")
    _kill_matching(rf"containerd-shim-runc-v2 .*-address {re.escape(str(SOCKET))}")
    _stop(d, "kube-proxy")
    if (kube_proxy := binary("kube-proxy")).exists():
        # Removes every chain and rule kube-proxy made (KUBE-SERVICES, KUBE-FIREWALL, ...).
        subprocess.run([str(kube_proxy), "--cleanup"], capture_output=True)
    _stop(d, "apiserver-proxy")
    root = containerd_root(cache)
    for path in (d / "kubelet", RUN, root):
        _unmount_below(path)
    _remove_cgroups("kubepods")
    for veth in _bridge_veths():
        sh("ip", "link", "del", veth, check=False)
    for link in (BRIDGE, HOST_IF):
        if Path(f"/sys/class/net/{link}").exists():
            sh("ip", "link", "del", link, check=False)
    state = d / "host-state.json"
    if state.exists():
        forward = json.loads(state.read_text()).get("ip_forward", "0")
        Path("/proc/sys/net/ipv4/ip_forward").write_text(forward)
    # Containers, sandboxes and snapshots in use went with the state; images stay.
    for leftover in ("io.containerd.grpc.v1.cri", "io.containerd.sandbox.controller.v1.shim"):
        shutil.rmtree(root / leftover, ignore_errors=True)
    shutil.rmtree(RUN, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)


def _kill_containers() -> None:
    """Delete every container runc knows of. containerd v2's shim keeps runc's state per
    containerd namespace (``<root>/k8s.io``), not in the configured root itself."""
    root = RUN / "runc"
    if not root.exists():
        return
    for state in [root, *(d for d in root.iterdir() if d.is_dir())]:
        out = sh(RUNC, "--root", str(state), "list", "-q", check=False)
        for cid in out.split():
            sh(RUNC, "--root", str(state), "delete", "--force", cid, check=False)


def pod_processes() -> dict[int, str]:
    """The processes in the pods' cgroups (kubepods), by PID, with their command lines."""
    found: dict[int, str] = {}
    for procs in Path("/sys/fs/cgroup").glob("*/kubepods/**/cgroup.procs"):
        with contextlib.suppress(OSError):
            for pid in map(int, procs.read_text().split()):
                if host.alive(pid) and pid not in found:
                    found[pid] = _cmdline(pid)
    return found


def leftovers(cache: Path) -> dict[int, str]:
    """What of the real node still runs: processes in the pods' cgroups, containerd's shims
    for the node's socket, and the node's own daemons (by their PID files' directory or
    their command lines). Empty after a clean `teardown`."""
    found = pod_processes()
    marks = (str(SOCKET), str(node_dir(cache)), str(RUN), f"--hostname-override={NODE_NAME}")
    for pid in host.pids():
        cmd = _cmdline(pid)
        if any(m in cmd for m in marks) and host.alive(pid):
            found[pid] = cmd
    return found


# kube-router's NetworkPolicy chains (filter table) and its ipsets' prefix.
KUBE_ROUTER_CHAINS = ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-")


def _kube_router_chains() -> list[str]:
    rules = sh("iptables", "-t", "filter", "-S", check=False).splitlines()
    return [r.split()[1] for r in rules if r.startswith("-N ") and r.split()[1].startswith(KUBE_ROUTER_CHAINS)]  # fmt: skip


def _kube_router_sets() -> list[str]:
    return [n for n in sh("ipset", "list", "-n", check=False).split() if n.startswith("KUBE-")]


def _remove_kube_router_rules() -> None:
    """What `kube-router --cleanup-config` should do (v2.1.0's panics in its service-proxy
    cleanup before it reaches the firewall's): the jumps into its chains, the chains, then
    its ipsets, which the chains' rules reference."""
    ours = set(_kube_router_chains())
    for rule in sh("iptables", "-t", "filter", "-S", check=False).splitlines():
        words = shlex.split(rule)
        if words[:1] == ["-A"] and words[1] not in ours and ours & set(words):
            sh("iptables", "-t", "filter", "-D", *words[1:], check=False)
    for op in ("-F", "-X"):  # flush all first: the chains jump to one another
        for chain in sorted(ours):
            sh("iptables", "-t", "filter", op, chain, check=False)
    for name in _kube_router_sets():
        sh("ipset", "destroy", name, check=False)


def leftover_rules() -> list[str]:
    """kube-router's iptables chains and ipsets still present (none after `teardown`)."""
    return _kube_router_chains() + _kube_router_sets()


def _cmdline(pid: int) -> str:
    return " ".join(host.argv(pid)) or "?"


def _kill_pod_processes(timeout: float = 10.0) -> None:
    """SIGKILL what is still in the pods' cgroups once runc has deleted what it knows of
    (a container whose runc state went missing); fail, naming them, if any survive."""
    deadline = time.monotonic() + timeout
    while (left := pod_processes()) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    if left:
        lines = "\n".join(f"  {pid} {cmd}" for pid, cmd in sorted(left.items()))
        raise SystemExit(
            f"the test bed's pods left {len(left)} process(es) that survive SIGKILL:\n{lines}\n"
            "they hold memory and CPU under the next run: find what keeps them (a stuck "
            "mount, an uninterruptible wait) and kill them before 'python -m testbed up'"
        )


def _kill_matching(pattern: str) -> None:
    rx = re.compile(pattern)
    for pid in host.pids():
        if rx.search(" ".join(host.argv(pid))):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _unmount_below(root: Path) -> None:
    """Unmount every mount at or below `root`, deepest first (the kubelet bind-mounts its
    own root directory; containerd mounts sandboxes' network namespaces and shm)."""
    prefix = str(root)
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            mounts.append(point)
    for point in sorted(set(mounts), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _remove_cgroups(name: str) -> None:
    base = Path("/sys/fs/cgroup")
    if not base.exists():
        return
    for controller in base.iterdir():
        top = controller / name
        if not top.is_dir():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts))
        for d in [*reversed(dirs), top]:
            with contextlib.suppress(OSError):
                d.rmdir()


def _bridge_veths() -> list[str]:
    brif = Path(f"/sys/class/net/{BRIDGE}/brif")
    return [p.name for p in brif.iterdir()] if brif.exists() else []
