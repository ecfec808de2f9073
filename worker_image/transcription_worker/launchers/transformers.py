"""`transcription-transformers-launcher`: the transformers image's entrypoint.

Reads the settings the operator wrote (TRANSCRIPTION_WORKER_SETTINGS), checks what can be
checked before a model is loaded, and replaces itself with `transformers serve <model>`:
with `--continuous-batching` for a continuous pool, without it for a sequential one.

`transformers serve` has no aliases: pinned to one model, it answers only to that model's
name (chat: 400 "Server is pinned to ..."; transcriptions: it tries to load whatever is
named). The frontend therefore rewrites `model` to `WorkerSettings.model_reference`, which
the route table carries as the pool's `worker_model`.

    transcription-transformers-launcher            exec transformers serve
    transcription-transformers-launcher --print    print the command instead
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import NoReturn

from transcription_api.capabilities import Engine, Mode, ModelFamily
from transcription_api.worker import WorkerSettings

from ..localmodel import missing
from .base import Launcher, LaunchError

__all__ = ["LaunchError", "environment", "main", "transformers_args", "warnings"]

# Flags the launcher sets from the resource's spec; users set them there, not in engineArgs.
MANAGED_FLAGS = {
    "--host": "(fixed)",
    "--port": "(fixed)",
    "--continuous-batching": "spec.pools[].mode",
    "--no-continuous-batching": "spec.pools[].mode",
    "--device": "spec.pools[].resources.gpus",
    "--cb-max-memory-percent": "spec.pools[].gpuMemoryUtilization",
    "--model-timeout": "(fixed: the pinned model is never unloaded)",
    "--non-blocking": "(fixed)",
}
# Model types whose processor `transformers serve`'s transcription endpoint can drive.
WHISPER_MODEL_TYPES = frozenset({"whisper"})


def transformers_args(s: WorkerSettings) -> list[str]:
    """The `transformers serve` command line for these settings; raises LaunchError."""
    if s.engine != Engine.TRANSFORMERS:
        raise LaunchError(
            f"this image runs transformers serve, but the pool's engine is {s.engine.value}"
        )
    for arg in s.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            raise LaunchError(
                f"engineArgs must not set {flag}: it is derived from {MANAGED_FLAGS[flag]}"
            )
    check_model(s)
    args = ["transformers", "serve", s.model_reference, "--host", "0.0.0.0"]
    args += ["--port", str(s.port), "--device", "auto" if s.gpus else "cpu"]
    if s.mode == Mode.CONTINUOUS:
        args.append("--continuous-batching")
        if s.gpu_memory_utilization is not None:
            args += ["--cb-max-memory-percent", str(s.gpu_memory_utilization)]
    # Its request log says, per chat request, whether continuous batching was used.
    if not any(a.split("=", 1)[0] == "--log-level" for a in s.extra_args):
        args += ["--log-level", "info"]
    return args + list(s.extra_args)


def warnings(s: WorkerSettings) -> list[str]:
    """Settings this engine has no use for: said at start, not silently dropped."""
    out = []
    if s.max_model_len is not None:
        out.append("maxModelLen is a vLLM setting; transformers serve has none: ignored")
    if s.gpu_memory_utilization is not None and s.mode == Mode.SEQUENTIAL:
        out.append("gpuMemoryUtilization sizes the continuous-batching cache: ignored in "
                   "sequential mode")  # fmt: skip
    return out


def check_model(s: WorkerSettings) -> None:
    """A local model directory must hold a model of the declared family."""
    if not s.model.startswith("/"):
        return  # a hub id: transformers downloads it into the cache volume
    config = Path(s.model) / "config.json"
    if not config.is_file():
        raise LaunchError(missing(s.model, "config.json", "Hugging Face weights"))
    model_type = str(json.loads(config.read_text()).get("model_type", ""))
    is_whisper = model_type in WHISPER_MODEL_TYPES
    if s.family == ModelFamily.WHISPER and not is_whisper:
        raise LaunchError(
            f"{config} says model_type {model_type!r}, not a Whisper model: set "
            "spec.model.family to audio-lm for a chat model that takes audio"
        )
    if s.family == ModelFamily.AUDIO_LM and is_whisper:
        raise LaunchError(
            f"{config} says model_type {model_type!r}: a Whisper model; set spec.model.family "
            "to whisper"
        )


def environment(s: WorkerSettings, env: dict[str, str]) -> dict[str, str]:
    """The server's environment: no update check against PyPI at start, no telemetry, and a
    local model never reaches for the hub."""
    out = {"HF_HUB_DISABLE_UPDATE_CHECK": "1", "HF_HUB_DISABLE_TELEMETRY": "1", **env}
    if s.model.startswith("/"):
        out.setdefault("HF_HUB_OFFLINE", "1")
    return out


def check_with_transformers_parser(args: list[str]) -> None:
    """Where transformers is installed (its image), parse with `transformers serve`'s parser."""
    try:
        import click
        from transformers.cli.transformers import app
    except ImportError:
        return
    try:
        serve = app.get_command(click.Context(app), "serve")
        serve.make_context("serve", list(args[2:]))  # without "transformers serve"
    except click.exceptions.ClickException as e:
        raise LaunchError(f"transformers serve rejects the arguments: {e.format_message()}") from e


def start(settings: WorkerSettings, args: list[str]) -> NoReturn:
    """The `transformers` command of the launcher's own environment, PATH or not."""
    sibling = Path(sys.executable).parent / args[0]
    program = str(sibling) if sibling.exists() else args[0]
    os.execvpe(program, args, environment(settings, dict(os.environ)))


LAUNCHER = Launcher(
    prog="transcription-transformers-launcher",
    doc=__doc__ or "",
    command=transformers_args,
    check=check_with_transformers_parser,
    warnings=warnings,
    start=start,
)
main = LAUNCHER.main


if __name__ == "__main__":
    sys.exit(main())
