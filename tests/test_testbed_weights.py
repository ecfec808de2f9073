"""The test bed's cache of weights images (testbed/weights.py), with the real builder
(buildah): the same files under the same reference are packed once, and the digest stays
the same from run to run; a changed file, reference or path is packed again, and its older
archive goes."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import weights

IMAGE = "testbed.local/weights/cache-test:v1"

pytestmark = pytest.mark.skipif(not shutil.which("buildah"), reason="buildah is not installed")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    (d / "tokenizer").mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "whisper"}')
    (d / "tokenizer" / "vocab.json").write_text("{}")
    for p in [d, *d.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return d


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(weights, "CACHE", tmp_path / "cache")
    yield tmp_path / "cache"
    subprocess.run(["buildah", "rmi", IMAGE], capture_output=True, check=False)


def test_the_digest_names_every_files_path_mode_and_bytes_and_what_else_goes_in(
    model: Path, tmp_path: Path
) -> None:
    first = weights.tree_digest(model, "ref:v1")
    copy = tmp_path / "elsewhere"
    shutil.copytree(model, copy)
    assert weights.tree_digest(copy, "ref:v1") == first  # where it lies does not count
    assert weights.tree_digest(model, "ref:v2") != first
    source = tmp_path / "packer.py"
    source.write_text("a")
    with_source = weights.tree_digest(model, "ref:v1", source)
    source.write_text("b")
    assert weights.tree_digest(model, "ref:v1", source) != with_source
    (copy / "config.json").write_text('{"model_type": "whisper", "x": 1}')
    assert weights.tree_digest(copy, "ref:v1") != first
    shutil.copytree(model, copy, dirs_exist_ok=True)
    (copy / "config.json").chmod(0o600)
    assert weights.tree_digest(copy, "ref:v1") != first
    (copy / "config.json").chmod(0o644)
    (copy / "config.json").rename(copy / "settings.json")
    assert weights.tree_digest(copy, "ref:v1") != first


def test_the_same_files_are_packed_once_and_keep_their_digest(
    model: Path, tmp_path: Path, cache: Path
) -> None:
    archive, pinned = weights._packed(model, IMAGE, "tiny.en", tmp_path)
    assert pinned.startswith("testbed.local/weights/cache-test@sha256:")
    assert archive.parent == cache and archive.is_file()
    built_at = archive.stat().st_mtime_ns
    assert weights._packed(model, IMAGE, "tiny.en", tmp_path) == (archive, pinned)
    assert archive.stat().st_mtime_ns == built_at  # not packed again
    # Only the archive is kept: nothing of it stays in buildah's store.
    assert subprocess.run(["buildah", "inspect", IMAGE], capture_output=True).returncode != 0


def test_a_changed_file_or_path_is_packed_again_and_the_older_archive_goes(
    model: Path, tmp_path: Path, cache: Path
) -> None:
    archive, pinned = weights._packed(model, IMAGE, "tiny.en", tmp_path)
    (model / "config.json").write_text('{"model_type": "whisper", "changed": true}')
    changed, repinned = weights._packed(model, IMAGE, "tiny.en", tmp_path)
    assert repinned != pinned and changed != archive
    assert not archive.exists()
    moved, moved_pin = weights._packed(model, IMAGE, "other", tmp_path)
    assert moved_pin not in (pinned, repinned)
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [moved.name, moved.with_suffix(".ref").name]
    )


def test_another_tag_whose_name_starts_with_this_ones_keeps_its_archive(
    model: Path, tmp_path: Path, cache: Path
) -> None:
    longer = IMAGE + "-rc"  # testbed.local_weights_cache-test_v1-rc-<digest>.tar
    kept, _ = weights._packed(model, longer, "tiny.en", tmp_path)
    weights._packed(model, IMAGE, "tiny.en", tmp_path)
    (model / "config.json").write_text("{}")
    weights._packed(model, IMAGE, "tiny.en", tmp_path)  # removes its own older archive only
    assert kept.is_file() and kept.with_suffix(".ref").is_file()
    subprocess.run(["buildah", "rmi", longer], capture_output=True, check=False)


def test_an_archive_whose_reference_was_never_written_is_packed_again(
    model: Path, tmp_path: Path, cache: Path
) -> None:
    """A run cut between the archive's move and its .ref: the archive alone is not trusted."""
    archive, pinned = weights._packed(model, IMAGE, "tiny.en", tmp_path)
    archive.with_suffix(".ref").unlink()
    again, repinned = weights._packed(model, IMAGE, "tiny.en", tmp_path)
    assert again == archive and again.with_suffix(".ref").read_text() == repinned
    assert repinned != pinned  # a new build: buildah stamps its time
