"""The vocabulary of what pools serve, and what a request needs: engines, modes, model
families, capabilities and capability sets, read by every component.

The operator turns the traffic a resource declares into needs (`traffic_needs`) and adds a
sequential pool when no pool covers one (the automatic split); the frontend turns each
request into needs (`request_needs`), routes it to a pool whose set covers them, and names
the missing capability in a 400 when none can.

Which set each (engine, mode) pair has is an engine's fact: its profile says it, per model
family (`engines/`). What an engine serves can depend on the kind of model as much as on the
mode: with `transformers serve`, a Whisper model transcribes in both modes and cannot chat,
while an audio language model chats (audio input included) and cannot transcribe through
its transcription endpoint. So the lookup takes the model family too (`spec.model.family`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from .openai import SEGMENT_FORMATS, Granularity, ResponseFormat


class Engine(StrEnum):
    """Inference engine of a pool."""

    VLLM = "vllm"
    FASTER_WHISPER = "faster-whisper"
    TRANSFORMERS = "transformers"


class Mode(StrEnum):
    """Batching mode of a pool."""

    CONTINUOUS = "continuous"
    SEQUENTIAL = "sequential"


class ModelFamily(StrEnum):
    """What kind of model a deployment serves; decides, with engine and mode, what a pool serves."""

    WHISPER = "whisper"  # speech-to-text: Whisper and models with its processor
    AUDIO_LM = "audio-lm"  # a chat model that takes audio input (Qwen2-Audio, Voxtral, ...)


class Capability(StrEnum):
    """One thing a request can need from a pool. The value is what error messages name."""

    CHAT = "chat"  # POST /v1/chat/completions
    TRANSCRIPTIONS = "transcriptions"
    TRANSLATIONS = "translations"
    STREAM = "stream"
    SEGMENT_TIMESTAMPS = "segment_timestamps"
    WORD_TIMESTAMPS = "word_timestamps"
    LANGUAGE_DETECTION = "language_detection"
    # Detection among the languages a request names (`languages[]` with several).
    RESTRICTED_LANGUAGE_DETECTION = "restricted_language_detection"
    # `keywords[]` in the prompt help: faster-whisper (its temperature fallback keeps a
    # prompted decode out of loops). vLLM's greedy decode runs away with them (bench
    # keywords); transformers serve accepts a prompt and ignores it.
    KEYWORDS = "keywords"
    LOGPROBS = "logprobs"  # the transcript's token log probabilities (`include[]=logprobs`)
    # Who spoke when (`response_format=diarized_json`, `known_speaker_*[]`): the speaker
    # stage (transcription_worker.speakers) joined to the transcript.
    DIARIZATION = "diarization"


class CapabilitySet(BaseModel):
    """What a pool serves and its limits."""

    model_config = ConfigDict(frozen=True)

    capabilities: frozenset[Capability] = Field(
        description="Endpoints and options the pool serves."
    )
    max_upload_bytes: int | None = Field(
        default=None, description="Largest upload the engine accepts (None: no limit)."
    )
    max_concurrency: int | None = Field(
        default=None, description="Requests one replica runs at once (None: engine batches)."
    )
    max_audio_seconds: float | None = Field(
        default=None,
        description="Longest audio transcribed whole; the engine silently drops the rest of "
        "longer audio (None: no limit).",
    )
    audio_formats: frozenset[str] | None = Field(
        default=None,
        description="Audio containers the engine decodes, by the names the frontend sniffs "
        "(wav, flac, mp3, ogg, aiff, au, caf, mp4, webm, aac, wma, amr); the frontend sends "
        "other files to another pool or refuses them (None: whatever ffmpeg reads).",
    )
    native_formats: frozenset[str] = Field(
        description="response_format values the engine renders itself; the frontend renders "
        "the others (text from the transcript, srt/vtt/json from segments)."
    )
    audio_seconds_per_replica: float = Field(
        default=20,
        gt=0,
        description="Seconds of audio one replica decodes per second, that autoscaling "
        "assumes until the frontend has measured it (`autoscaling.audioSecondsPerReplica`).",
    )
    max_in_flight_per_replica: int = Field(
        default=512,
        ge=1,
        description="Requests the frontend sends one replica at once by default "
        "(`pools[].maxInFlightPerReplica`): twice what it decodes at once (one batch "
        "decoding, the next waiting at the worker). More wait in the frontend, in fair order "
        "between tenants.",
    )

    def missing(self, needs: frozenset[Capability]) -> frozenset[Capability]:
        return needs - self.capabilities

    def covers(self, needs: frozenset[Capability]) -> bool:
        return not self.missing(needs)


def with_speakers(caps: CapabilitySet, speakers: bool) -> CapabilitySet:
    """A pool's set, with diarization where its workers run the speaker stage too."""
    if not speakers:
        return caps
    return caps.model_copy(update={"capabilities": caps.capabilities | {Capability.DIARIZATION}})


# Every capability of the audio endpoints that an engine here has (all but chat and
# diarization): faster-whisper's.
AUDIO = frozenset(Capability) - {Capability.CHAT, Capability.DIARIZATION}
# The largest upload the CRD lets a frontend accept (spec.frontend.maxUploadBytes); the CPU
# worker, which spools uploads to disk and decodes them as a stream, takes all of it.
MAX_UPLOAD = 4 * 1024**3


# --------------------------------------------------------------------------- needs

ENDPOINTS = (Capability.TRANSCRIPTIONS, Capability.TRANSLATIONS)


def request_needs(
    endpoint: Capability,
    *,
    stream: bool = False,
    response_format: ResponseFormat = ResponseFormat.JSON,
    granularities: Iterable[Granularity] = (),
    languages: int = 0,
    keywords: bool = False,
    logprobs: bool = False,
) -> frozenset[Capability]:
    """What a (valid) request needs from the pool that serves it (`languages`: how many
    languages[] it names)."""
    needs = {endpoint}
    if response_format == ResponseFormat.DIARIZED_JSON:
        needs |= {Capability.DIARIZATION, Capability.SEGMENT_TIMESTAMPS}
    if keywords:
        needs.add(Capability.KEYWORDS)
    if logprobs:
        needs.add(Capability.LOGPROBS)
    if languages > 1:
        needs.add(Capability.RESTRICTED_LANGUAGE_DETECTION)
    if stream:
        needs.add(Capability.STREAM)
    if response_format in SEGMENT_FORMATS:
        needs.add(Capability.SEGMENT_TIMESTAMPS)
    if Granularity.WORD in granularities:
        needs.add(Capability.WORD_TIMESTAMPS)
    return frozenset(needs)


# The declared features a chat request can use; the others are about transcripts.
CHAT_FEATURES = frozenset({Capability.STREAM})


def traffic_needs(endpoints: Iterable[str], features: Iterable[str]) -> list[frozenset[Capability]]:
    """Kinds of request declared traffic sends: each endpoint, alone and with each feature
    that applies to it."""
    feats = [Capability(f) for f in features]
    needs: list[frozenset[Capability]] = []
    for endpoint in map(Capability, endpoints):
        needs.append(frozenset({endpoint}))
        needs.extend(
            frozenset({endpoint, f})
            for f in feats
            if endpoint != Capability.CHAT or f in CHAT_FEATURES
        )
    return needs


def covered(pools: Iterable[CapabilitySet], needs: frozenset[Capability]) -> bool:
    """Whether some pool serves a request with these needs."""
    return any(p.covers(needs) for p in pools)
