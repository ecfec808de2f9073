"""The pinned tools: Go programs built from source, for the test bed, the checks and a release.

Kubernetes (control plane, kubelet, kube-proxy, kubectl), etcd, KWOK, helm, containerd,
CoreDNS, KEDA, kube-router, Flux's controllers, promtool and actionlint are compiled from Go
modules fetched through the module proxy. Each tool's version is pinned by its wrapper
module, ``tools/<tool>/go.mod`` in this package; the build lands in
``$TESTBED_CACHE/<tool>-<version>-<digest>/`` (default
``~/.cache/transcription-operator/testbed``), where the digest names the build flags and the
wrapper's files (go.mod, go.sum, its Go code), and is reused until one of them changes.

The test bed (``testbed``), the release scripts (``release``, ``charts``) and the suites that
run a checker (``testkit.tools``) find their binaries here. Only the standard library is
used, so this works before the virtual environment exists (the release workflow runs it so).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path

from toolchain import flux as flux_trim
from toolchain import keda as keda_trim

TOOLS = Path(__file__).resolve().parent / "tools"
CACHE = Path(
    os.environ.get("TESTBED_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    / "transcription-operator"
    / "testbed"
)


def say(msg: str, who: str = "testbed") -> None:
    """A progress line on stderr, tagged with who says it."""
    print(f"[{who}] {msg}", file=sys.stderr, flush=True)


def _command() -> str:
    """This process's command, short: `python3 -m testbed build`, `python pytest -m e2e`."""
    argv = [Path(a).name if "/" in a else a for a in sys.orig_argv[:4]]
    return " ".join(argv[: argv.index("-c") + 1] if "-c" in argv else argv)


@contextlib.contextmanager
def exclusive(lock: Path, what: str) -> Iterator[None]:
    """Hold `lock` (an advisory lock on a file) while building `what`: another process that
    builds the same (`make test` builds KEDA beside the e2e suite, whose KEDA fixture may ask
    for it first) waits here and is told who holds it, then finds the build done."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            say(f"waiting for {what}: {holder} is building it")
            start = time.monotonic()
            fcntl.flock(f, fcntl.LOCK_EX)
            say(f"    {holder} ended after {time.monotonic() - start:.0f}s of waiting")
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()} ({_command()})")
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Trim:
    """One of a tool's modules built from a trimmed copy of its source, not the module cache's
    (KEDA without the scalers the test bed never uses: toolchain/keda.py; Flux without the
    cloud SDKs: toolchain/flux.py)."""

    module: str
    apply: Callable[[Path], None]  # edits a writable copy of the module's source in place
    recipe: str  # what the trimming depends on, for the cache entry's digest


@dataclass(frozen=True)
class Tool:
    """One wrapper module under ``tools/`` and the binaries built from it."""

    name: str
    module: str  # the module whose version names the cache entry
    binaries: dict[str, str]  # binary name -> package path
    tags: tuple[str, ...] = field(default=())
    also: tuple[str, ...] = field(default=())  # other modules the wrapper pins, built too
    # Folders of its modules' sources the test bed reads (manifests, CRDs): (module, folder),
    # copied beside the binaries when they are built, so that Go's caches can go.
    data: tuple[tuple[str, str], ...] = field(default=())
    trims: tuple[Trim, ...] = field(default=())

    @property
    def modules(self) -> tuple[str, ...]:
        return (self.module, *self.also)

    @property
    def tag_flags(self) -> list[str]:
        """The `go` command's flags for the build tags (none without tags)."""
        return ["-tags", ",".join(self.tags)] if self.tags else []

    @property
    def gomod(self) -> Path:
        return TOOLS / self.name / "go.mod"

    @cached_property
    def version(self) -> str:
        return pinned_version(self.gomod, self.module)

    @cached_property
    def dir(self) -> Path:
        """The cache entry: the pinned version, plus a digest of the recipe so that any
        change to it rebuilds: the build flags, and the wrapper's files whole (go.mod and
        go.sum pin every module of the build, indirect ones included, so that a bumped
        `golang.org/x/net` is a new binary too; CoreDNS' main.go lists its plugins)."""
        recipe = ldflags(self) + "|" + " ".join(GC_FLAGS)
        recipe += f"|tags={','.join(self.tags)}" if self.tags else ""
        wrapper = TOOLS / self.name
        recipe += "".join(
            f"|{p.name}@{hashlib.sha256(p.read_bytes()).hexdigest()}"
            for p in sorted([*wrapper.rglob("*.go"), *wrapper.glob("go.*")])  # go.mod, go.sum
        )
        recipe += "".join(f"|{trim.module}:{trim.recipe}" for trim in self.trims)
        digest = hashlib.sha256(recipe.encode()).hexdigest()[:8]
        return CACHE / f"{self.name}-{self.version}-{digest}"

    def path(self, binary: str) -> Path:
        return self.dir / binary

    @property
    def built(self) -> bool:
        return all(self.path(b).exists() for b in self.binaries) and all(
            self.source(m, d).is_dir() for m, d in self.data
        )

    def source(self, module: str, folder: str) -> Path:
        """A folder of one of its modules' sources, as copied beside the binaries."""
        return self.dir / "src" / module / folder


