"""Transcriptions served by an audio language model through its chat endpoint, over real
HTTP, against the stand-in `transformers serve` replaying its recorded chat answers: one
deployment, one pool, both chat and transcription traffic.

`transformers serve` (5.24) fails on an audio LM's processor at its transcription endpoint
(a bare 500) but chats with audio input; the frontend asks the chat endpoint for the
transcript, with the audio and an instruction, and answers in OpenAI's transcription shape
(json, text, the `transcript.text.*` stream)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.audio import convert, noise_wav, tone_wav
from testkit.frontend import (
    AUDIO_LM_MODEL,
    PRIMARY,
    RECORDED,
    RECORDED_DELTAS,
    Frontend,
    chat_pool,
    error,
)
from testkit.standins import Behaviour, Running, serve
from transcription_api.routes import DEFAULT_TRANSCRIPTION_PROMPT, RouteTable
from transcription_frontend.adapters.transformers import TRANSCRIPT_MAX_TOKENS
from transcription_frontend.inline import dumps

pytestmark = pytest.mark.standin("audio-lm")
WAV = tone_wav(0.5)
TEXT = RECORDED["choices"][0]["message"]["content"].strip()


def frontend_for(url: str, prompt: str | None = None) -> Frontend:
    p = chat_pool(url).model_copy(update={"transcription_prompt": prompt})
    return Frontend(RouteTable(model=PRIMARY, aliases=["qwen"], pools=[p]))


@pytest.fixture
def fe(worker: tuple[Running, Behaviour]) -> Iterator[Frontend]:
    f = frontend_for(worker[0].url)
    yield f
    f.running.stop()


def sent(b: Behaviour) -> dict[str, Any]:
    """The chat request the worker got for the last transcription."""
    seen = b.seen[-1]
    assert seen.path == "/v1/chat/completions" and seen.body is not None
    return seen.body


def test_transcription_is_asked_of_the_chat_endpoint(
    fe: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    out = fe.client.audio.transcriptions.create(model="qwen", file=("a.wav", WAV))
    assert out.text == TEXT
    body = sent(worker[1])
    # The name the worker loaded, one user message: the audio as sent, then the instruction.
    assert body["model"] == AUDIO_LM_MODEL
    [message] = body["messages"]
    audio, instruction = message["content"]
    assert audio["type"] == "input_audio" and audio["input_audio"]["format"] == "wav"
    assert base64.b64decode(audio["input_audio"]["data"]) == WAV
    assert instruction == {"type": "text", "text": DEFAULT_TRANSCRIPTION_PROMPT}
    assert body["max_tokens"] == TRANSCRIPT_MAX_TOKENS and body["temperature"] == 0
    assert "stream" not in body


def test_a_multi_mb_upload_reaches_the_chat_endpoint_inline_byte_for_byte(
    fe: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    """The upload goes inline as base64, encoded from the spool as it is sent (never whole in
    memory): the worker gets exactly the file, in a body of exactly its declared length."""
    audio = noise_wav(29)  # 5.6 MB, under the pool's 30 s
    out = fe.client.audio.transcriptions.create(model="qwen", file=("a.wav", audio))
    assert out.text == TEXT
    body = sent(worker[1])
    part = body["messages"][0]["content"][0]["input_audio"]
    assert part["format"] == "wav"
    assert base64.b64decode(part["data"], validate=True) == audio
    assert int(worker[1].seen[-1].headers["content-length"]) == len(dumps(body))


def test_usage_and_every_plain_format(fe: Frontend) -> None:
    r = fe.post({"model": "qwen"})
    assert r.status_code == 200
    usage = RECORDED["usage"]
    assert r.json() == {"text": TEXT, "usage": {
        "type": "tokens", "input_tokens": usage["prompt_tokens"],
        "output_tokens": usage["completion_tokens"], "total_tokens": usage["total_tokens"]}}  # fmt: skip
    r = fe.post({"model": "qwen", "response_format": "text"})
    assert (r.status_code, r.text) == (200, TEXT + "\n")
    assert r.headers["content-type"] == "text/plain; charset=utf-8"


def test_stream_is_openai_transcript_events(
    fe: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    events = list(fe.client.audio.transcriptions.create(model="qwen", file=("a.wav", WAV),
                                                        stream=True))  # fmt: skip
    assert [e.type for e in events] == ["transcript.text.delta"] * len(RECORDED_DELTAS) + [
        "transcript.text.done"]  # fmt: skip
    assert [e.delta for e in events[:-1]] == RECORDED_DELTAS  # type: ignore[union-attr]
    assert events[-1].text == "".join(RECORDED_DELTAS)
    assert sent(worker[1])["stream"] is True


def test_a_chat_stream_cut_before_its_finish_reason_is_an_error(
    fe: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    worker[1].fail_stream_after = 3
    r = fe.post({"model": "qwen", "stream": "true"})
    events = [json.loads(e.removeprefix("data: ")) for e in r.text.split("\n\n") if e]
    assert [e["type"] for e in events] == ["transcript.text.delta"] * 2 + ["error"]
    assert "mid-stream" in events[-1]["error"]["message"]


def test_language_and_prompt_join_the_pools_instruction(worker: tuple[Running, Behaviour]) -> None:
    prompt = "Detect the language and recognize the speech: <|en|>"
    f = frontend_for(worker[0].url, prompt)
    try:
        r = f.post({"model": "qwen", "language": "de", "prompt": "Kubernetes, vLLM"})
        assert r.status_code == 200, r.text
    finally:
        f.running.stop()
    text = sent(worker[1])["messages"][0]["content"][1]["text"]
    assert text == (
        f"{prompt} The speech is in the language with ISO-639-1 code 'de'. "
        "Earlier speech, or words and spellings it uses: Kubernetes, vLLM"
    )


def test_the_chat_endpoint_still_chats(fe: Frontend) -> None:
    """Chat and transcription share the deployment, the pool and its workers."""
    r = httpx.post(f"{fe.url}/v1/chat/completions", timeout=30, json={
        "model": "qwen", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"


@pytest.mark.parametrize(
    ("fields", "status", "code", "message"),
    [
        ({"model": "qwen", "response_format": "srt"}, 400, "unsupported_capability",
         "missing capability segment_timestamps"),
        ({"model": "qwen", "timestamp_granularities[]": "word", "response_format": "verbose_json"},
         400, "unsupported_capability", "word_timestamps"),
        ({"model": "qwen", "seed": "7"}, 400, "unsupported_field",
         "does not accept the field(s) `seed`"),
        # Who spoke when, where no pool runs the speaker stage: the capability named.
        ({"model": "qwen", "response_format": "diarized_json"}, 400, "unsupported_capability",
         "missing capability diarization"),
    ],
)  # fmt: skip
def test_what_it_cannot_honour_is_a_clear_400(
    fe: Frontend, worker: tuple[Running, Behaviour], fields: dict[str, str], status: int,
    code: str, message: str,
) -> None:  # fmt: skip
    r = fe.post(fields)
    assert r.status_code == status, r.text
    assert error(r)["code"] == code and message in error(r)["message"], r.text
    assert not worker[1].seen  # refused before any worker was busy
    assert fe.post({"model": "qwen"}).status_code == 200  # and serving goes on


def test_translations_are_not_claimed(fe: Frontend) -> None:
    r = fe.post({"model": "qwen"}, endpoint="translations")
    assert r.status_code == 400
    assert "missing capability translations" in error(r)["message"]


def test_audio_past_30_seconds_is_chunked_and_mp4_refused(
    fe: Frontend, worker: tuple[Running, Behaviour], tmp_path: Path
) -> None:
    long = fe.post({"model": "qwen"}, file=tone_wav(31.0))
    assert long.status_code == 200, long.text  # cut into pieces the audio LM takes whole
    assert len(worker[1].seen) == 2
    (tmp_path / "a.wav").write_bytes(WAV)
    m4a = convert(tmp_path / "a.wav", "m4a")
    r = fe.post({"model": "qwen"}, file=m4a.read_bytes())
    assert (r.status_code, error(r)["code"]) == (400, "unsupported_audio_format")


def test_an_answer_that_is_no_chat_completion_is_a_502(worker: tuple[Running, Behaviour]) -> None:
    """A worker's 200 without choices: an OpenAI-shaped 502 that names pool and engine."""
    bogus = serve(_static_json({"object": "chat.completion", "choices": []}))
    with bogus as running:
        f = frontend_for(running.url)
        try:
            r = f.post({"model": "qwen"})
        finally:
            f.running.stop()
    assert r.status_code == 502
    assert "transformers worker of pool chat" in error(r)["message"]
    assert "choices[0].message.content" in error(r)["message"]


def _static_json(doc: dict[str, Any]) -> Any:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def answer(request: Any) -> JSONResponse:
        return JSONResponse(doc)

    return Starlette(routes=[Route("/v1/chat/completions", answer, methods=["POST"])])
