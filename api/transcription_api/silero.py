"""Where the Silero VAD model is: faster-whisper's package ships it (assets/silero_vad_v6.onnx),
and the gateway's VAD (realtime turns, long audio's cuts) and the speaker stage both run it
in onnxruntime. Found without importing faster-whisper (which would load CTranslate2)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def model_path() -> Path:
    """faster-whisper's silero_vad_v6.onnx; RuntimeError saying what is missing."""
    spec = importlib.util.find_spec("faster_whisper")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "voice activity detection needs the faster-whisper package "
            "(its Silero VAD model, assets/silero_vad_v6.onnx); it is not installed"
        )
    for directory in spec.submodule_search_locations:
        path = Path(directory) / "assets" / "silero_vad_v6.onnx"
        if path.is_file():
            return path
    raise RuntimeError(
        "the faster-whisper package has no assets/silero_vad_v6.onnx "
        "(Silero VAD v6 came with faster-whisper 1.2)"
    )
