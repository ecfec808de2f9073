"""The scripts the release workflow runs (the workflow itself cannot run here): one version
source and every place that repeats it, the stamping of a new version, the release's image
table, the chart's packaging and push, and install.yaml pinned by digest. Every bad input is
refused with an error that names it, and leaves the files as they were."""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

import toolchain
from charts import render_install, render_readme
from release import chart, images, version
from testbed import images as testbed_images
from testkit.tools import built

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = "ghcr.io/transcription-dev"


def digests(seed: str = "") -> dict[str, str]:
    return {
        n: "sha256:" + (seed + format(i, "x") * 64)[:64] for i, n in enumerate(images.RELEASED, 1)
    }


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of every file the version lives in, and the chart."""
    for place in version.PLACES:
        for path in place.files(ROOT):
            dest = tmp_path / path.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
    shutil.copytree(ROOT / version.CHART, tmp_path / version.CHART, dirs_exist_ok=True)
    return tmp_path


def snapshot(root: Path) -> dict[Path, str]:
    return {p: p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- version


def test_every_place_agrees_with_the_one_version_source() -> None:
    assert version.check() == [], "run `python -m release.version set <version>`"


def test_the_running_code_reports_the_source_version() -> None:
    from transcription_operator import config

    v = version.current()
    assert v == config.VERSION
    assert config.default_images()["faster-whisper"] == f"{REGISTRY}/worker-cpu:{v}"
    assert {i.split("/")[-1] for i in config.default_images().values()} == {
        f"{n}:{v}" for n in images.NAMES if n != "operator"
    }
    chart_yaml = yaml.safe_load((ROOT / version.CHART / "Chart.yaml").read_text())
    assert (chart_yaml["version"], chart_yaml["appVersion"]) == (v, v)


def test_every_released_image_is_found_in_the_places_that_name_images() -> None:
    """The chart, install.yaml and the operator's defaults name each released image except
    the operator's own (the chart's image.repository) by the same reference; the packed
    speaker model too."""
    from transcription_operator import config

    values = (ROOT / version.CHART / "values.yaml").read_text()
    refs = {m.group("name") for m in re.finditer(version.IMAGE_REF, values)}
    assert refs == set(images.RELEASED)
    assert f"{REGISTRY}/speaker-campplus:{version.current()}" == config.SPEAKER_MODEL_IMAGE


@pytest.mark.parametrize(
    "good", ["0.1.0", "1.0.0", "10.20.30", "0.2.0-rc.1", "1.0.0-alpha.0", "1.0.0-beta.12"]
)
def test_a_release_version_is_semver_with_an_optional_pre_release(good: str) -> None:
    assert version.parse(good) == good


@pytest.mark.parametrize(
    ("bad", "hint"),
    [
        ("1.2", "is not MAJOR.MINOR.PATCH"),
        ("1.2.3.4", "is not MAJOR.MINOR.PATCH"),
        ("01.2.3", "is not MAJOR.MINOR.PATCH"),
        ("1.2.3-beta", "is not MAJOR.MINOR.PATCH"),
        ("1.2.3-dev.1", "is not MAJOR.MINOR.PATCH"),
        ("1.2.3+build.5", "is not MAJOR.MINOR.PATCH"),
        ("", "is not MAJOR.MINOR.PATCH"),
        (" 1.2.3", "is not MAJOR.MINOR.PATCH"),
        ("v1.2.3", "drop the leading v"),
    ],
)
def test_a_malformed_version_is_refused_and_nothing_is_written(
    repo: Path, bad: str, hint: str
) -> None:
    before = snapshot(repo)
    with pytest.raises(version.VersionError, match=re.escape(hint)) as e:
        version.stamp(bad, root=repo)
    assert repr(bad) in str(e.value) and "e.g. 0.2.0 or 0.2.0-rc.1" in str(e.value)
    assert snapshot(repo) == before


@pytest.mark.parametrize(
    ("tag", "expected"),
    [("v0.2.0", "0.2.0"), ("v1.0.0-rc.2", "1.0.0-rc.2"), ("refs/tags/v3.4.5", "3.4.5")],
)
def test_a_release_tag_names_its_version(tag: str, expected: str) -> None:
    assert version.from_tag(tag) == expected


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        ("0.2.0", "'0.2.0' is not a release tag: release tags are v<version>"),
        ("release-0.2.0", "is not a release tag"),
        ("v0.2", "tag 'v0.2' is not v<version>: version '0.2' is not MAJOR.MINOR.PATCH"),
        ("vv0.2.0", "drop the leading v"),
        ("v0.2.0-nightly", "is not v<version>"),
    ],
)
def test_a_tag_that_is_not_a_release_is_refused(tag: str, message: str) -> None:
    with pytest.raises(version.VersionError, match=re.escape(message)):
        version.from_tag(tag)


@pytest.mark.parametrize("bad", ["GHCR.io/Team", "ghcr.io/team/", "https://ghcr.io/team", ""])
def test_a_malformed_registry_is_refused_and_nothing_is_written(repo: Path, bad: str) -> None:
    before = snapshot(repo)
    with pytest.raises(version.VersionError, match="is not <host>"):
        version.stamp("0.2.0", bad, root=repo)
    assert snapshot(repo) == before


def test_a_place_that_disagrees_is_named_with_its_line(repo: Path) -> None:
    chart_yaml = repo / version.CHART / "Chart.yaml"
    chart_yaml.write_text(chart_yaml.read_text().replace('appVersion: "', 'appVersion: "9'))
    config = repo / "operator/transcription_operator/config.py"
    config.write_text(config.read_text().replace('REGISTRY = "ghcr.io/', 'REGISTRY = "quay.io/'))
    v = version.current(repo)
    problems = version.check(repo)
    line = next(
        i for i, t in enumerate(chart_yaml.read_text().splitlines(), 1) if t.startswith("appV")
    )
    assert (
        f"{version.CHART}/Chart.yaml:{line}: the chart's appVersion: version 9{v}, "
        f"but pyproject.toml says {v}"
    ) in problems
    # The operator's REGISTRY is the registry's reference: every image elsewhere disagrees.
    assert any(
        p.startswith("install.yaml:")
        and "registry ghcr.io/transcription-dev, but the operator's REGISTRY says quay.io/" in p
        for p in problems
    ), problems


def test_a_place_that_moved_is_an_error_that_says_where_to_fix_it(repo: Path) -> None:
    config = repo / "operator/transcription_operator/config.py"
    config.write_text(config.read_text().replace("\nVERSION = ", "\nOPERATOR_VERSION = "))
    with pytest.raises(version.VersionError) as e:
        version.check(repo)
    assert str(e.value) == (
        "operator/transcription_operator/config.py: the operator's VERSION found 0 time(s), "
        "expected at least 1; if they moved, update PLACES in release/version.py"
    )


def test_stamping_writes_every_place_and_leaves_the_rest_alone(repo: Path) -> None:
    before = snapshot(repo)
    changed = version.stamp("2.3.4-rc.5", "registry.example.com:5000/team", root=repo)
    assert version.check(repo) == []
    assert version.current(repo) == "2.3.4-rc.5"
    # Every file of every place changed.
    assert set(changed) == {f.path for f in version.find(repo)}
    after = snapshot(repo)
    old = version.current(ROOT)
    for path, text in before.items():
        # Put the old values back: nothing else may differ.
        undone = after[path].replace("registry.example.com:5000/team", REGISTRY)
        undone = undone.replace("2.3.4-rc.5", old)
        assert undone == text, path
    values = yaml.safe_load((repo / version.CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == "registry.example.com:5000/team/operator"
    assert (
        values["defaultImages"]["vllmCpu"]
        == "registry.example.com:5000/team/worker-vllm-cpu:2.3.4-rc.5"
    )
    assert (
        'VERSION = "2.3.4-rc.5"' in (repo / "operator/transcription_operator/config.py").read_text()
    )
    assert (
        '"transcription-operator[worker]==2.3.4-rc.5"'
        in (repo / "worker_image/Dockerfile.cuda").read_text()
    )
    # Stamping again is a no-op.
    assert version.stamp("2.3.4-rc.5", "registry.example.com:5000/team", root=repo) == []


def test_stamped_generated_files_are_what_their_generators_write(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """install.yaml and the chart README are stamped as text: stamping them must give
    exactly what helm and charts/render_readme.py write from the stamped chart."""
    built(toolchain.HELM, "helm")
    chart_dir = repo / version.CHART
    monkeypatch.setattr(render_readme, "VALUES", chart_dir / "values.yaml")
    monkeypatch.setattr(render_readme, "SCHEMA", chart_dir / "values.schema.json")
    readme, install = chart_dir / "README.md", repo / "install.yaml"
    # Generated from this chart first (whatever else is being changed in it meanwhile).
    install.write_text(render_install.render(chart_dir))
    readme.write_text(render_readme.update(readme.read_text()))
    version.stamp("2.3.4-rc.5", "ghcr.io/someone-else", root=repo)
    assert "ghcr.io/someone-else/worker-cuda:2.3.4-rc.5" in install.read_text()
    assert render_install.render(chart_dir) == install.read_text()
    assert render_readme.update(readme.read_text()) == readme.read_text()


def test_the_cli_says_what_it_did_and_why_it_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert version.main([]) == 0
    assert capsys.readouterr().out == f"{version.current()}\n"
    assert version.main(["check"]) == 0
    assert capsys.readouterr().out == f"{version.current()}: every place agrees\n"
    assert version.main(["from-tag", "v1.2.3"]) == 0
    assert capsys.readouterr().out == "1.2.3\n"
    assert version.main(["from-tag", "1.2.3"]) == 2
    assert capsys.readouterr().err.startswith("error: tag '1.2.3' is not a release tag")
    assert version.main(["set", "1.2"]) == 2
    assert "error: version '1.2' is not MAJOR.MINOR.PATCH" in capsys.readouterr().err


# --------------------------------------------------------------------------- images


def test_the_release_builds_every_image_the_operator_runs_from_its_dockerfile() -> None:
    from transcription_operator import config

    runs = {i.repository: i.dockerfile for i in config.IMAGES} | {"operator": "operator/Dockerfile"}
    assert {i.name: i.dockerfile for i in images.IMAGES} == runs


def test_the_release_builds_every_dockerfile_of_the_repository() -> None:
    dockerfiles = {
        str(p.relative_to(ROOT))
        for p in [*ROOT.glob("*/Dockerfile"), *ROOT.glob("worker_image/Dockerfile.*")]
    }
    assert {i.dockerfile for i in images.IMAGES} == dockerfiles


@pytest.mark.parametrize(
    "tb",
    [
        testbed_images.OPERATOR,
        testbed_images.FRONTEND,
        testbed_images.WORKER_CPU,
        testbed_images.WORKER_TRANSFORMERS,
        testbed_images.WORKER_VLLM_CPU,
    ],
    ids=lambda i: i.name,
)
def test_a_released_image_is_built_as_the_test_bed_builds_it(tb: testbed_images.Image) -> None:
    """What the tests ran is what ships: the same Dockerfile and build arguments (only the
    base differs: the test bed's own Debian base, a release the Dockerfile's default; and
    the installer: the test bed installs the same requirements with its uv, from the cache
    its environments filled, a release with the Dockerfile's pip)."""
    released = images.by_name(tb.name)
    assert released.dockerfile == tb.dockerfile
    uv = testbed_images.UV_PIP_INSTALL if tb.base else testbed_images.UV_SYSTEM_PIP_INSTALL
    installer = {"PIP_INSTALL": uv}
    assert {**released.build_args, **installer} == tb.build_args
    assert "PIP_INSTALL" not in released.build_args


def test_an_image_built_for_amd64_only_says_why_and_a_multi_arch_one_has_a_multi_arch_base() -> (
    None
):
    for image in images.IMAGES:
        text = (ROOT / image.dockerfile).read_text()
        bases = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.M) + [
            b for b in re.findall(r"^FROM (\S+)", text, re.M) if not b.startswith("$")
        ]
        if image.platforms == images.AMD64:
            assert image.amd64_only, image.name
        else:
            assert image.platforms == images.BOTH and not image.amd64_only, image.name
            # python:*-slim-bookworm is published for amd64 and arm64.
            assert bases and all(
                re.fullmatch(r"python:3\.\d+\.\d+-slim-bookworm", b) for b in bases
            ), (image.name, bases)


