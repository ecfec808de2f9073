"""What each (engine, mode) pair can serve, and what a request needs: the one definition
every component reads.

The operator turns the traffic a resource declares into needs (`traffic_needs`) and adds a
sequential pool when no pool covers one (the automatic split); the frontend turns each
request into needs (`request_needs`), routes it to a pool whose set covers them, and names
the missing capability in a 400 when none can. Upload limits come from here too.

What an engine serves can depend on the kind of model as much as on the mode: with
`transformers serve`, a Whisper model transcribes in both modes and cannot chat, while an
audio language model chats (audio input included) and cannot transcribe. So the lookup
takes the model family too (`spec.model.family`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from .openai import Granularity, ResponseFormat


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
    scale_target: float = Field(
        default=8,
        gt=0,
        description="Default autoscaling target: requests in flight plus queued per replica.",
    )
    stream_dialect: str = Field(
        default="openai-chunk",
        description="Shape of the engine's stream: 'openai-chunk' (vLLM's transcription.chunk "
        "events), 'raw-text' (bare text deltas, transformers serve) or 'chat-chunk' "
        "(chat.completion.chunk events ending with a finish_reason: transcriptions through chat).",
    )
    transcribe_via_chat: bool = Field(
        default=False,
        description="The engine has no working transcription endpoint for the model, which is "
        "a chat model that takes audio: the frontend asks its chat endpoint for the "
        "transcript, with the audio and an instruction (the pool's transcription_prompt).",
    )

    def missing(self, needs: frozenset[Capability]) -> frozenset[Capability]:
        return needs - self.capabilities

    def covers(self, needs: frozenset[Capability]) -> bool:
        return not self.missing(needs)


C = Capability
AUDIO = frozenset(Capability) - {Capability.CHAT}
VLLM_MAX_UPLOAD = 25 * 1024 * 1024  # vLLM's VLLM_MAX_AUDIO_CLIP_FILESIZE_MB default
# The CPU worker spools uploads to disk and decodes them as a stream: the largest upload
# the CRD lets a frontend accept (spec.frontend.maxUploadBytes) is the largest it takes.
MAX_UPLOAD = 4 * 1024**3

_VLLM = frozenset(
    {C.TRANSCRIPTIONS, C.TRANSLATIONS, C.STREAM, C.SEGMENT_TIMESTAMPS, C.LANGUAGE_DETECTION}
)

# `transformers serve` decodes audio with soundfile (libsndfile) when torchcodec is not
# installed, as in our image: MP4/M4A, WebM, AAC and WMA get a bare 500 (`m4a`; the real
# suite's test_containers checks every one).
_SOUNDFILE_FORMATS = frozenset({"wav", "flac", "mp3", "ogg", "aiff", "au", "caf"})
_TRANSFORMERS_WHISPER = CapabilitySet(
    capabilities=frozenset({C.TRANSCRIPTIONS, C.STREAM}),
    max_concurrency=1,
    scale_target=2,
    max_audio_seconds=30,
    audio_formats=_SOUNDFILE_FORMATS,
    native_formats=frozenset({"json"}),
    stream_dialect="raw-text",
)

# Whisper-family models (the default), per (engine, mode).
CAPABILITIES: dict[tuple[Engine, Mode], CapabilitySet] = {
    # vLLM transcribes in both modes; no word timestamps, no srt/vtt, `text` comes as JSON,
    # uploads over 25 MB are refused.
    (Engine.VLLM, Mode.CONTINUOUS): CapabilitySet(
        capabilities=_VLLM,
        max_upload_bytes=VLLM_MAX_UPLOAD,
        native_formats=frozenset({"json", "verbose_json"}),
    ),
    (Engine.VLLM, Mode.SEQUENTIAL): CapabilitySet(
        capabilities=_VLLM,
        max_upload_bytes=VLLM_MAX_UPLOAD,
        max_concurrency=1,
        scale_target=2,
        native_formats=frozenset({"json", "verbose_json"}),
    ),
    # Our faster-whisper worker serves everything. Continuous: the 30 s windows of concurrent
    # requests are decoded together, one CTranslate2 batch at a time.
    (Engine.FASTER_WHISPER, Mode.CONTINUOUS): CapabilitySet(
        capabilities=AUDIO,
        max_upload_bytes=MAX_UPLOAD,
        # Batching buys little on CPU (bench worker: 1.06x at 8 clients), more on a GPU.
        scale_target=4,
        native_formats=frozenset({"json", "text", "srt", "vtt", "verbose_json"}),
    ),
    # Sequential: one request at a time (its windows still decoded together).
    (Engine.FASTER_WHISPER, Mode.SEQUENTIAL): CapabilitySet(
        capabilities=AUDIO,
        max_upload_bytes=MAX_UPLOAD,
        max_concurrency=1,
        scale_target=2,
        native_formats=frozenset({"json", "text", "srt", "vtt", "verbose_json"}),
    ),
    # `transformers serve` (5.24) with a Whisper model; evidence in tests/transformers_engine/
    # and its recordings in tests/fixtures/transformers-5.24/. The same in both modes: under
    # --continuous-batching a transcription still runs on the sequential generation thread
    # (`cb_whisper_json`; the "requires sequential generation (not CB)" 400 is unreachable),
    # one at a time. Only `{"text"}` comes back, whatever response_format asks
    # (`espeak_verbose_json`, `espeak_srt`): no segments. `stream` sends bare text deltas
    # (`espeak_stream`, `cb_whisper_stream`). No translations route (`translations`, 404);
    # audio past 30 s is dropped (`long_audio`); `language` is ignored, so language detection
    # is not claimed; no chat for Whisper (`whisper_chat`, 500).
    (Engine.TRANSFORMERS, Mode.CONTINUOUS): _TRANSFORMERS_WHISPER,
    (Engine.TRANSFORMERS, Mode.SEQUENTIAL): _TRANSFORMERS_WHISPER,
}


# Audio language models: `transformers serve` chats with them, audio input included
# (`cb_audio_lm_chat_audio`; streamed: `cb_audio_lm_chat_stream`, chat.completion.chunk
# events whose last one has a finish_reason, no [DONE]), in both modes. They are never
# batched (it batches text-only models alone and falls back to sequential generation), and
# its transcription endpoint fails on their processors with a bare 500 in both modes
# (`cb_audio_lm_transcription`, `audio_lm_transcription`). So they transcribe the way audio
# language models are asked to: through chat, the audio and an instruction in one user
# message (the frontend builds it; `chat_transcription_json`, `chat_transcription_stream`).
# Their feature extractor is Whisper's: the first 30 s of audio. Other engines: not shown
# to serve them.
_TRANSFORMERS_AUDIO_LM = CapabilitySet(
    capabilities=frozenset({C.CHAT, C.TRANSCRIPTIONS, C.STREAM}),
    max_concurrency=1,
    scale_target=2,
    max_audio_seconds=30,
    audio_formats=_SOUNDFILE_FORMATS,
    native_formats=frozenset(),
    stream_dialect="chat-chunk",
    transcribe_via_chat=True,
)
FAMILY_CAPABILITIES: dict[ModelFamily, dict[tuple[Engine, Mode], CapabilitySet]] = {
    ModelFamily.WHISPER: CAPABILITIES,
    ModelFamily.AUDIO_LM: {
        (Engine.TRANSFORMERS, Mode.CONTINUOUS): _TRANSFORMERS_AUDIO_LM,
        (Engine.TRANSFORMERS, Mode.SEQUENTIAL): _TRANSFORMERS_AUDIO_LM,
    },
}


def capability_set(
    engine: Engine, mode: Mode, family: ModelFamily = ModelFamily.WHISPER
) -> CapabilitySet | None:
    """The capability set of a pair for a model family, or None when the engine cannot run
    in that mode or cannot serve that family at all."""
    return FAMILY_CAPABILITIES[family].get((engine, mode))


def family_engines(family: ModelFamily) -> list[Engine]:
    """Engines that can serve a model family at all."""
    return list(dict.fromkeys(e for (e, _) in FAMILY_CAPABILITIES[family]))


def supported_modes(engine: Engine) -> list[Mode]:
    return [m for (e, m) in CAPABILITIES if e == engine]


# Engines the automatic split may add, in order of preference, after the pool's own engine.
SPLIT_FALLBACK_ENGINES = (Engine.FASTER_WHISPER,)


# --------------------------------------------------------------------------- needs

ENDPOINTS = (Capability.TRANSCRIPTIONS, Capability.TRANSLATIONS)
SEGMENT_FORMATS = (ResponseFormat.SRT, ResponseFormat.VTT, ResponseFormat.VERBOSE_JSON)


def request_needs(
    endpoint: Capability,
    *,
    stream: bool = False,
    response_format: ResponseFormat = ResponseFormat.JSON,
    granularities: Iterable[Granularity] = (),
) -> frozenset[Capability]:
    """What a (valid) request needs from the pool that serves it."""
    needs = {endpoint}
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
