"""What an engine profile says: the facts about one engine that the operator, the frontend
and the CRD read, each stated once.

A profile names the engine's capability sets per model family and mode (what it serves),
how each family is asked (a transcription endpoint, or chat), the dialects of its streams
and errors, the request fields it accepts, the GPUs one replica can use and the images that
run it. The profiles themselves are `engines/<engine>.py`; `engines/__init__.py` holds them
together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from ..capabilities import CapabilitySet, Engine, Mode, ModelFamily


class Asked(StrEnum):
    """How the frontend asks an engine for a transcription."""

    TRANSCRIPTION = "transcription"  # POST /v1/audio/{transcriptions,translations}, multipart
    # POST /v1/chat/completions: the audio (an input_audio part) and an instruction, for a
    # chat model that takes audio and has no working transcription endpoint.
    CHAT = "chat"


class StreamDialect(StrEnum):
    """Shape of an engine's transcription stream (`stream=true`)."""

    OPENAI_CHUNK = "openai-chunk"  # transcription.chunk events, then [DONE] (vLLM's)
    RAW_TEXT = "raw-text"  # bare text deltas, no [DONE] (transformers serve)
    # chat.completion.chunk events, the last with a finish_reason: transcriptions through chat
    CHAT_CHUNK = "chat-chunk"


class ErrorDialect(StrEnum):
    """How an engine answers errors. An `{"error": {...}}` body reads as OpenAI's in every
    dialect."""

    OPENAI = "openai"  # OpenAI's shape and statuses, nothing else
    # A FastAPI app: the errors FastAPI builds are `{"detail": ...}`, invalid input a 422
    # (OpenAI: 400).
    FASTAPI = "fastapi"
    # A FastAPI app whose upload over its cap is a 400 BadRequestError "Maximum file size
    # exceeded ..." (OpenAI: 413).
    VLLM = "vllm"


@dataclass(frozen=True)
class Image:
    """A container image the operator runs, by key: the operator's default comes from
    `<KEY>_IMAGE` (the chart sets it), a resource's override from `spec.images.<key>`."""

    key: str  # "faster-whisper-cuda"
    repository: str  # its repository under the operator's default registry ("worker-cuda")
    dockerfile: str  # what builds it, from the repository root

    @property
    def env(self) -> str:
        """The operator's environment variable of the default ("FASTER_WHISPER_CUDA_IMAGE")."""
        return self.key.upper().replace("-", "_") + "_IMAGE"

    @property
    def field(self) -> str:
        """The field of `spec.images` that overrides it ("faster_whisper_cuda")."""
        return self.key.replace("-", "_")


def one_at_a_time(caps: CapabilitySet) -> CapabilitySet:
    """An engine's capability set in sequential mode, where one replica runs one request at
    a time: what it serves in continuous mode, assumed to decode half as fast without
    batching until the frontend has measured it; sent two at a time (one decoding, the
    next waiting)."""
    rate = caps.audio_seconds_per_replica / 2
    return CapabilitySet.model_validate(
        dict(caps)
        | {"max_concurrency": 1, "audio_seconds_per_replica": rate, "max_in_flight_per_replica": 2}
    )


@dataclass(frozen=True)
class Serving:
    """How an engine serves one model family."""

    modes: Mapping[Mode, CapabilitySet]  # what it serves per mode; a mode absent: cannot run
    asked: Asked = Asked.TRANSCRIPTION
    stream_dialect: StreamDialect = StreamDialect.OPENAI_CHUNK
    # The transcription request fields it takes (array fields without `[]`); None: every field
    # (it ignores those it does not know). The frontend refuses any other with a 400.
    transcription_fields: frozenset[str] | None = None


@dataclass(frozen=True)
class EngineProfile:
    """Everything the rest of the project knows about one engine."""

    engine: Engine
    serves: Mapping[ModelFamily, Serving]  # the families it can serve at all
    cpu_image: Image  # the image of pools without GPUs
    gpu_image: Image  # the image of pools with GPUs
    usable_gpus: int | None  # GPUs one replica puts to use (None: any number)
    error_dialect: ErrorDialect
    # The chat request fields it takes; None: every field.
    chat_fields: frozenset[str] | None = None
    # It answers to every served name (the primary model and its aliases); False: only to the
    # model it loaded, which the route table then carries as the pool's `worker_model`.
    aliases: bool = True
    # Shared memory its worker processes exchange tensors through (a memory-backed /dev/shm).
    shared_memory: str | None = None
    # Its workers read the pool's decoding settings (beam size, VAD, threads, batch size,
    # compute type): our own worker does.
    decoding_settings: bool = False
    # Its worker runs the speaker stage too where the deployment asks for diarization
    # (POST /v1/audio/diarization, with the speaker model mounted): our own worker does.
    speaker_stage: bool = False

    def serving(self, family: ModelFamily) -> Serving | None:
        return self.serves.get(family)

    def capability_set(self, mode: Mode, family: ModelFamily) -> CapabilitySet | None:
        serving = self.serves.get(family)
        return None if serving is None else serving.modes.get(mode)

    @property
    def modes(self) -> list[Mode]:
        """The modes it can run in, for some family."""
        return list(dict.fromkeys(m for s in self.serves.values() for m in s.modes))

    def image(self, gpus: int) -> Image:
        return self.gpu_image if gpus else self.cpu_image