def test_the_build_matrix_is_what_build_push_action_takes() -> None:
    m = images.matrix("Transcription-Dev")
    assert [e["name"] for e in m["include"]] == list(images.NAMES)
    cpu = next(e for e in m["include"] if e["name"] == "worker-cpu")
    assert cpu == {
        "name": "worker-cpu",
        "image": "ghcr.io/transcription-dev/worker-cpu",  # GHCR names are lowercase
        "dockerfile": "worker_image/Dockerfile.cpu",
        "platforms": "linux/amd64,linux/arm64",
        "build-args": "BAKE_MODEL=1",
    }
    assert next(e for e in m["include"] if e["name"] == "worker-cuda")["platforms"] == "linux/amd64"
    assert all(isinstance(v, str) for e in m["include"] for v in e.values())


@pytest.mark.parametrize("bad", ["", "  ", "a/b"])
def test_a_malformed_owner_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="is not a GitHub owner"):
        images.matrix(bad)
    assert images.main(["matrix", "--owner", bad]) == 2
    assert "is not a GitHub owner" in capsys.readouterr().err


def test_an_unknown_image_name_is_refused() -> None:
    with pytest.raises(
        ValueError, match="no release image is named 'worker-gpu' \\(the images: operator, "
    ):
        images.by_name("worker-gpu")


