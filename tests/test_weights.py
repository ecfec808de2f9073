"""Packing model weights as an OCI image (`python -m transcription_api.weights pack`) with
the real builder (buildah), read back from the archive it writes; and every bad input's
error."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from transcription_api import weights

IMAGE = "testbed.local/weights/pack-test:v1"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    d = tmp_path / "tiny.en"
    (d / "tokenizer").mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "whisper"}')
    (d / "model.bin").write_bytes(bytes(range(256)) * 400)
    (d / "tokenizer" / "vocab.json").write_text("{}")
    for p in [d, *d.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return d


@pytest.fixture
def built() -> Iterator[None]:
    yield
    subprocess.run(["buildah", "rmi", IMAGE], capture_output=True, check=False)


def _blob(root: Path, digest: str) -> Path:
    return root / "blobs" / "sha256" / digest.removeprefix("sha256:")


def test_a_model_directory_becomes_a_one_layer_image_pinned_by_digest(
    model: Path, tmp_path: Path, built: None, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "weights.tar"
    rc = weights.main(["pack", str(model), IMAGE, "--path", "/whisper/", "--archive", str(archive)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    pinned = out.strip()
    repository, digest = pinned.split("@")
    assert repository == "testbed.local/weights/pack-test" and digest.startswith("sha256:")
    assert f"image: {pinned}, path: whisper" in err
    root = tmp_path / "oci"
    with tarfile.open(archive) as t:
        t.extractall(root, filter="data")
    [entry] = json.loads((root / "index.json").read_text())["manifests"]
    assert entry["digest"] == digest  # what spec.model.image pins is what the archive holds
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == IMAGE
    manifest = json.loads(_blob(root, digest).read_text())
    [layer] = manifest["layers"]
    with tarfile.open(_blob(root, layer["digest"])) as t:
        members = {m.name.lstrip("./"): m for m in t.getmembers()}
        assert (
            t.extractfile(members["whisper/model.bin"]).read() == (model / "model.bin").read_bytes()
        )  # type: ignore[union-attr]
    assert {"whisper/config.json", "whisper/tokenizer/vocab.json"} <= set(members)
    assert members["whisper/model.bin"].mode & 0o004  # readable by the pools' user
    config = json.loads(_blob(root, manifest["config"]["digest"]).read_text())
    held = json.loads(config["config"]["Labels"][weights.LABEL])
    assert held == ["/whisper/config.json", "/whisper/model.bin", "/whisper/tokenizer/vocab.json"]
    assert not config["config"].get("Entrypoint") and not config["config"].get("Cmd")


def test_what_cannot_be_packed_is_refused_with_what_to_do(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "w.tar"
    empty = tmp_path / "empty"
    empty.mkdir()
    cases: list[tuple[dict[str, object], str]] = [
        ({"directory": tmp_path / "nope"}, "is not a directory: give the model's directory"),
        ({"directory": empty}, "holds no files: nothing to pack"),
        ({"image": "oci://registry/x:v1"}, "is not an image reference"),
        ({"image": "Registry/X:v1"}, "lower case, no scheme"),
        ({"image": "r/x@sha256:" + "a" * 64}, "names a digest: give a tag"),
        ({"archive": None}, "say where the image goes: --archive FILE or --push"),
    ]
    for change, message in cases:
        args: dict[str, object] = {"directory": model, "image": IMAGE, "archive": out, **change}
        with pytest.raises(weights.PackError, match=message.replace("(", r"\(")):
            weights.pack(args["directory"], str(args["image"]), archive=args["archive"])  # type: ignore[arg-type]
    (model / "model.bin").chmod(0o600)
    with pytest.raises(weights.PackError) as e:
        weights.pack(model, IMAGE, archive=out)
    assert "model.bin is not readable by every user (mode -rw-------)" in str(e.value)
    assert f"chmod -R a+rX {model}" in str(e.value)
    (model / "model.bin").chmod(0o644)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(weights.PackError, match=r"buildah is needed .* apt-get install buildah"):
        weights.pack(model, IMAGE, archive=out)
    assert not out.exists()


def test_the_command_line_says_error_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert weights.main(["pack", str(tmp_path / "nope"), IMAGE, "--push"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'nope'} is not a directory")
    with pytest.raises(SystemExit) as e:  # one of --archive and --push, not both
        weights.main(["pack", str(tmp_path), IMAGE, "--push", "--archive", "x.tar"])
    assert e.value.code == 2
