"""OpenAI's Realtime API in transcription mode (`/v1/realtime?intent=transcription`): one
pydantic model per wire object, as `openai.types.realtime` defines them (openai 3.5x, the
GA protocol), validated at the boundary.

Client events a transcription session takes: `session.update`, `input_audio_buffer.append`,
`.commit` and `.clear`. Every field the SDK can send in them is honoured or refused by name
(`REFUSED`); unknown fields and events are errors that name them, and the session lives on.
Server events are built here too, so that their shapes have one home.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .openai import DurationUsage, Language, Logprob

PATH = "/v1/realtime"
LOGPROBS = "item.input_audio_transcription.logprobs"


class _Wire(BaseModel):
    """A client object: unknown fields are errors that name them."""

    model_config = ConfigDict(extra="forbid")


class AudioPCM(_Wire):
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = 24000


class AudioPCMU(_Wire):
    type: Literal["audio/pcmu"]


class AudioPCMA(_Wire):
    type: Literal["audio/pcma"]


AudioFormat = Annotated[AudioPCM | AudioPCMU | AudioPCMA, Field(discriminator="type")]


class Transcription(_Wire):
    """`audio.input.transcription`: what each turn's transcription request carries."""

    model: str | None = None
    language: str | None = None
    languages: list[str] | None = None
    prompt: str | None = None
    keywords: list[str] | None = None
    # A latency hint of OpenAI's streaming models; turns here are decoded whole (REFUSED).
    delay: str | None = None


class ServerVad(_Wire):
    """`audio.input.turn_detection` of type `server_vad`: OpenAI's parameters and defaults."""

    type: Literal["server_vad"]
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(default=300, ge=0, le=10_000)
    silence_duration_ms: int = Field(default=500, ge=32, le=10_000)
    # Responses are a conversation session's; a transcription session creates none.
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None  # REFUSED


class SemanticVad(_Wire):
    type: Literal["semantic_vad"]  # REFUSED: no semantic turn model here
    eagerness: str | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None


TurnDetection = Annotated[ServerVad | SemanticVad, Field(discriminator="type")]


class NoiseReduction(_Wire):
    """Applied to each turn's audio before it is transcribed (ffmpeg's afftdn)."""

    type: Literal["near_field", "far_field"] | None = None
    strength: float | None = None  # REFUSED


class InputAudio(_Wire):
    format: AudioFormat = Field(default_factory=AudioPCM)
    transcription: Transcription = Field(default_factory=Transcription)
    turn_detection: TurnDetection | None = Field(
        default_factory=lambda: ServerVad(type="server_vad")
    )
    noise_reduction: NoiseReduction | None = None


class SessionAudio(_Wire):
    input: InputAudio = Field(default_factory=InputAudio)


class TranscriptionSession(_Wire):
    """The session's configuration: what `session.update` sets and `session.updated` echoes."""

    type: Literal["transcription"] = "transcription"
    audio: SessionAudio = Field(default_factory=SessionAudio)
    include: list[Literal["item.input_audio_transcription.logprobs"]] | None = None

    @property
    def input(self) -> InputAudio:
        return self.audio.input

    def updated(self, update: dict[str, Any]) -> TranscriptionSession:
        """This configuration with the fields an update sets (OpenAI: only the fields present
        change; `null` clears one, such as `turn_detection`)."""
        return TranscriptionSession.model_validate(_merge(self.model_dump(), update))


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        old = out.get(key)
        same_kind = not (isinstance(old, dict) and isinstance(value, dict)) or (
            old.get("type") == value.get("type") or "type" not in value
        )
        if isinstance(old, dict) and isinstance(value, dict) and same_kind:
            out[key] = _merge(old, value)
        else:
            out[key] = value
    return out


# Fields the SDK can send that a session here cannot honour: a 400-like error names each.
REFUSED: dict[tuple[str, ...], str] = {
    ("audio", "input", "transcription", "delay"): "turns are transcribed whole when they end; "
    "there is no streaming-delay setting",
    ("audio", "input", "turn_detection", "idle_timeout_ms"): "idle timeouts are not supported",
    ("audio", "input", "turn_detection", "eagerness"): "semantic_vad is not supported; use "
    "server_vad",
    ("audio", "input", "noise_reduction", "strength"): "noise reduction strength is not "
    "supported; set type only",
}


def refused(session: dict[str, Any]) -> tuple[str, str] | None:
    """The first refused field an update sets (its dotted name, why), else None."""
    td = session.get("audio", {}).get("input", {}).get("turn_detection")
    if isinstance(td, dict) and td.get("type") == "semantic_vad":
        return "session.audio.input.turn_detection.type", REFUSED[
            ("audio", "input", "turn_detection", "eagerness")
        ]
    for path, why in REFUSED.items():
        node: Any = session
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return "session." + ".".join(path), why
    return None


# ---- client events


class SessionUpdate(_Wire):
    type: Literal["session.update"]
    event_id: str | None = None
    session: dict[str, Any]  # validated against TranscriptionSession once merged


class Append(_Wire):
    type: Literal["input_audio_buffer.append"]
    event_id: str | None = None
    audio: str  # base64 of the session's input format


class Commit(_Wire):
    type: Literal["input_audio_buffer.commit"]
    event_id: str | None = None


class Clear(_Wire):
    type: Literal["input_audio_buffer.clear"]
    event_id: str | None = None