SPDX = {"spdxVersion": "SPDX-2.3", "name": "sbom"}


@pytest.mark.parametrize(
    "sbom",
    [
        {"SPDX": SPDX},
        {"linux/amd64": {"SPDX": SPDX}, "linux/arm64": {"SPDX": {"spdxVersion": "SPDX-2.3"}}},
    ],
    ids=["one platform", "two platforms"],
)
def test_the_sbom_of_one_platform_is_taken_from_imagetools_output(sbom: dict[str, Any]) -> None:
    assert images.spdx(sbom, "linux/amd64") == SPDX


@pytest.mark.parametrize(
    ("sbom", "message"),
    [
        (
            {"linux/arm64": {"SPDX": SPDX}},
            "no SPDX document for linux/amd64 in the SBOM (it holds: linux/arm64)",
        ),
        ({}, "(it holds: nothing)"),
        (None, "(it holds: NoneType)"),
        ({"SPDX": {"name": "x"}}, "is not an SPDX document"),
    ],
)
def test_an_sbom_without_the_platform_is_refused(sbom: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        images.spdx(sbom, "linux/amd64")


# --------------------------------------------------------------------------- chart


def test_the_chart_packages_with_the_release_version(tmp_path: Path) -> None:
    helm = built(toolchain.HELM, "helm")
    archive = chart.package(tmp_path, helm=helm)
    v = version.current()
    assert archive == tmp_path / f"transcription-operator-{v}.tgz"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        packaged = yaml.safe_load(tar.extractfile("transcription-operator/Chart.yaml").read())  # type: ignore[union-attr]
        values = yaml.safe_load(tar.extractfile("transcription-operator/values.yaml").read())  # type: ignore[union-attr]
    assert (packaged["version"], packaged["appVersion"]) == (v, v)
    assert values["defaultImages"]["frontend"] == f"{REGISTRY}/frontend:{v}"
    # Every file of the chart, the CRD and the dashboard included.
    source = ROOT / version.CHART
    files = {
        f"transcription-operator/{p.relative_to(source)}" for p in source.rglob("*") if p.is_file()
    }
    assert files - {f for f in files if "/." in f} <= names
    assert "transcription-operator/files/transcriptiondeployments.transcription.dev.yaml" in names


def test_a_chart_that_was_not_stamped_is_not_packaged(repo: Path) -> None:
    chart_yaml = repo / version.CHART / "Chart.yaml"
    chart_yaml.write_text(re.sub(r"(?m)^version: .*$", "version: 0.0.9", chart_yaml.read_text()))
    with pytest.raises(chart.ChartError) as e:
        chart.package(repo / "dist", chart=repo / version.CHART, helm=Path("/nonexistent/helm"))
    v = version.current()
    assert str(e.value) == (
        f"the chart says version 0.0.9, appVersion {v}; the release is {v}: "
        f"run `python -m release.version set {v}` first"
    )
    assert not (repo / "dist").exists()


def test_a_malformed_release_version_is_not_packaged(tmp_path: Path) -> None:
    with pytest.raises(chart.ChartError, match=re.escape("version '1.0' is not MAJOR.MINOR.PATCH")):
        chart.package(tmp_path, version="1.0", helm=Path("/nonexistent/helm"))


def test_a_chart_that_fails_helm_lint_is_not_packaged(repo: Path) -> None:
    helm = built(toolchain.HELM, "helm")
    broken = repo / version.CHART / "templates" / "broken.yaml"
    broken.write_text("{{ .Values.nothing.here }}\n")
    with pytest.raises(chart.ChartError, match=r"helm lint failed \(exit 1\)") as e:
        chart.package(repo / "dist", chart=repo / version.CHART, helm=helm)
    assert "nil pointer evaluating interface {}.here" in str(e.value)


# What helm 3.22's `helm push` writes (on stderr).
PUSH_OUTPUT = (
    "Pushed: ghcr.io/transcription-dev/charts/transcription-operator:0.2.0\n"
    "Digest: sha256:" + "ab" * 32 + "\n"
)


def test_the_pushed_charts_digest_is_read_from_helms_output() -> None:
    assert chart.pushed_digest(PUSH_OUTPUT) == "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    "output", ["", "Pushed: x\n", "Digest: sha256:abc\n", "Digest: md5:" + "a" * 32]
)
def test_a_push_without_a_digest_is_an_error_that_shows_helms_output(output: str) -> None:
    with pytest.raises(chart.ChartError, match="helm push reported no digest; it said:"):
        chart.pushed_digest(output)


