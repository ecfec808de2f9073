"""The transformers launcher: settings -> `transformers serve` arguments and environment.

The real process runs in tests/transformers_engine/ (its own environment); these tests
cover every mapping and every refusal without torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.resources import make_td
from transcription_api.worker import SETTINGS_ENV, WorkerSettings
from transcription_operator.children import build
from transcription_operator.config import OperatorConfig
from transcription_worker.launchers.transformers import (
    LaunchError,
    environment,
    transformers_args,
    warnings,
)

HUB = "openai/whisper-large-v3-turbo"


def settings(**kw: object) -> WorkerSettings:
    base: dict[str, object] = {"engine": "transformers", "mode": "sequential", "model": HUB,
                               "served_names": [HUB, "whisper-1"]}  # fmt: skip
    return WorkerSettings.model_validate(base | kw)


BASE = ["transformers", "serve", HUB, "--host", "0.0.0.0", "--port", "8000"]


@pytest.mark.parametrize(
    ("kw", "tail"),
    [
        ({}, ["--device", "cpu", "--log-level", "info"]),
        ({"mode": "continuous"}, ["--device", "cpu", "--continuous-batching", "--log-level", "info"]),
        ({"gpus": 2}, ["--device", "auto", "--log-level", "info"]),
        ({"mode": "continuous", "gpus": 1, "gpu_memory_utilization": 0.5},
         ["--device", "auto", "--continuous-batching", "--cb-max-memory-percent", "0.5", "--log-level", "info"]),
        ({"extra_args": ["--dtype=bfloat16", "--log-level", "warning"]},
         ["--device", "cpu", "--dtype=bfloat16", "--log-level", "warning"]),
    ],
)  # fmt: skip
def test_argument_mapping(kw: dict[str, object], tail: list[str]) -> None:
    assert transformers_args(settings(**kw)) == BASE + tail


def test_a_revision_is_part_of_the_model_name_it_is_pinned_to() -> None:
    s = settings(revision="v1.2")
    assert s.model_reference == f"{HUB}@v1.2"
    assert transformers_args(s)[2] == f"{HUB}@v1.2"
    assert settings(model="/weights/m", revision="v1.2").model_reference == "/weights/m"


def test_managed_flags_cannot_be_overridden() -> None:
    with pytest.raises(LaunchError, match="engineArgs must not set --port: it is derived"):
        transformers_args(settings(extra_args=["--port=9000"]))
    with pytest.raises(LaunchError, match=r"--continuous-batching: .*spec.pools\[\].mode"):
        transformers_args(settings(extra_args=["--continuous-batching"]))


def test_wrong_engine_is_refused() -> None:
    with pytest.raises(LaunchError, match="runs transformers serve, but the pool's engine is vllm"):
        transformers_args(settings(engine="vllm"))


def test_settings_it_has_no_use_for_are_said() -> None:
    assert warnings(settings()) == []
    assert warnings(settings(max_model_len=448, gpu_memory_utilization=0.5)) == [
        "maxModelLen is a vLLM setting; transformers serve has none: ignored",
        "gpuMemoryUtilization sizes the continuous-batching cache: ignored in sequential mode",
    ]


def model_dir(tmp_path: Path, model_type: str | None) -> str:
    if model_type is not None:
        (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(tmp_path)


def test_local_model_directory_is_checked(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"has no config\.json \(Hugging Face weights\): it "
                       r"holds nothing\. Check spec\.model\.path"):  # fmt: skip
        transformers_args(settings(model=model_dir(tmp_path, None)))
    path = model_dir(tmp_path, "qwen2_audio")
    with pytest.raises(
        LaunchError,
        match=r"'qwen2_audio', not a Whisper model: set spec\.model\.family to audio-lm",
    ):
        transformers_args(settings(model=path))
    assert transformers_args(settings(model=path, family="audio-lm"))[2] == path
    path = model_dir(tmp_path, "whisper")
    with pytest.raises(LaunchError, match=r"a Whisper model; set spec\.model\.family to whisper"):
        transformers_args(settings(model=path, family="audio-lm"))
    assert transformers_args(settings(model=path))[2] == path  # fmt: skip


def test_environment_keeps_local_models_off_the_hub() -> None:
    env = environment(settings(model="/models/whisper-tiny.en"), {"HF_HOME": "/cache"})
    assert env == {"HF_HOME": "/cache", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
                   "HF_HUB_DISABLE_TELEMETRY": "1"}  # fmt: skip
    assert "HF_HUB_OFFLINE" not in environment(settings(), {})


def run_launcher(env_settings: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != SETTINGS_ENV}
    if env_settings is not None:
        env[SETTINGS_ENV] = env_settings
    return subprocess.run(
        [sys.executable, "-m", "transcription_worker.launchers.transformers", *args],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_print_shows_the_command_the_operator_settings_give() -> None:
    """The settings the operator writes into a transformers pool's pod, end to end."""
    td = make_td({"model": {"name": HUB, "aliases": ["whisper-1"], "revision": "main"},
                  "engine": "transformers", "pools": [{"name": "chat", "resources": {"gpus": 1}}]})  # fmt: skip
    deployment = next(m for m in build(td, OperatorConfig())
                      if m["kind"] == "Deployment" and m["metadata"]["name"] == "whisper-chat")  # fmt: skip
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    # Probes: transformers serve answers /health only once the pinned model is loaded, and
    # 503 when its continuous-batching worker died.
    assert {container[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {"/health"}  # fmt: skip
    out = run_launcher(env[SETTINGS_ENV], "--print")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        f"transformers serve {HUB}@main --host 0.0.0.0 --port 8000 --device auto "
        "--continuous-batching --log-level info"
    )


def test_bad_settings_exit_2_with_the_reason() -> None:
    out = run_launcher(None)
    assert out.returncode == 2
    assert "TRANSCRIPTION_WORKER_SETTINGS is not set" in out.stderr
    out = run_launcher(settings(extra_args=["--host=::"]).to_env())
    assert out.returncode == 2
    assert "engineArgs must not set --host" in out.stderr
