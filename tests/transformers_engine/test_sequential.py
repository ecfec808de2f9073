"""`transformers serve` without continuous batching, Whisper tiny.en: what it answers.

Real process (started by our launcher from WorkerSettings), real espeak-ng speech, answers
compared with the recordings in tests/fixtures/transformers-5.24/.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.audio import SENTENCES, convert, speak, tone_wav, wer
from testkit.transformers_serve import Server, check_recording
from transcription_api.capabilities import Mode

PLACEHOLDER = "<checkpoint>"


@pytest.fixture(scope="module")
def server(server_factory: Any) -> Server:
    return server_factory("whisper-tiny.en", Mode.SEQUENTIAL)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("speech")
    return {s: speak(s, d) for s in SENTENCES}


def transcribe(server: Server, data: bytes, **fields: str) -> httpx.Response:
    form = {"model": server.model, **fields}
    return httpx.post(f"{server.url}/v1/audio/transcriptions", data=form,
                      files={"file": ("a.wav", data)}, timeout=120)  # fmt: skip


def test_launcher_started_it_sequentially(server: Server) -> None:
    log = server.log_text()
    assert "starting: transformers serve " in log
    assert "--continuous-batching" not in log
    check_recording("health", httpx.get(f"{server.url}/health"))
    check_recording("models", httpx.get(f"{server.url}/v1/models"), {server.model: PLACEHOLDER})


def test_transcribes_espeak_speech(server: Server, clips: dict[str, Path]) -> None:
    errors = []
    for sentence, wav in clips.items():
        r = transcribe(server, wav.read_bytes())
        assert r.status_code == 200, r.text
        errors.append(wer(sentence, r.json()["text"]))
    mean = sum(errors) / len(errors)
    print(f"transformers serve, Whisper tiny.en (converted), {len(errors)} clips: WER {mean:.1%}")
    assert mean <= 0.05, errors
    check_recording("espeak_json", transcribe(server, clips[SENTENCES[1]].read_bytes()))


def test_every_response_format_gets_bare_json(server: Server, clips: dict[str, Path]) -> None:
    """`response_format` is accepted and ignored (as are language, prompt, temperature)."""
    wav = clips[SENTENCES[1]].read_bytes()
    for fmt in ("text", "srt", "verbose_json"):
        r = transcribe(server, wav, response_format=fmt, language="en", temperature="0.2")
        check_recording(f"espeak_{fmt}", r)
        assert r.json() == {"text": " speech recognition turns spoken words into written text."}


def test_stream_is_raw_text_deltas(server: Server, clips: dict[str, Path]) -> None:
    """`data: <text>` per token group, no JSON, no `[DONE]`; the deltas add up to the text."""
    wav = clips[SENTENCES[1]].read_bytes()
    r = transcribe(server, wav, stream="true")
    check_recording("espeak_stream", r)
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = [e for e in r.text.split("\n\n") if e]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    deltas = [e.removeprefix("data: ") for e in events]
    assert "[DONE]" not in deltas
    assert "".join(deltas) == transcribe(server, wav).json()["text"]


@pytest.mark.parametrize(
    ("name", "fields", "file"),
    [
        ("no_file", {}, None),
        ("corrupt_audio", {}, b"RIFF" + b"\x00" * 64),
        ("empty_file", {}, b""),
        ("no_model", {"model": None}, "wav"),
        ("m4a", {}, "m4a"),
    ],
)
def test_bare_500s(
    server: Server, clips: dict[str, Path], name: str, fields: dict[str, Any], file: Any
) -> None:
    """Bad input gets `500 Internal Server Error` as plain text (no JSON, no detail); the
    server keeps serving."""
    wav = clips[SENTENCES[1]]
    data = {"wav": wav.read_bytes(), "m4a": convert(wav, "m4a").read_bytes()}.get(file, file)
    form = {k: v for k, v in ({"model": server.model} | fields).items() if v is not None}
    files = {"file": ("a.wav", data)} if data is not None else None
    r = httpx.post(f"{server.url}/v1/audio/transcriptions", data=form, files=files, timeout=60)
    check_recording(name, r)
    assert (r.status_code, r.text) == (500, "Internal Server Error")
    assert transcribe(server, wav.read_bytes()).status_code == 200


@pytest.mark.parametrize(
    ("name", "field"),
    [("unknown_field", "foo"), ("timestamp_granularities", "timestamp_granularities[]")],
)
def test_unknown_fields_are_422_with_a_detail(
    server: Server, clips: dict[str, Path], name: str, field: str
) -> None:
    """A field outside OpenAI's transcription parameters gets 422 {"detail": ...}: OpenAI's
    SDK spelling `timestamp_granularities[]` among them."""
    r = transcribe(server, clips[SENTENCES[1]].read_bytes(), **{field: "word"})
    check_recording(name, r)
    assert r.status_code == 422
    assert r.json() == {"detail": f"Unexpected fields in the request: {{'{field}'}}"}


def test_an_alias_is_not_a_name_it_knows(server: Server, clips: dict[str, Path]) -> None:
    """No aliases: any other `model` is loaded as a hub id (offline here: a bare 500). The
    frontend must send the pool's `worker_model`."""
    r = httpx.post(f"{server.url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                   files={"file": ("a.wav", clips[SENTENCES[1]].read_bytes())}, timeout=60)  # fmt: skip
    check_recording("unknown_model", r)
    assert r.status_code == 500
    assert server.logged("Loading whisper-1@main")


def test_no_translations_no_metrics_no_chat(server: Server, clips: dict[str, Path]) -> None:
    wav = clips[SENTENCES[1]].read_bytes()
    r = httpx.post(f"{server.url}/v1/audio/translations", data={"model": server.model},
                   files={"file": ("a.wav", wav)})  # fmt: skip
    check_recording("translations", r)
    assert r.status_code == 404
    check_recording("metrics", httpx.get(f"{server.url}/metrics"))
    # A Whisper model has no chat modality: a bare 500.
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   json={"model": server.model, "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    check_recording("whisper_chat", r)
    assert (r.status_code, r.text) == (500, "Internal Server Error")


def test_audio_past_30_seconds_is_dropped(server: Server, tmp_path: Path) -> None:
    """The feature extractor cuts input at 30 s: a sentence spoken after that never
    appears, and nothing says so."""
    first = speak(SENTENCES[0], tmp_path)
    last = speak(SENTENCES[2], tmp_path)
    long = tmp_path / "long.wav"
    # first sentence, 32 s of silence, the last sentence
    subprocess.run(["sox", str(first), str(long), "pad", "0", "32"], check=True)
    joined = tmp_path / "joined.wav"
    subprocess.run(["sox", str(long), str(last), str(joined)], check=True)
    r = transcribe(server, joined.read_bytes())
    check_recording("long_audio", r)
    text = r.json()["text"]
    assert wer(SENTENCES[0], text) <= 0.1
    assert "thursday" not in text.lower()
    assert transcribe(server, tone_wav()).status_code == 200  # still serving