@pytest.mark.parametrize(
    "remote",
    ["ghcr.io/transcription-dev/charts", "oci://GHCR.io/x", "oci://ghcr.io", "https://ghcr.io/x"],
)
def test_a_push_to_a_malformed_remote_is_refused_before_helm_runs(
    tmp_path: Path, remote: str
) -> None:
    archive = tmp_path / "transcription-operator-0.2.0.tgz"
    archive.write_bytes(b"")
    with pytest.raises(chart.ChartError, match="is not oci://<registry>/<namespace> in lowercase"):
        chart.push(archive, remote, helm=Path("/nonexistent/helm"))


def test_a_push_of_something_else_than_the_packaged_chart_is_refused(tmp_path: Path) -> None:
    with pytest.raises(chart.ChartError, match="is not a packaged transcription-operator chart"):
        chart.push(tmp_path / "transcription-operator-0.2.0.tgz", "oci://ghcr.io/x/charts",
                   helm=Path("/nonexistent/helm"))  # fmt: skip
    with pytest.raises(chart.ChartError, match="is not a packaged transcription-operator chart"):
        chart.push(ROOT / "install.yaml", "oci://ghcr.io/x/charts", helm=Path("/nonexistent/helm"))


def test_a_push_returns_the_reference_cosign_signs(tmp_path: Path) -> None:
    """A stand-in helm that answers as helm 3.22 does."""
    helm = tmp_path / "helm"
    helm.write_text(f"#!/bin/sh\nprintf '{PUSH_OUTPUT}' >&2\n")
    helm.chmod(0o755)
    archive = tmp_path / "transcription-operator-0.2.0.tgz"
    archive.write_bytes(b"")
    ref = chart.push(archive, "oci://ghcr.io/transcription-dev/charts", helm=helm)
    assert ref == "ghcr.io/transcription-dev/charts/transcription-operator@sha256:" + "ab" * 32


