"""`transformers serve --continuous-batching`: what it does with each kind of model.

The refusal this project was founded on, `400 Audio transcription requires sequential
generation (not CB)`, is in transformers' source (5.6 to 5.24) but cannot be reached: the
transcription handler always asks for the sequential generation manager. What CB mode
really does, shown here with real processes:
- Whisper: transcribes as in sequential mode (on the sequential generation thread);
- an audio language model (Qwen2-Audio architecture, random weights): chats, audio input
  included, but falls back to sequential generation; its transcription endpoint fails
  with a bare 500, in both modes;
- a text-only language model: the one kind it batches.
`test_the_400_is_unreachable` fails when a transformers release makes it reachable: then
the capability table must change.
"""

from __future__ import annotations

import base64
import inspect
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.audio import SENTENCES, speak, wer
from testkit.transformers_serve import Server, check_recording
from transcription_api.capabilities import Mode, ModelFamily

REFUSAL = "Audio transcription requires sequential generation (not CB)"


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return speak(SENTENCES[1], tmp_path_factory.mktemp("speech")).read_bytes()


@pytest.fixture(scope="module")
def whisper_cb(server_factory: Any) -> Server:
    return server_factory("whisper-tiny.en", Mode.CONTINUOUS)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def audio_lm_cb(server_factory: Any) -> Server:
    return server_factory("audio-lm", Mode.CONTINUOUS, ModelFamily.AUDIO_LM)  # type: ignore[no-any-return]


def transcribe(server: Server, data: bytes, **fields: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/audio/transcriptions", timeout=120,
                      data={"model": server.model, **fields}, files={"file": ("a.wav", data)})  # fmt: skip


def chat(server: Server, content: Any, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
        "model": server.model, "messages": [{"role": "user", "content": content}],
        "max_tokens": 5, **body})  # fmt: skip


def test_the_400_is_unreachable() -> None:
    from transformers.cli.serving import transcription
    from transformers.cli.serving.utils import GenerationState

    source = inspect.getsource(transcription.TranscriptionHandler.handle_request)
    assert REFUSAL in source  # still there...
    assert "get_manager(model_id_and_revision)" in source  # ...but asks without use_cb,
    assert inspect.signature(GenerationState.get_manager).parameters["use_cb"].default is False


def test_whisper_transcribes_under_continuous_batching(whisper_cb: Server, wav: bytes) -> None:
    assert "--continuous-batching" in whisper_cb.log_text().splitlines()[0]
    r = transcribe(whisper_cb, wav)
    check_recording("cb_whisper_json", r)
    assert r.status_code == 200
    assert wer(SENTENCES[1], r.json()["text"]) == 0
    stream = transcribe(whisper_cb, wav, stream="true")
    check_recording("cb_whisper_stream", stream)
    assert REFUSAL not in whisper_cb.log_text()


def test_audio_lm_chats_with_audio_input_but_is_not_batched(
    audio_lm_cb: Server, wav: bytes
) -> None:
    audio = {"type": "input_audio",
             "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}  # fmt: skip
    r = chat(audio_lm_cb, [audio, {"type": "text", "text": "Transcribe this."}])
    check_recording("cb_audio_lm_chat_audio", r, {audio_lm_cb.model: "<checkpoint>"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    # The audio reached the model: its tokens count in the prompt.
    assert body["usage"]["prompt_tokens"] > 100
    assert audio_lm_cb.logged("Qwen2AudioForConditionalGeneration does not support continuous "
                              "batching. Falling back to sequential generation.")  # fmt: skip
    assert audio_lm_cb.logged("CB: False")


def test_audio_lm_chat_stream_is_openai_chunks_without_done(audio_lm_cb: Server) -> None:
    r = chat(audio_lm_cb, "hi", stream=True)
    check_recording("cb_audio_lm_chat_stream", r, {audio_lm_cb.model: "<checkpoint>"})
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
    assert "[DONE]" not in events
    assert all(e.startswith('{"id":') for e in events)


def test_chat_with_another_model_name_is_400(audio_lm_cb: Server) -> None:
    r = httpx.post(f"{audio_lm_cb.url}/v1/chat/completions", timeout=60,
                   json={"model": "whisper-1", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    check_recording("chat_other_model", r, {audio_lm_cb.model: "<checkpoint>"})
    assert r.status_code == 400
    assert r.json() == {
        "detail": f"Server is pinned to '{audio_lm_cb.model}'; requested 'whisper-1'."
    }


@pytest.mark.parametrize("mode", [Mode.CONTINUOUS, Mode.SEQUENTIAL])
def test_audio_lm_cannot_use_the_transcription_endpoint(
    mode: Mode, server_factory: Any, audio_lm_cb: Server, wav: bytes
) -> None:
    server = audio_lm_cb if mode == Mode.CONTINUOUS else server_factory(
        "audio-lm", Mode.SEQUENTIAL, ModelFamily.AUDIO_LM)  # fmt: skip
    r = transcribe(server, wav)
    name = "cb_audio_lm_transcription" if mode == Mode.CONTINUOUS else "audio_lm_transcription"
    check_recording(name, r)
    assert (r.status_code, r.text) == (500, "Internal Server Error")
    assert server.logged("You need to provide at least one input to call Qwen2AudioProcessor")


def test_text_lm_chat_is_continuously_batched(server_factory: Any, checkpoints: Path) -> None:
    server = server_factory("text-lm", Mode.CONTINUOUS, ModelFamily.AUDIO_LM)
    r = chat(server, "hi")
    check_recording("cb_text_lm_chat", r, {server.model: "<checkpoint>"})
    assert r.status_code == 200
    assert server.logged("CB: True")
