"""OpenAI audio API wire objects: one pydantic model per object, validated at the boundary.

Shared by the frontend (which validates requests and renders responses) and the CPU worker
(which answers in the same shapes as vLLM).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ResponseFormat(StrEnum):
    JSON = "json"
    TEXT = "text"
    SRT = "srt"
    VTT = "vtt"
    VERBOSE_JSON = "verbose_json"
    DIARIZED_JSON = "diarized_json"  # who spoke when (transcription_api.diarization)


# The formats made from segments (a transcript's timestamps), not from its text alone.
SEGMENT_FORMATS = (ResponseFormat.SRT, ResponseFormat.VTT, ResponseFormat.VERBOSE_JSON)


class Granularity(StrEnum):
    WORD = "word"
    SEGMENT = "segment"


class TranscriptionRequest(BaseModel):
    """The form fields of `POST /v1/audio/transcriptions` and `/translations` that servers
    act on (besides `file`); any other field passes through to the engine.

    Parsed from a form by `transcription_api.params.parse_request`; the gateway's OpenAPI
    document describes the form from this model.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    model: str | None = Field(default=None, description="Model name or alias.")
    language: str | None = Field(
        default=None, max_length=16, description="ISO-639-1 language of the audio, e.g. en."
    )
    prompt: str | None = Field(default=None, description="Text to guide the model's style.")
    response_format: ResponseFormat = Field(
        default=ResponseFormat.JSON, description="Format of the transcript."
    )
    temperature: float = Field(default=0.0, ge=0.0, le=1.0, description="Sampling temperature.")
    timestamp_granularities: list[Granularity] = Field(
        default_factory=list,
        alias="timestamp_granularities[]",
        description="word and/or segment timestamps; needs response_format=verbose_json.",
    )
    stream: bool = Field(
        default=False, description="Send the transcript as server-sent events (json or text)."
    )
    languages: list[str] = Field(
        default_factory=list,
        alias="languages[]",
        description="ISO-639-1 languages the audio may be in: one acts as `language`; "
        "several restrict language detection to them (faster-whisper pools).",
    )
    keywords: list[str] = Field(
        default_factory=list,
        alias="keywords[]",
        description="Words to recognise more readily (names, terms); they join `prompt`.",
    )
    include: list[Literal["logprobs"]] = Field(
        default_factory=list,
        alias="include[]",
        description="`logprobs`: the transcript's tokens with their log probabilities "
        "(response_format json; faster-whisper pools).",
    )

    known_speaker_names: list[str] = Field(
        default_factory=list,
        alias="known_speaker_names[]",
        description="Up to 4 names for the speakers of `known_speaker_references[]`, in the "
        "same order; diarized segments use them (response_format diarized_json).",
    )
    known_speaker_references: list[str] = Field(
        default_factory=list,
        alias="known_speaker_references[]",
        description="A data URL (data:audio/wav;base64,...) of 2-10 s of each known "
        "speaker's voice.",
    )

    @property
    def logprobs(self) -> bool:
        return "logprobs" in self.include

    @property
    def diarized(self) -> bool:
        """Whether it asks who spoke when (capability diarization)."""
        return self.response_format == ResponseFormat.DIARIZED_JSON


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """`{"error": {"message", "type", "param", "code"}}`"""

    error: ErrorDetail


class ErrorEvent(BaseModel):
    """Stream event: the request failed after the stream began (last event; no `done`).

    The OpenAI SDK raises `APIError` for an event whose data has an `error` object.
    """

    type: Literal["error"] = "error"
    error: ErrorDetail


class DurationUsage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: float


class TokenUsage(BaseModel):
    type: Literal["tokens"] = "tokens"
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


class Logprob(BaseModel):
    """One token of the transcript and its log probability (`include[]=logprobs`)."""

    token: str
    logprob: float
    bytes: list[int]


class Language(BaseModel):
    """A language the answer names (OpenAI's `languages: [{"code"}]`)."""

    code: str


class Transcription(BaseModel):
    """`response_format=json`."""

    text: str
    usage: DurationUsage | TokenUsage | None = None
    logprobs: list[Logprob] | None = None
    languages: list[Language] | None = None


class Word(BaseModel):
    word: str
    start: float
    end: float


class Segment(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: int
    seek: int = 0
    start: float
    end: float
    text: str
    tokens: list[int] = Field(default_factory=list)
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float | None = 0.0


class VerboseTranscription(BaseModel):
    """`response_format=verbose_json`; renders itself as SRT or WebVTT subtitles."""

    model_config = ConfigDict(extra="allow")

    task: str = "transcribe"
    language: str
    duration: float
    text: str
    segments: list[Segment] | None = None
    words: list[Word] | None = None
    usage: DurationUsage | None = None

    def to_srt(self) -> str:
        return "\n".join(
            f"{i}\n{timestamp(s.start, ',')} --> {timestamp(s.end, ',')}\n{s.text.strip()}\n"
            for i, s in enumerate(self.segments or [], 1)
        )

    def to_vtt(self) -> str:
        cues = [
            f"{timestamp(s.start, '.')} --> {timestamp(s.end, '.')}\n{s.text.strip()}\n"
            for s in self.segments or []
        ]
        return "\n".join(["WEBVTT\n", *cues])


def timestamp(seconds: float, sep: str) -> str:
    """`HH:MM:SS<sep>mmm` (sep ',' for SRT, '.' for WebVTT)."""
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


class TextDelta(BaseModel):
    """OpenAI stream event: a piece of the transcript."""

    type: Literal["transcript.text.delta"] = "transcript.text.delta"
    delta: str
    logprobs: list[Logprob] | None = None


class TextDone(BaseModel):
    """OpenAI stream event: the whole transcript, last. Its usage is the audio's seconds
    where the gateway knows them (a duration-billed model), else the engine's tokens."""

    type: Literal["transcript.text.done"] = "transcript.text.done"
    text: str
    logprobs: list[Logprob] | None = None
    usage: DurationUsage | TokenUsage | None = None
    languages: list[Language] | None = None


class ChunkDelta(BaseModel):
    content: str = ""


class ChunkChoice(BaseModel):
    model_config = ConfigDict(extra="allow")

    delta: ChunkDelta = Field(default_factory=ChunkDelta)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    # The delta's tokens with their log probabilities (`include[]=logprobs`): our worker's
    # field; vLLM's transcription chunks have none.
    logprobs: list[Logprob] | None = None


class ChunkUsage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class TranscriptionChunk(BaseModel):
    """vLLM's stream event (`object: transcription.chunk`), which workers send."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["transcription.chunk"] = "transcription.chunk"
    created: int
    model: str
    choices: list[ChunkChoice] = Field(default_factory=list)
    usage: ChunkUsage | None = None


class ChatChunk(BaseModel):
    """A `chat.completion.chunk` as a transcription's stream reads it (a transcription through
    an audio language model's chat): its deltas, finish reason and usage."""

    model_config = ConfigDict(extra="allow")

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChunkChoice] = Field(default_factory=list)
    usage: ChunkUsage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str | None = None
    parent: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