# --------------------------------------------------------------------------- install.yaml


def install_yaml() -> str:
    return (ROOT / "install.yaml").read_text()


def test_install_yaml_is_pinned_by_digest() -> None:
    d = digests()
    v = version.current()
    pinned = render_install.pin(install_yaml(), d, REGISTRY, v)
    assert not re.search(rf"{REGISTRY}/[\w-]+:{re.escape(v)}", pinned)
    docs = [doc for doc in yaml.safe_load_all(pinned) if doc]
    dep = next(doc for doc in docs if doc["kind"] == "Deployment")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{REGISTRY}/operator@{d['operator']}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FRONTEND_IMAGE"] == f"{REGISTRY}/frontend@{d['frontend']}"
    assert env["VLLM_CPU_IMAGE"] == f"{REGISTRY}/worker-vllm-cpu@{d['worker-vllm-cpu']}"
    assert env["FASTER_WHISPER_CUDA_IMAGE"] == f"{REGISTRY}/worker-cuda@{d['worker-cuda']}"
    # Nothing else changed: undo the pins and it is install.yaml again.
    undone = pinned
    for name, digest in d.items():
        undone = undone.replace(f"{REGISTRY}/{name}@{digest}", f"{REGISTRY}/{name}:{v}")
    assert undone == install_yaml()


