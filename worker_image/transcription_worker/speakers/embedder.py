"""Speaker embeddings: CAM++ (exported by `export.py` at build time) run by onnxruntime.

A window's embedding is 192 floats, returned L2-normalized so that a dot product is a
cosine. Windows are batched only with windows of the same length: CAM++ pools statistics
over every frame it is given, so zero padding would change a shorter window's embedding.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime  # type: ignore[import-untyped]

from . import fbank

MODEL_ENV = "SPEAKER_MODEL"  # the .onnx file's path, as an image sets it
DIM = 192
BATCH = 32

Floats = npt.NDArray[np.float32]


def model_path() -> Path:
    """The exported model named by $SPEAKER_MODEL."""
    value = os.environ.get(MODEL_ENV)
    if not value:
        raise RuntimeError(
            f"${MODEL_ENV} names no speaker model: the image's build stage exports it "
            "(python -m transcription_worker.speakers.export OUT.onnx)"
        )
    path = Path(value)
    if not path.is_file():
        raise RuntimeError(f"${MODEL_ENV}={value}: no such file")
    return path


def normalized(vectors: npt.ArrayLike) -> Floats:
    """Rows scaled to unit length (zero rows stay zero)."""
    x = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.asarray(x / np.maximum(norms, 1e-12), dtype=np.float32)


class Embedder:
    """One onnxruntime session of CAM++; `threads` intra-op threads (1: cost in CPU seconds
    is what a pool is sized by; more only shortens the wall time)."""

    def __init__(self, path: Path | None = None, threads: int = 1) -> None:
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self.path = path or model_path()
        self._session: Any = onnxruntime.InferenceSession(
            str(self.path), opts, providers=["CPUExecutionProvider"]
        )

    def features(self, features: Sequence[Floats]) -> Floats:
        """(n, 192) unit embeddings of windows' fbank features (each (frames, 80))."""
        out = np.zeros((len(features), DIM), dtype=np.float32)
        by_length: dict[int, list[int]] = {}
        for i, f in enumerate(features):
            if f.ndim != 2 or f.shape[1] != fbank.MEL_BINS or f.shape[0] == 0:
                raise ValueError(f"window {i}: features must be (frames > 0, 80), not {f.shape}")
            by_length.setdefault(f.shape[0], []).append(i)
        for indices in by_length.values():
            for b in range(0, len(indices), BATCH):
                chosen = indices[b : b + BATCH]
                batch = np.stack([features[i] for i in chosen]).astype(np.float32)
                out[chosen] = self._session.run(None, {"features": batch})[0]
        return normalized(out)

    def audio(self, windows: Sequence[Floats]) -> Floats:
        """(n, 192) unit embeddings of windows of 16 kHz samples in [-1, 1]."""
        return self.features([fbank.features(w) for w in windows])