def pinned_version(gomod: Path, module: str) -> str:
    """The version a go.mod requires of ``module``."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", gomod.read_text(), re.M)
    if not match:
        raise SystemExit(f"{gomod} does not require {module}")
    return match.group(1)


def _kube_ldflags(version: str) -> list[str]:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return flags


def _helm_kube_ldflags() -> list[str]:
    """Helm's default Kubernetes version (for `helm template`/`lint`): its client-go's."""
    client_go = pinned_version(TOOLS / "helm" / "go.mod", "k8s.io/client-go")
    minor = str(int(client_go.split(".")[1]))
    return [
        f"-X helm.sh/helm/v3/pkg/{pkg}.{var}={val}"
        for pkg in ("chartutil", "lint/rules")
        for var, val in (("k8sVersionMajor", "1"), ("k8sVersionMinor", minor))
    ]


KUBERNETES = Tool(
    "kubernetes",
    "k8s.io/kubernetes",
    {
        "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
        "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
        "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        # The real node's agents, from the same modules and with the same version flags.
        "kubelet": "k8s.io/kubernetes/cmd/kubelet",
        "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
    },
)
CONTAINERD = Tool(
    "containerd",
    "github.com/containerd/containerd/v2",
    {
        "containerd": "github.com/containerd/containerd/v2/cmd/containerd",
        "containerd-shim-runc-v2": "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
        "ctr": "github.com/containerd/containerd/v2/cmd/ctr",
    },
    tags=("no_btrfs", "no_devmapper", "no_zfs"),
)
ETCD = Tool("etcd", "go.etcd.io/etcd/server/v3", {"etcd": "go.etcd.io/etcd/server/v3"})
KWOK = Tool(
    "kwok",
    "sigs.k8s.io/kwok",
    {"kwok": "sigs.k8s.io/kwok/cmd/kwok", "kwokctl": "sigs.k8s.io/kwok/cmd/kwokctl"},
)
HELM = Tool("helm", "helm.sh/helm/v3", {"helm": "helm.sh/helm/v3/cmd/helm"})
# Cluster add-ons that run as pods on the real node (their images hold these binaries).
COREDNS = Tool("coredns", "github.com/coredns/coredns", {"coredns": "."})
KEDA = Tool(
    "keda",
    "github.com/kedacore/keda/v2",
    {
        # `go build` names each binary after its package directory.
        "operator": "github.com/kedacore/keda/v2/cmd/operator",
        "adapter": "github.com/kedacore/keda/v2/cmd/adapter",
    },
    data=(("github.com/kedacore/keda/v2", "config"),),
    trims=(Trim(keda_trim.MODULE, keda_trim.trim, keda_trim.recipe()),),
)
# Checkers that `make test` runs (not part of the cluster): actionlint lints the release
# workflows, promtool tests the alert rules and the dashboard's queries.
ACTIONLINT = Tool(
    "actionlint",
    "github.com/rhysd/actionlint",
    {"actionlint": "github.com/rhysd/actionlint/cmd/actionlint"},
)
PROMTOOL = Tool(
    "prometheus",
    "github.com/prometheus/prometheus",
    {"promtool": "github.com/prometheus/prometheus/cmd/promtool"},
    # Without the service-discovery plugins (cloud SDKs, client-go): promtool's rule tests
    # need none, and the build is a fraction of the time.
    tags=("remove_all_sd",),
)
# The real node's NetworkPolicy engine: kube-router's firewall controller alone (iptables
# and ipset, on pod addresses, so it works beside the bridge CNI), without its router,
# service proxy and load balancer. The only version the module proxy serves, v2.1.0, has an
# advisory against its service proxy (GHSA-phqm-jgc3-qf8g: external and load-balancer IPs
# unchecked), the one part the test bed does not run.
KUBE_ROUTER = Tool(
    "kube-router",
    "github.com/cloudnativelabs/kube-router/v2",
    {"kube-router": "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"},
)
# Flux's source-controller and kustomize-controller, for the GitOps e2e test only (the test
# bed starts them as host processes). v1.9.6: the module proxy lacks modules v1.10.x imports
# (see the wrapper's go.mod). No build tags cut their cloud SDKs (their sources have none
# but fuzzing's and integration tests'): they are built from trimmed copies of the two
# controllers and of fluxcd/pkg/auth, with a GitRepository's and a Kustomization's plain
# paths only (toolchain/flux.py): 1,328 packages instead of 2,576, cold 116 s instead of 217 s
# on 2 cores, 48 + 51 MiB. The wrapper shares KEDA's dependency versions.
FLUX = Tool(
    "flux",
    "github.com/fluxcd/source-controller",
    {
        "source-controller": "github.com/fluxcd/source-controller",
        "kustomize-controller": "github.com/fluxcd/kustomize-controller",
    },
    also=("github.com/fluxcd/kustomize-controller",),
    data=(
        ("github.com/fluxcd/source-controller", "config/crd/bases"),
        ("github.com/fluxcd/kustomize-controller", "config/crd/bases"),
    ),
    trims=tuple(
        Trim(p.module, partial(flux_trim.apply, p), flux_trim.recipe(p)) for p in flux_trim.PLANS
    ),
)
CLUSTER_TOOLS = (KUBERNETES, ETCD, KWOK, HELM, CONTAINERD, COREDNS, KEDA, KUBE_ROUTER)
CLUSTER_TOOLS_BUT_KEDA = tuple(t for t in CLUSTER_TOOLS if t is not KEDA)
ALL_TOOLS = (*CLUSTER_TOOLS, ACTIONLINT, PROMTOOL, FLUX)


def ldflags(tool: Tool) -> str:
    v = tool.version
    extra = {
        "kubernetes": _kube_ldflags(v),
        "etcd": [f"-X go.etcd.io/etcd/api/v3/version.GitSHA={v}"],
        "kwok": [f"-X sigs.k8s.io/kwok/pkg/consts.Version={v}"],
        "helm": [f"-X helm.sh/helm/v3/internal/version.version={v}"],
        "containerd": [f"-X github.com/containerd/containerd/v2/version.Version={v}"],
        "coredns": [],  # it reports the version of its module
        "keda": [f"-X github.com/kedacore/keda/v2/version.Version={v}"],
        "kube-router": [f"-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version={v}"],
        # As its release binaries say it: "1.7.12" (its usage header links the docs of v1.7.12).
        "actionlint": [f"-X github.com/rhysd/actionlint.version={v.lstrip('v')}"],
        "prometheus": [f"-X github.com/prometheus/common/version.Version={v.lstrip('v')}"],
        "flux": [],  # neither controller has a version variable to set
    }[tool.name]
    if tool.name == "helm":  # read from helm's go.mod: only for helm
        extra += _helm_kube_ldflags()
    return " ".join(["-s", "-w", *extra])


# The compiler's flags: every package without DWARF (the linker's -w drops it from the
# binaries anyway; helm's came out the same size, though not byte for byte the same: the
# compile is shorter and its cache smaller), and the tools' own
# packages without inlining (`-l`), while Go's standard library keeps it (its runtime, maps
# and allocator run under every tool; the last pattern that matches a package wins). A cold
# build of helm, one after another into empty build caches on this 2-core machine: 64.3 s
# and 98.6 CPU-s with Go's defaults, 57.8-60.6 s and 87-91 without DWARF, 44.7 s and 64.6
# without DWARF or inlining. The test bed's binaries are no slower for it where measured:
# docs/development/test-bed.md (the control plane's CPU time over the same e2e modules).
GC_FLAGS = ("-gcflags=all=-l -dwarf=false", "-gcflags=std=-dwarf=false")


# Go's build and module caches for these builds: the test bed's own, not the user's, and
# removed once every pinned tool is built (17 GB after a first build; nothing reads them
# afterwards: the binaries and the source folders the test bed needs are copied out).
GO_CACHE = CACHE / "go"


# The compiler's garbage collector runs a quarter as often (GOGC=400; Go's default is 100): a
# cold build of helm took 0.85 times the wall and CPU time (63.6 s against 74.6 s, the
# medians of 3 runs each, side by side with farm-bench on this 2-core machine), its largest
# process 0.62 GB instead of 0.46. The binaries are the same. GOGC=off took 60 s with a
# largest process of 1.1 GB for helm: too much to risk on Kubernetes' largest packages,
# compiled two at a time beside torch's downloads.
GO_GC = "400"


# Each compiler and linker process runs on one thread (GOMAXPROCS=1), and `go build` runs as
# many of them at once as there are CPUs (`-p`, which would otherwise follow GOMAXPROCS):
# the same CPUs busy, with less work. With two threads, a compiler's garbage collector marks
# on the second whenever it is idle, and its back end compiles functions in parallel. Cold
# builds into empty build caches on this 2-core machine: helm 79.2 CPU-s and 41.6 s against
# 84.9 CPU-s and 43.9 s (2 runs each); Kubernetes' six binaries 269 CPU-s and 139 s against
# 293 CPU-s and 153 s. The binaries are the same.
GO_PROCS = "1"


def go_env() -> dict[str, str]:
    return {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod", "GOGC": GO_GC,
            "GOMAXPROCS": GO_PROCS, "GOCACHE": str(GO_CACHE / "build"),
            "GOMODCACHE": str(GO_CACHE / "mod")}  # fmt: skip


def build(tools: tuple[Tool, ...] = ALL_TOOLS) -> None:
    """Build every missing binary into the cache; a no-op when all are present."""
    from toolchain import steps  # here: `python -m toolchain.steps` imports this package first

    todo = [
        (t, names) for t in tools if (names := [b for b in t.binaries if not t.path(b).exists()])
    ]
    for t in tools:  # built before its source folders were copied out
        if not any(t is d for d, _ in todo) and not t.built:
            _copy_data(t)
    for t in tools:
        if t.built:
            say(f"{t.name} {t.version}: cached in {t.dir}")
            steps.record(f"go {t.name}", 0, "cached")
    if todo and not shutil.which("go"):
        raise SystemExit("the Go toolchain is needed to build the test bed: install Go >= 1.26")
    if len(todo) > 1 and (left := steps.total([f"go {t.name}" for t, _ in todo])):
        say(f"{len(todo)} Go builds, one after another: {left}")
    for i, (t, names) in enumerate(todo, 1):
        with exclusive(CACHE / f".{t.name}.lock", f"{t.name} {t.version}"):
            # Whatever another process built while this one waited is done.
            if names := [b for b in names if not t.path(b).exists()]:
                _build_one(t, names, f"[{i}/{len(todo)}]")
            else:
                steps.record(f"go {t.name}", 0, "cached")
    if (
        GO_CACHE.exists()
        and all(t.built for t in ALL_TOOLS)
        and not os.environ.get("TESTBED_KEEP_GO_CACHE")
    ):
        size = _bytes(GO_CACHE)
        say(f"every pinned tool is built: removing Go's caches ({size / 1e9:.1f} GB, {GO_CACHE})")
        subprocess.run(["go", "clean", "-modcache"], env=go_env(), capture_output=True, check=False)
        shutil.rmtree(GO_CACHE, ignore_errors=True)


def _build_one(t: Tool, names: list[str], counter: str) -> None:
    """Build `names` of tool `t` into its cache entry, with progress every 30 s."""
    from toolchain import steps

    about = steps.estimate(f"go {t.name}")
    say(
        f"{counter} building {t.name} {t.version} ({', '.join(names)}) "
        f"from the Go module proxy{f'; {about}' if about else ''}"
    )
    start = time.monotonic()
    CACHE.mkdir(parents=True, exist_ok=True)
    # Removed however the build ends: built, failed, or refused by a trimming that no longer
    # fits the pinned source.
    with tempfile.TemporaryDirectory(prefix=f".{t.name}-", dir=CACHE) as work:
        tmp = Path(work)
        # One package: name the output; several: `go build` names each after its package.
        out = f"{tmp}/{names[0]}" if len(names) == 1 else f"{tmp}/"
        cmd = ["go", "build", f"-p={len(os.sched_getaffinity(0))}", "-trimpath", "-ldflags", ldflags(t),
               *GC_FLAGS]  # fmt: skip
        cmd += t.tag_flags
        if t.trims:
            cmd += ["-modfile", str(_trimmed(t, tmp))]
        cmd += ["-o", out, *(t.binaries[b] for b in names)]
        proc = subprocess.Popen(cmd, cwd=TOOLS / t.name, env=go_env())
        while True:  # progress every 30 s; on to the next build as soon as this one ends
            try:
                proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - start
                about = steps.estimate(f"go {t.name}", elapsed)
                say(
                    f"    ... still building {t.name} ({elapsed:.0f}s{f'; {about}' if about else ''})"
                )
        if proc.returncode:
            raise SystemExit(f"building {t.name} failed (exit {proc.returncode}); see above")
        not_built = [b for b in names if not (tmp / b).exists()]
        if not_built:
            raise SystemExit(f"building {t.name} produced no {', '.join(not_built)}")
        t.dir.mkdir(parents=True, exist_ok=True)
        _copy_data(t)  # first: a process that finds the binaries finds their sources too
        for b in names:
            (tmp / b).rename(t.path(b))
    steps.record(f"go {t.name}", time.monotonic() - start)
    say(f"    {t.name} {t.version} built in {time.monotonic() - start:.0f}s -> {t.dir}")
    _drop_older(t)


def older_entries(t: Tool) -> list[Path]:
    """The cache's other entries of `t`: another version or recipe of the same tool (not
    another tool's whose name starts with this one's)."""
    entry = re.compile(rf"{re.escape(t.name)}-v[^/]+-[0-9a-f]{{8}}")
    return sorted(p for p in CACHE.glob(f"{t.name}-v*") if p != t.dir and entry.fullmatch(p.name))


def _drop_older(t: Tool) -> None:
    """Remove `t`'s older cache entries once its new one is built: each change to a wrapper
    or a trimming left one behind (Flux 183 MB, Kubernetes 467 MB)."""
    for old in older_entries(t):
        say(f"    removing the older build {old.name} ({_bytes(old) / 1e6:.0f} MB)")
        shutil.rmtree(old, ignore_errors=True)


def _bytes(tree: Path) -> int:
    """The size of a folder's files (links not followed)."""
    return sum(f.stat().st_size for f in tree.rglob("*") if f.is_file() and not f.is_symlink())