def test_a_missing_digest_is_refused() -> None:
    d = digests()
    del d["worker-cuda"], d["worker-vllm"]
    with pytest.raises(render_install.PinError) as e:
        render_install.pin(install_yaml(), d, REGISTRY, version.current())
    assert str(e.value) == (
        "no digest for worker-cuda, worker-vllm: every image of the release needs one "
        "(did its build job fail?)"
    )


@pytest.mark.parametrize(
    "bad",
    ["sha256:abc", "sha256:" + "A" * 64, "sha512:" + "a" * 64, "a" * 64, "", "sha256:" + "a" * 65],
)
def test_a_malformed_digest_is_refused(bad: str) -> None:
    d = digests() | {"frontend": bad}
    with pytest.raises(render_install.PinError) as e:
        render_install.pin(install_yaml(), d, REGISTRY, version.current())
    assert str(e.value) == f"the digest of frontend is not sha256:<64 hex digits>: {bad!r}"


def test_a_digest_of_an_unknown_image_is_refused() -> None:
    d = digests() | {"worker-gpu": "sha256:" + "c" * 64}
    with pytest.raises(
        render_install.PinError, match="digests for images the release does not build: worker-gpu"
    ):
        render_install.pin(install_yaml(), d, REGISTRY, version.current())


@pytest.mark.parametrize(
    ("registry", "v"),
    [("ghcr.io/someone-else", None), (REGISTRY, "9.9.9")],
    ids=["registry", "version"],
)
def test_install_yaml_of_another_release_is_refused(registry: str, v: str | None) -> None:
    """Digests of images pushed elsewhere, or for another version, do not pin install.yaml's
    references: the release was not stamped."""
    v = v or version.current()
    with pytest.raises(render_install.PinError) as e:
        render_install.pin(install_yaml(), digests(), registry, v)
    assert f"not to {registry}/<image>:{v}: stamp the release first" in str(e.value)
    assert f"(python -m release.version set {v} --registry {registry})" in str(e.value)


def test_an_image_install_yaml_does_not_refer_to_is_an_error() -> None:
    v = version.current()
    text = install_yaml().replace(f"{REGISTRY}/worker-cuda:{v}", "example.com/cuda:1")
    with pytest.raises(
        render_install.PinError, match=re.escape("install.yaml does not refer to worker-cuda")
    ):
        render_install.pin(text, digests(), REGISTRY, v)


def test_digests_are_read_from_a_folder_or_a_json_object(tmp_path: Path) -> None:
    d = digests()
    folder = tmp_path / "digests"
    folder.mkdir()
    for name, digest in d.items():
        (folder / name).write_text(digest + "\n")
    assert render_install.read_digests(folder) == d
    (tmp_path / "d.json").write_text(json.dumps(d))
    assert render_install.read_digests(tmp_path / "d.json") == d


@pytest.mark.parametrize(
    ("content", "message"),
    [("not json", "not a folder of digests or a JSON object"), ("[1, 2]", "not a JSON object"),
     ('{"frontend": 1}', "not a JSON object")],
)  # fmt: skip
def test_digests_that_are_not_a_mapping_are_refused(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "d.json"
    path.write_text(content)
    with pytest.raises(render_install.PinError, match=re.escape(message)):
        render_install.read_digests(path)


def test_the_cli_writes_a_pinned_install_yaml_or_says_why_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built(toolchain.HELM, "helm")
    d = digests()
    (tmp_path / "d.json").write_text(json.dumps(d))
    out = tmp_path / "install.yaml"
    args = ["--digests", str(tmp_path / "d.json"), "--registry", REGISTRY, "--output", str(out)]
    assert render_install.main(args) == 0
    assert out.read_text() == render_install.pin(install_yaml(), d, REGISTRY, version.current())
    (tmp_path / "d.json").write_text(json.dumps({k: v for k, v in d.items() if k != "operator"}))
    out.unlink()
    assert render_install.main(args) == 2
    assert "error: no digest for operator" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(SystemExit) as e:
        render_install.main(["--digests", str(tmp_path / "d.json")])
    assert e.value.code == 2
    assert "--digests needs --registry" in capsys.readouterr().err