ClientEvent = Annotated[SessionUpdate | Append | Commit | Clear, Field(discriminator="type")]
CLIENT_EVENTS = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                 "input_audio_buffer.clear")  # fmt: skip
_CLIENT = TypeAdapter(ClientEvent)
_TAGS = {*CLIENT_EVENTS, "audio/pcm", "audio/pcmu", "audio/pcma", "server_vad", "semantic_vad"}


class EventError(Exception):
    """A client event that cannot be taken: answered with an `error` event naming the field
    (`param`); the session lives on."""

    def __init__(
        self, message: str, *, code: str, param: str | None = None, event_id: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.message, self.code, self.param, self.event_id, self.type = (
            message, code, param, event_id, type,
        )  # fmt: skip


def parse_client_event(text: str | bytes) -> SessionUpdate | Append | Commit | Clear:
    """A client event from one WebSocket message; EventError naming what is wrong."""
    import json

    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise EventError(f"The message is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(raw, dict):
        raise EventError("An event must be a JSON object.", code="invalid_event")
    event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    kind = raw.get("type")
    if kind not in CLIENT_EVENTS:
        raise EventError(
            f"Unknown or unsupported event type {kind!r} in a transcription session; the "
            f"supported ones are: {', '.join(CLIENT_EVENTS)}.",
            code="invalid_event_type", param="type", event_id=event_id,
        )  # fmt: skip
    try:
        return _CLIENT.validate_python(raw)
    except ValidationError as e:
        raise _named(e, event_id) from None


def _named(e: ValidationError, event_id: str | None, prefix: str = "") -> EventError:
    err = e.errors()[0]
    # a discriminated union's branch (`server_vad`, `audio/pcm`, an event's type) is no field
    loc = [str(p) for p in err["loc"] if str(p) not in _TAGS]
    param = prefix + ".".join(loc)
    return EventError(f"Invalid value for '{param}': {err['msg']}", code="invalid_value",
                      param=param, event_id=event_id)  # fmt: skip


def validate_session(
    current: TranscriptionSession, update: dict[str, Any], event_id: str | None
) -> TranscriptionSession:
    """The session after a `session.update`; EventError naming a bad or refused field."""
    if update.get("type", "transcription") != "transcription":
        raise EventError(
            "This is a transcription session (`intent=transcription`): session.type must be "
            "'transcription'.", code="invalid_value", param="session.type", event_id=event_id,
        )  # fmt: skip
    no = refused(update)
    if no is not None:
        raise EventError(f"'{no[0]}' is not supported here: {no[1]}.",
                         code="unsupported_field", param=no[0], event_id=event_id)  # fmt: skip
    try:
        return current.updated(update)
    except ValidationError as e:
        raise _named(e, event_id, "session.") from None


# ---- server events


def event_id() -> str:
    return "event_" + uuid.uuid4().hex[:20]


def item_id() -> str:
    return "item_" + uuid.uuid4().hex[:20]


class _Server(BaseModel):
    event_id: str = Field(default_factory=event_id)


class SessionCreated(_Server):
    type: Literal["session.created", "session.updated"] = "session.created"
    session: TranscriptionSession


class SpeechStarted(_Server):
    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class SpeechStopped(_Server):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class Committed(_Server):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None = None


class Cleared(_Server):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class Content(BaseModel):
    type: Literal["input_audio"] = "input_audio"
    transcript: str | None = None


class Item(BaseModel):
    """A committed turn: a user message whose content is its audio's transcript."""

    id: str
    type: Literal["message"] = "message"
    object: Literal["realtime.item"] = "realtime.item"
    role: Literal["user"] = "user"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[Content] = Field(default_factory=lambda: [Content()])


class ItemAdded(_Server):
    type: Literal["conversation.item.added", "conversation.item.done"] = "conversation.item.added"
    item: Item
    previous_item_id: str | None = None


class TranscriptDelta(_Server):
    type: Literal["conversation.item.input_audio_transcription.delta"] = (
        "conversation.item.input_audio_transcription.delta"
    )
    item_id: str
    content_index: int = 0
    delta: str
    logprobs: list[Logprob] | None = None


class TranscriptCompleted(_Server):
    type: Literal["conversation.item.input_audio_transcription.completed"] = (
        "conversation.item.input_audio_transcription.completed"
    )
    item_id: str
    content_index: int = 0
    transcript: str
    usage: DurationUsage
    logprobs: list[Logprob] | None = None
    languages: list[Language] | None = None


class ErrorBody(BaseModel):
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    event_id: str | None = None


class TranscriptFailed(_Server):
    type: Literal["conversation.item.input_audio_transcription.failed"] = (
        "conversation.item.input_audio_transcription.failed"
    )
    item_id: str
    content_index: int = 0
    error: ErrorBody


class ErrorEvent(_Server):
    type: Literal["error"] = "error"
    error: ErrorBody

    @classmethod
    def of(cls, e: EventError) -> ErrorEvent:
        return cls(error=ErrorBody(message=e.message, type=e.type, code=e.code, param=e.param,
                                   event_id=e.event_id))  # fmt: skip


ServerEvent = (
    SessionCreated | SpeechStarted | SpeechStopped | Committed | Cleared | ItemAdded
    | TranscriptDelta | TranscriptCompleted | TranscriptFailed | ErrorEvent
)  # fmt: skip
