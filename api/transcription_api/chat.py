"""OpenAI chat completion wire objects (`POST /v1/chat/completions`): one pydantic model per
object, validated at the gateway before any worker sees the request.

Chat here is what audio language models serve: messages of text and inline audio
(`input_audio` parts, base64 with a format, as OpenAI's API takes them). Parts that make
the worker fetch something (`audio_url`, `image_url`, `video_url`, files) are refused with
a 400 that says what to send instead: `transformers serve` fetches any URL it is given, and
reads local paths, from inside the cluster. Fields the models do not name pass through as
sent (`extra="allow"`); what each engine accepts is its profile's (`engines/`), refused
by its frontend adapter.
"""

from __future__ import annotations

import binascii
import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from .errors import APIError, bad_request

# Fields not named here go to the engine as sent. Strict: the body is forwarded as sent, so
# what the gateway reads must be what the engine reads (`"stream": "false"` is no boolean).
_PASS = ConfigDict(extra="allow", strict=True)


class TextPart(BaseModel):
    model_config = _PASS
    type: Literal["text"]
    text: str


class InputAudio(BaseModel):
    """`{"data": <base64 audio>, "format": "wav"}`"""

    model_config = _PASS
    data: str = Field(description="The audio file, base64-encoded.")
    format: str = Field(description="Container of the audio: wav, mp3, flac ...")

    @field_validator("data")
    @classmethod
    def _base64(cls, data: str) -> str:
        if data.startswith(("http://", "https://", "data:", "/", "file:")):
            raise _error("must be the audio itself, base64-encoded: not a URL, a path or a "
                         "data: URI (the worker would fetch or read it)")  # fmt: skip
        if not data:
            raise _error("is empty: send the audio file, base64-encoded")
        try:
            binascii.a2b_base64(data, strict_mode=True)
        except binascii.Error as e:
            raise _error(f"is not valid base64 ({e})") from None
        return data

    @field_validator("format")
    @classmethod
    def _format(cls, fmt: str) -> str:
        if not (fmt.isascii() and fmt.isalnum() and len(fmt) <= 16):
            raise _error(f"must name the audio's container, such as wav or mp3 (got {fmt!r})")
        return fmt


def _error(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", "{message}", {"message": message})


class InputAudioPart(BaseModel):
    model_config = _PASS
    type: Literal["input_audio"]
    input_audio: InputAudio


FETCHING_PARTS = {"audio_url", "image_url", "video_url", "input_image", "file", "input_file"}


def _refuse_other_parts(part: Any) -> Any:
    """A clear error for content parts the gateway does not forward, before the union's own."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "audio_url":
        raise _error(
            "audio_url parts are not accepted (the worker would fetch the URL itself): send "
            'the audio inline as {"type": "input_audio", "input_audio": {"data": <base64>, '
            '"format": "wav"}}'
        )
    if kind in FETCHING_PARTS:
        raise _error(
            f"{kind} parts are not accepted: chat takes text and input_audio parts (audio "
            "inline, base64-encoded)"
        )
    if isinstance(kind, str) and kind not in ("text", "input_audio"):
        raise _error(f"content part type {kind!r} is not supported: use text or input_audio")
    return part


def _as_parts(content: Any) -> Any:
    """A plain string is one text part (OpenAI's shorthand)."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


UserPart = Annotated[
    TextPart | InputAudioPart, Discriminator("type"), BeforeValidator(_refuse_other_parts)
]
TextParts = Annotated[
    list[TextPart], BeforeValidator(_as_parts, json_schema_input_type=str | list[TextPart])
]
UserParts = Annotated[
    list[UserPart], BeforeValidator(_as_parts, json_schema_input_type=str | list[UserPart])
]


class SystemMessage(BaseModel):
    model_config = _PASS
    role: Literal["system", "developer"]
    content: TextParts
    name: str | None = None


class UserMessage(BaseModel):
    model_config = _PASS
    role: Literal["user"]
    content: UserParts
    name: str | None = None


class FunctionCall(BaseModel):
    model_config = _PASS
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = _PASS
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    model_config = _PASS
    role: Literal["assistant"]
    content: TextParts | None = None
    tool_calls: list[ToolCall] | None = None
    name: str | None = None


class ToolMessage(BaseModel):
    model_config = _PASS
    role: Literal["tool"]
    content: TextParts
    tool_call_id: str


ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Discriminator("role")
]


class FunctionDefinition(BaseModel):
    model_config = _PASS
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = _PASS
    type: Literal["function"]
    function: FunctionDefinition


class StreamOptions(BaseModel):
    model_config = _PASS
    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    """The body of `POST /v1/chat/completions`."""

    model_config = _PASS

    model: str | None = Field(default=None, description="Model name or alias.")
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far.")
    stream: bool = Field(default=False, description="Send the answer as server-sent events.")
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    user: str | None = None
    tools: list[Tool] | None = None

    def audio_parts(self) -> list[tuple[int, int, InputAudio]]:
        """Each audio part, with the indices of its message and of its place in the content."""
        return [
            (i, j, part.input_audio)
            for i, m in enumerate(self.messages)
            if isinstance(m, UserMessage)
            for j, part in enumerate(m.content)
            if isinstance(part, InputAudioPart)
        ]


def parse_chat(raw: bytes | str) -> tuple[ChatCompletionRequest, dict[str, Any]]:
    """The validated request and the body as sent (to forward); 400 naming what is wrong."""
    too_deep = False
    try:
        body = json.loads(raw)
    except ValueError as e:  # UnicodeDecodeError too
        raise not_json(e) from None
    except RecursionError:  # nested deeper than the decoder goes
        too_deep = True
    if too_deep or _depth(body) > MAX_JSON_DEPTH:
        raise bad_request(
            f"the request body is nested more than {MAX_JSON_DEPTH} levels deep",
            code="invalid_json",
        )
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    try:
        return ChatCompletionRequest.model_validate(body), body
    except ValidationError as e:
        raise _message(e) from None


def not_json(e: ValueError) -> APIError:
    """The 400 for a body that is not JSON (or not text in JSON's encodings)."""
    return bad_request(
        f"the request body is not valid JSON ({e}): send a chat completion request as "
        "application/json",
        code="invalid_json",
    )


MAX_JSON_DEPTH = 32  # a chat request needs 5 (body, messages, message, content, part, audio)


def _depth(value: Any) -> int:
    """How deep objects and arrays nest in a decoded JSON value (without recursion)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if d > MAX_JSON_DEPTH:
                break
            todo.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def _message(e: ValidationError) -> APIError:
    # Unions report one error per alternative; the deepest is the one about the input.
    err = max(e.errors(), key=lambda x: len(x["loc"]))
    param = _param(err["loc"])
    return bad_request(f"{param}: {err['msg']}" if param else err["msg"], param)


def _param(loc: tuple[int | str, ...]) -> str:
    """('messages', 0, 'user', 'content', 1, 'input_audio', 'input_audio', 'data') ->
    'messages[0].content[1].input_audio.data': list indices in brackets, and the tags of
    the discriminated unions (the role, the part type after an index) left out."""
    out = ""
    for i, item in enumerate(loc):
        if isinstance(item, int):
            out += f"[{item}]"
        elif i >= 2 and isinstance(loc[i - 1], int) and loc[i - 2] in ("messages", "content"):
            continue
        else:
            out += f".{item}" if out else item
    return out
