"""`spec.pools`, `spec.autoSplit` and `spec.traffic`: the workers, the pool the operator
adds, and the traffic some pool must serve.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from ..capabilities import Engine, Mode
from ..frontend import TARGET_QUEUE_SECONDS
from ..schema import CrdModel, KubeObject, Rule, validations
from ..units import DURATION
from ..worker import MANAGED_FLAGS, managed_flag, managed_flag_message
from .containers import EnvVar, ResourcesSpec

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_ENGINE_ARGS = 64
# A worker has 30 minutes to load its weights (the startup probe of its pod); its
# rollout's default progress deadline leaves 5 more.
WORKER_PROGRESS_DEADLINE = 35 * 60


AUTOSCALING_RULES: list[Rule[AutoscalingSpec]] = [
    Rule(
        "self.minReplicas <= self.maxReplicas",
        "minReplicas must not exceed maxReplicas",
        lambda a: a.min_replicas <= a.max_replicas,
    )
]


class AutoscalingSpec(CrdModel):
    """Scaling with demand, by KEDA, on the audio the frontend reports queued and in flight
    for the pool, against what a replica decodes per second."""

    model_config = ConfigDict(json_schema_extra=validations(AUTOSCALING_RULES))

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Fewest replicas. 0 lets the pool scale to zero when idle; the frontend "
        "holds requests while it wakes.",
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas.")
    target_queue_seconds: float = Field(
        default=TARGET_QUEUE_SECONDS,
        gt=0,
        le=3600,
        description="Seconds of work per replica the autoscaler aims at: the audio queued "
        "and in flight for the pool (uploads whose length is known included), over what a "
        "replica decodes per second, divided among the replicas. Lower: more replicas, "
        "shorter waits.",
    )
    audio_seconds_per_replica: float | None = Field(
        default=None,
        gt=0,
        le=100000,
        description="Seconds of audio one replica decodes per second, assumed until the "
        "frontend has measured it on the pool's answers. Default: the engine's, by mode "
        "(vllm continuous 20, faster-whisper continuous 4, half that in sequential pools; "
        "transformers 2).",
    )
    target: float | None = Field(
        default=None,
        description="Ignored: pools scale on audio-seconds (targetQueueSeconds) since "
        "requests of 2 s and 2 h are not the same work. Kept so that resources written "
        "for earlier releases still apply; remove it.",
    )
    scale_down_delay: str = Field(
        default="5m",
        pattern=DURATION,
        max_length=20,
        description="How long load must stay low before replicas are removed, and how long "
        "a pool stays idle before it scales to zero (e.g. 90s, 5m).",
    )


def _sets_no(flag: str) -> Rule[PoolSpec]:
    """A managed flag refused in engineArgs (the vLLM launcher refuses it again)."""
    return Rule(
        "!has(self.engineArgs) || !self.engineArgs.exists(a, "
        f"a.replace('_', '-') == '{flag}' || a.replace('_', '-').startsWith('{flag}='))",
        managed_flag_message(flag),
        lambda p: all(managed_flag(a) != flag for a in p.engine_args),
        field_path=".engineArgs",
    )


POOL_RULES: list[Rule[PoolSpec]] = [_sets_no(flag) for flag in MANAGED_FLAGS]


class PoolSpec(CrdModel):
    """A set of identical workers with one engine and batching mode."""

    model_config = ConfigDict(json_schema_extra=validations(POOL_RULES))

    name: str = Field(
        description="Pool name; part of the child objects' names.",
        max_length=30,
        pattern=DNS_LABEL,
    )
    engine: Engine | None = Field(
        default=None, description="Engine of this pool; default: spec.engine."
    )
    mode: Mode | None = Field(
        default=None,
        description="'continuous' (the engine batches concurrent requests) or 'sequential' "
        "(one request at a time per replica). Default: continuous where the engine supports "
        "it, else sequential.",
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Number of worker replicas (ignored when autoscaling is set).",
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description="Scale with demand between minReplicas and maxReplicas (KEDA must be "
        "installed; status says when it is not).",
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="Resources of each replica."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the workers must run on."
    )
    tolerations: list[KubeObject] = Field(
        default_factory=list,
        description="Tolerations (as in a pod spec). GPU pools tolerate the nvidia.com/gpu "
        "taint automatically.",
    )
    affinity: KubeObject | None = Field(default=None, description="Affinity (as in a pod spec).")
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of each GPU's memory vLLM may use (vLLM default: 0.9).",
    )
    max_model_len: int | None = Field(
        default=None, gt=0, description="Maximum model length (vLLM); default: the model's."
    )
    max_in_flight_per_replica: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Requests the frontend sends one replica at once; more wait in the "
        "frontend, where tenants share the pool fairly (docs/gateway.md). Default: twice "
        "what a replica decodes at once (faster-whisper continuous: 2 x maxBatchSize, vllm "
        "continuous: 512, sequential pools and transformers: 2), so that it only bites when "
        "the pool is saturated.",
    )
    max_queue: int = Field(
        default=16,
        ge=0,
        le=10000,
        description="faster-whisper: requests a replica queues beyond those it is decoding, "
        "before answering 503.",
    )
    beam_size: int = Field(
        default=5,
        ge=1,
        le=16,
        description="faster-whisper: beam size of decoding (1: greedy). Requests at "
        "temperature 0 fall back to sampling at rising temperatures when the text looks wrong.",
    )
    vad_filter: bool = Field(
        default=False,
        description="faster-whisper: decode only the speech Silero VAD finds, leaving out "
        "silence and music (fewer hallucinations on sparse audio, for some CPU).",
    )
    threads: int = Field(
        default=0,
        ge=0,
        le=256,
        description="faster-whisper, and vLLM on pools without GPUs: CPU threads of a "
        "replica; 0: its CPU request rounded up, or every CPU the container may use.",
    )
    max_batch_size: int = Field(
        default=8,
        ge=1,
        le=256,
        description="faster-whisper: 30 s windows of audio decoded together in one batch "
        "(continuous mode batches concurrent requests; sequential, one long request's).",
    )
    engine_args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        description="Extra arguments for the engine, passed through last (e.g. "
        "--max-model-len=448). Flags the operator derives from the spec (--port, "
        "--tensor-parallel-size, --served-model-name, ...) are refused, naming the field to "
        "set instead.",
        max_length=MAX_ENGINE_ARGS,
    )
    env: list[EnvVar] = Field(
        default_factory=list, description="Extra environment for the engine container."
    )
    progress_deadline_seconds: int = Field(
        default=WORKER_PROGRESS_DEADLINE,
        ge=10,
        le=86_400,
        description="Seconds a rollout of the pool may go without progress before status "
        "reports it failed (ProgressDeadlineExceeded, Degraded=True; the old replicas keep "
        "serving). The default is above the 30 minutes a worker has to load its weights.",
    )


class AutoSplitSpec(CrdModel):
    """The sequential pool the operator adds when no declared pool covers the traffic."""

    enabled: bool = Field(
        default=True,
        description="Add a sequential pool automatically for traffic no pool can serve.",
    )
    replicas: int = Field(default=1, ge=0, le=1000, description="Replicas of the added pool.")
    resources: ResourcesSpec | None = Field(
        default=None,
        description="Resources of the added pool; default: those of the pool it splits from, "
        "with no more GPUs than its engine can use (one for faster-whisper and transformers). "
        "Status and the SequentialPoolAdded Event say what it requests.",
    )


class TrafficSpec(CrdModel):
    """The traffic the deployment must serve; the operator makes sure some pool covers it."""

    endpoints: list[Literal["transcriptions", "translations", "chat"]] = Field(
        default_factory=lambda: ["transcriptions"],  # type: ignore[arg-type]
        description="OpenAI endpoints served: transcriptions, translations, chat "
        "(/v1/chat/completions).",
        max_length=3,
    )
    features: list[
        Literal[
            "stream", "segment_timestamps", "word_timestamps", "language_detection", "diarization"
        ]
    ] = Field(
        default_factory=list,
        description="Options requests will use: stream, segment_timestamps (also needed for "
        "srt/vtt/verbose_json), word_timestamps, language_detection, diarization "
        "(response_format diarized_json: the faster-whisper pools, declared or added, run the "
        "speaker stage, its model mounted from the operator's speaker model image).",
        max_length=5,
    )
