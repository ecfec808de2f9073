"""Settings the operator hands a worker pod, read by the worker launcher.

The operator serializes one `WorkerSettings` into the `TRANSCRIPTION_WORKER_SETTINGS`
environment variable of the engine container; the vLLM launcher turns it into `vllm serve`
arguments and the CPU worker configures itself from it. One model, both ends.

It also names the one header the frontend and the workers share: `PRIORITY_HEADER`.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

from .capabilities import Engine, Mode, ModelFamily

SETTINGS_ENV = "TRANSCRIPTION_WORKER_SETTINGS"
WORKER_PORT = 8000
CACHE_DIR = "/var/cache/models"
WEIGHTS_DIR = "/weights"

# The frontend marks the requests it sends a worker on its own behalf as background work
# (long audio's chunks) with this header; everything else -- every request a
# client sent, and realtime turns -- goes without it and is interactive. A faster-whisper
# worker batches interactive windows first. The frontend never forwards a
# client's own headers, so a client cannot mark itself (nor anyone else) background.
PRIORITY_HEADER = "x-transcription-priority"
BACKGROUND = "background"


def is_background(value: str | None) -> bool:
    """Whether a request's `PRIORITY_HEADER` value marks it background. Anything else --
    absent, empty, unknown, malformed -- is interactive: a bad value never demotes a
    request, and is not worth refusing one over (it is a scheduling hint)."""
    return value is not None and value.strip().lower() == BACKGROUND


# Engine flags the operator derives from the spec, and what to set instead. The CRD refuses
# them in `pools[].engineArgs` (one CEL rule each, same message) and the vLLM launcher
# refuses them again before it starts, so a pod never crash-loops on them.
MANAGED_FLAGS: dict[str, str] = {
    "--model": "it is derived from spec.model.name",
    "--served-model-name": "it is derived from spec.model.name and spec.model.aliases",
    "--host": "the operator sets it (workers listen on every interface)",
    "--port": f"the operator sets it (workers listen on {WORKER_PORT}); "
    "the port clients use is spec.frontend.service.port",
    "--download-dir": "it is derived from spec.model.cache",
    "--revision": "it is derived from spec.model.revision",
    "--tensor-parallel-size": "it is derived from spec.pools[].resources.gpus",
    "-tp": "it is derived from spec.pools[].resources.gpus",
    "--max-num-seqs": "it is derived from spec.pools[].mode (sequential sets 1)",
    "--otlp-traces-endpoint": "it is derived from spec.tracing.endpoint",
}


def managed_flag(arg: str) -> str | None:
    """The managed flag an engine argument sets (`--port`, `--port=9000`, `--max_num_seqs=4`:
    vLLM reads underscores as dashes), or None."""
    flag = arg.replace("_", "-").split("=", 1)[0]
    return flag if flag in MANAGED_FLAGS else None


def managed_flag_message(flag: str) -> str:
    return f"engineArgs must not set {flag}: {MANAGED_FLAGS[flag]}"


class WorkerSettings(BaseModel):
    """Everything a worker needs to start serving."""

    model_config = ConfigDict(extra="forbid")

    engine: Engine = Field(description="Engine to run.")
    mode: Mode = Field(description="continuous: batch requests; sequential: one at a time.")
    model: str = Field(description="Hub id or local directory of the weights.")
    served_names: list[str] = Field(
        min_length=1, description="Names the model answers to (primary first, then aliases)."
    )
    revision: str | None = Field(default=None, description="Hub revision.")
    family: ModelFamily = Field(
        default=ModelFamily.WHISPER, description="Kind of model (whisper, audio-lm)."
    )
    gpus: int = Field(default=0, ge=0, description="GPUs of the replica (tensor parallel size).")
    port: int = Field(default=WORKER_PORT, ge=1, le=65535, description="HTTP port.")
    cache_dir: str = Field(default=CACHE_DIR, description="Download/cache directory.")
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0, le=1, description="Fraction of GPU memory vLLM may use."
    )
    max_model_len: int | None = Field(default=None, gt=0, description="Maximum model length.")
    max_queue: int = Field(
        default=16, ge=0, description="Requests a faster-whisper worker queues before 503."
    )
    beam_size: int = Field(default=5, ge=1, le=16, description="faster-whisper beam size.")
    vad_filter: bool = Field(default=False, description="faster-whisper: drop non-speech (VAD).")
    threads: int = Field(
        default=0, ge=0, description="CPU threads: faster-whisper, vLLM without GPUs (0: all)."
    )
    max_batch_size: int = Field(
        default=8, ge=1, description="faster-whisper: 30 s windows decoded in one batch."
    )
    compute_type: str | None = Field(
        default=None, description="faster-whisper compute type (default: int8 on CPUs)."
    )
    otlp_traces_endpoint: str | None = Field(
        default=None,
        description="vLLM: where its OpenTelemetry spans go (OTLP/HTTP, the full /v1/traces "
        "URL; `--otlp-traces-endpoint`); None: vLLM does not trace.",
    )
    extra_args: list[str] = Field(default_factory=list, description="Passed to the engine last.")

    @property
    def model_reference(self) -> str:
        """The model as `transformers serve` names it: a local directory as it is, a hub id
        with `@revision` when one is set. That server has no aliases: every request must
        name the model exactly so (the route table's `worker_model`)."""
        if self.revision and not self.model.startswith("/"):
            return f"{self.model}@{self.revision}"
        return self.model

    def to_env(self) -> str:
        return self.model_dump_json(exclude_defaults=True)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> WorkerSettings:
        env = os.environ if environ is None else environ
        raw = env.get(SETTINGS_ENV)
        if not raw:
            raise ValueError(f"{SETTINGS_ENV} is not set: the operator writes it into the pod")
        return cls.model_validate_json(raw)
