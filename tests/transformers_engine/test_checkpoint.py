"""The Hugging Face Whisper checkpoint converted from CTranslate2 weights, and the launcher
checking engineArgs with transformers' own parser."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoProcessor, WhisperForConditionalGeneration

from testkit.transformers_serve import WHISPER
from transcription_api.worker import SETTINGS_ENV, WorkerSettings
from transcription_worker.hf_whisper import ConversionError, read_ct2


def test_checkpoint_is_whisper_tiny_en_with_its_full_generation_length(checkpoints: Path) -> None:
    d = checkpoints / WHISPER
    config = json.loads((d / "config.json").read_text())
    assert (config["d_model"], config["encoder_layers"], config["decoder_layers"],
            config["encoder_attention_heads"], config["vocab_size"]) == (384, 4, 4, 6, 51864)  # fmt: skip
    generation = json.loads((d / "generation_config.json").read_text())
    # Not transformers' default of 20 tokens: Whisper's own 448.
    assert generation["max_length"] == 448
    assert generation["is_multilingual"] is False
    processor = AutoProcessor.from_pretrained(d)
    assert len(processor.tokenizer) == 51864
    assert processor.tokenizer.convert_ids_to_tokens(50363) == "<|0.00|>"
    model = WhisperForConditionalGeneration.from_pretrained(d)
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    # Readable by an image's non-root user.
    assert all(f.stat().st_mode & 0o004 for f in d.iterdir())


def write_ct2(path: Path, version: int = 6, spec: str = "WhisperSpec", dtype: int = 4) -> Path:
    def s(text: str) -> bytes:
        return struct.pack("<H", len(text) + 1) + text.encode() + b"\0"

    data = struct.pack("<I", version) + s(spec) + struct.pack("<II", 3, 1)
    data += s("encoder/num_heads") + struct.pack("<BBI", 0, dtype, 1) + b"\x06"
    path.write_bytes(data + struct.pack("<I", 0))
    return path


def test_other_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="binary version 5, expected 6"):
        read_ct2(write_ct2(tmp_path / "a.bin", version=5))
    with pytest.raises(ConversionError, match="holds a TransformerSpec, not a Whisper model"):
        read_ct2(write_ct2(tmp_path / "b.bin", spec="TransformerSpec"))
    with pytest.raises(ConversionError, match=r"unsupported dtype 9 \(quantized weights\?\)"):
        read_ct2(write_ct2(tmp_path / "c.bin", dtype=9))
    out = subprocess.run([sys.executable, "-m", "transcription_worker.hf_whisper", str(tmp_path / "o"),
                          "--src", str(tmp_path)], capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 2
    assert "has no model.bin: not a CTranslate2 Whisper model directory" in out.stderr


def test_launcher_checks_engine_args_with_transformers_own_parser(checkpoints: Path) -> None:
    s = WorkerSettings(engine="transformers", mode="continuous", model=str(checkpoints / WHISPER),
                       served_names=[WHISPER], extra_args=["--bogus"])  # fmt: skip
    env = {**os.environ, SETTINGS_ENV: s.to_env()}
    out = subprocess.run([sys.executable, "-m", "transcription_worker.launchers.transformers", "--print"],
                         env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 2
    assert "transformers serve rejects the arguments: No such option '--bogus'" in out.stderr
    s = s.model_copy(update={"extra_args": ["--cb-block-size", "32"]})
    out = subprocess.run([sys.executable, "-m", "transcription_worker.launchers.transformers", "--print"],
                         env={**env, SETTINGS_ENV: s.to_env()}, capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("--continuous-batching --log-level info --cb-block-size 32")