def _trimmed(t: Tool, tmp: Path) -> Path:
    """A copy of `t`'s go.mod (and go.sum) in `tmp` that replaces each of `t.trims`' modules
    with a trimmed copy of its source, also in `tmp`."""
    replaces = []
    for trim in t.trims:
        src = tmp / "src" / trim.module
        shutil.copytree(module_dir(t, trim.module), src)
        _writable(src)
        trim.apply(src)
        replaces.append(f"replace {trim.module} => {src}\n")
    shutil.copy(t.gomod, tmp / "go.mod")
    shutil.copy(t.gomod.with_suffix(".sum"), tmp / "go.sum")
    with (tmp / "go.mod").open("a") as f:
        f.write("\n" + "".join(replaces))
    return tmp / "go.mod"


def _writable(tree: Path) -> None:
    """The module cache's copies are read-only."""
    for p in (tree, *tree.rglob("*")):
        p.chmod(p.stat().st_mode | 0o200)


def _copy_data(tool: Tool) -> None:
    """Copy the source folders the test bed reads out of the module cache."""
    for module, folder in tool.data:
        target = tool.source(module, folder)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(module_dir(tool, module) / folder, target)
        _writable(target)


def helm() -> Path:
    """The pinned helm binary, built first if it is missing."""
    build((HELM,))
    return HELM.path("helm")


def module_dir(tool: Tool, module: str | None = None) -> Path:
    """Where the Go module cache holds the source of a tool's module (or of another module
    its wrapper pins)."""
    module = module or tool.module
    version = pinned_version(tool.gomod, module)
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        cwd=TOOLS / tool.name, capture_output=True, text=True, check=True, env=go_env(),
    ).stdout  # fmt: skip
    return Path(json.loads(out)["Dir"])
