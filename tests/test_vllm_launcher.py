"""The vLLM launcher: settings -> `vllm serve` arguments, for every spec combination."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.resources import make_td
from transcription_api.worker import SETTINGS_ENV, WorkerSettings
from transcription_operator.children import build
from transcription_operator.config import OperatorConfig
from transcription_worker.vllm_launcher import LaunchError, vllm_args

NAMES = ["openai/whisper-large-v3-turbo", "whisper-1"]


def settings(**kw: object) -> WorkerSettings:
    base: dict[str, object] = {
        "engine": "vllm",
        "mode": "continuous",
        "model": NAMES[0],
        "served_names": NAMES,
    }
    return WorkerSettings.model_validate(base | kw)


BASE = ["vllm", "serve", NAMES[0], "--served-model-name", *NAMES, "--host", "0.0.0.0",
        "--port", "8000", "--download-dir", "/var/cache/models"]  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "tail"),
    [
        ({}, []),
        ({"gpus": 1}, []),
        ({"gpus": 4}, ["--tensor-parallel-size", "4"]),
        ({"mode": "sequential"}, ["--max-num-seqs", "1", "--max-num-batched-tokens", "2048"]),
        (
            {"mode": "sequential", "gpus": 2},
            [
                "--tensor-parallel-size",
                "2",
                "--max-num-seqs",
                "1",
                "--max-num-batched-tokens",
                "2048",
            ],
        ),
        # A budget of the user's own replaces the launcher's (vLLM reads `_` as `-`).
        (
            {"mode": "sequential", "extra_args": ["--max_num_batched_tokens=4096"]},
            ["--max-num-seqs", "1", "--max_num_batched_tokens=4096"],
        ),
        ({"revision": "v1.2"}, ["--revision", "v1.2"]),
        (
            {"gpu_memory_utilization": 0.8, "max_model_len": 448},
            ["--gpu-memory-utilization", "0.8", "--max-model-len", "448"],
        ),
        ({"extra_args": ["--enforce-eager", "--dtype=half"]}, ["--enforce-eager", "--dtype=half"]),
    ],
)
def test_argument_mapping(kw: dict[str, object], tail: list[str]) -> None:
    assert vllm_args(settings(**kw)) == BASE + tail


def test_managed_flags_cannot_be_overridden() -> None:
    with pytest.raises(LaunchError, match="engineArgs must not set --port"):
        vllm_args(settings(extra_args=["--port=9000"]))
    with pytest.raises(
        LaunchError,
        match=r"--tensor-parallel-size: it is derived from spec.pools\[\].resources.gpus",
    ):
        vllm_args(settings(extra_args=["--tensor-parallel-size", "2"]))


def test_local_model_directory_is_checked(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"has no config\.json"):
        vllm_args(settings(model=str(tmp_path)))
    (tmp_path / "config.json").write_text(
        json.dumps({"encoder_attention_heads": 20, "decoder_attention_heads": 20})
    )
    assert vllm_args(settings(model=str(tmp_path), gpus=4))[2] == str(tmp_path)
    with pytest.raises(
        LaunchError, match=r"encoder_attention_heads=20 does not divide across 3 GPUs"
    ):
        vllm_args(settings(model=str(tmp_path), gpus=3))


def test_wrong_engine_is_refused() -> None:
    with pytest.raises(LaunchError, match="engine is faster-whisper"):
        vllm_args(settings(engine="faster-whisper", mode="sequential"))


def test_from_the_operators_pod_spec_to_the_command() -> None:
    """What the operator writes into the pod is exactly what the launcher reads."""
    td = make_td({"model": {"name": NAMES[0], "aliases": ["whisper-1"], "revision": "main"},
                  "pools": [{"name": "seq", "mode": "sequential", "resources": {"gpus": 2}, "engineArgs": ["--enforce-eager"]}]})  # fmt: skip
    dep = next(
        m
        for m in build(td, OperatorConfig())
        if m["metadata"]["name"] == "whisper-seq" and m["kind"] == "Deployment"
    )
    env = {
        e["name"]: e["value"]
        for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e
    }
    out = subprocess.run([sys.executable, "-m", "transcription_worker.vllm_launcher", "--print"],
                         env={**env, "PATH": "/usr/bin"}, capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == (
        "vllm serve openai/whisper-large-v3-turbo --served-model-name openai/whisper-large-v3-turbo whisper-1 "
        "--host 0.0.0.0 --port 8000 --download-dir /var/cache/models --revision main "
        "--tensor-parallel-size 2 --max-num-seqs 1 --max-num-batched-tokens 2048 --enforce-eager"
    )


def test_missing_settings_fail_with_a_clear_message() -> None:
    out = subprocess.run([sys.executable, "-m", "transcription_worker.vllm_launcher", "--print"],
                         env={"PATH": "/usr/bin"}, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2
    assert f"{SETTINGS_ENV} is not set" in out.stderr
