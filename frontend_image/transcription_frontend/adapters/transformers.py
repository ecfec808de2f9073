"""`transformers serve`'s adapter: a Whisper model through its transcription endpoint, an
audio language model through its chat endpoint.

It checks every request field against its own list (the engine profile's): any other is a
422, and array fields go without the SDK's `[]` (it answers 422 to `include[]`). Its chat
endpoint takes some fields and ignores them, which the gateway refuses where ignoring them
would change the answer the client asked for.

An audio language model has no working transcription endpoint (its processor fails there
with a bare 500), so `AudioLMAdapter` asks its chat endpoint for the transcript: one user
message holding the audio (an `input_audio` part) and an instruction (the pool's
`transcription_prompt`, with the request's language and prompt), and reads the transcript
back from the chat completion.
"""

from __future__ import annotations

from typing import Any

from transcription_api.capabilities import Capability
from transcription_api.errors import APIError, bad_request
from transcription_api.multipart import Upload
from transcription_api.openai import ChunkUsage, TokenUsage, TranscriptionRequest
from transcription_api.routes import DEFAULT_TRANSCRIPTION_PROMPT

from ..forward import Body, JsonBody
from ..inline import Base64Of
from ..sniff import AudioInfo
from .base import CHAT_PATH, Adapter

# The longest transcript asked for through chat: Whisper's own cap for 30 s of audio.
TRANSCRIPT_MAX_TOKENS = 448


class TransformersAdapter(Adapter):
    def field_name(self, name: str) -> str:
        return name.removesuffix("[]")

    def ignored_chat_fields(self, body: dict[str, Any]) -> APIError | None:
        fmt = body.get("response_format")
        problems = [
            ("n", body.get("n") not in (None, 1), "it returns one choice: n must be 1"),
            ("logprobs", bool(body.get("logprobs")) or bool(body.get("top_logprobs")),
             "it returns no log probabilities"),
            ("response_format", isinstance(fmt, dict) and fmt.get("type") not in (None, "text"),
             "it answers free text: no JSON mode or schema"),
            ("modalities", "audio" in (body.get("modalities") or []) or bool(body.get("audio")),
             "it answers text only, no audio"),
        ]  # fmt: skip
        for param, refused, why in problems:
            if refused:
                return bad_request(f"{self.name} cannot honour `{param}`: {why}", param=param,
                                   code="unsupported_field")  # fmt: skip
        return None


class AudioLMAdapter(TransformersAdapter):
    """An audio language model's pool: transcriptions through chat."""

    billed_by_duration = False  # its answers keep the chat's token usage

    def transcription_request(
        self, endpoint: Capability, upload: Upload, audio: AudioInfo, primary: str,
        request: TranscriptionRequest,
    ) -> tuple[str, Body]:  # fmt: skip
        assert upload.file is not None
        inline = Base64Of(upload.file, upload.size)  # read from the spool as it is sent
        return CHAT_PATH, JsonBody(self.chat_transcription(inline, audio.container, primary,
                                                           request))  # fmt: skip

    def instruction(self, request: TranscriptionRequest) -> str:
        """What the model is asked with the audio: the pool's instruction, plus the
        request's language and prompt."""
        text = self.pool.transcription_prompt or DEFAULT_TRANSCRIPTION_PROMPT
        if request.language:
            text += f" The speech is in the language with ISO-639-1 code '{request.language}'."
        if request.prompt:
            text += f" Earlier speech, or words and spellings it uses: {request.prompt}"
        return text

    def chat_transcription(
        self, audio: Base64Of, container: str, primary: str, request: TranscriptionRequest
    ) -> dict[str, Any]:
        """A transcription request as a chat completion request: one user message holding
        the audio (an `input_audio` part, base64-encoded as it is sent) and the
        instruction."""
        content = [
            {"type": "input_audio", "input_audio": {"data": audio, "format": container}},
            {"type": "text", "text": self.instruction(request)},
        ]  # fmt: skip
        body: dict[str, Any] = {
            "model": self.worker_model(primary),
            "messages": [{"role": "user", "content": content}],
            "max_tokens": TRANSCRIPT_MAX_TOKENS,
            "temperature": request.temperature,
        }
        if request.stream:
            body["stream"] = True
        return body

    def transcript(self, doc: Any) -> dict[str, Any]:
        """A chat completion's answer as OpenAI's transcription JSON (`text`, `usage`)."""
        try:
            text = doc["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise ValueError("no choices[0].message.content in its chat completion") from None
        if not isinstance(text, str):
            raise ValueError("its chat completion's content is not text")
        out: dict[str, Any] = {"text": text.strip()}
        if usage := doc.get("usage"):
            u = ChunkUsage.model_validate(usage)
            tokens = TokenUsage(input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens,
                                total_tokens=u.total_tokens)  # fmt: skip
            out["usage"] = tokens.model_dump()
        return out
