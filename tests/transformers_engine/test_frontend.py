"""The frontend in front of real `transformers serve` processes: chat completions with audio
input for an audio language model, and what the frontend does about the limits recorded in
the other files of this suite (no aliases, a strict field list, soundfile's containers,
30 s of audio) -- each shown against the real server.

Workers are started from the operator's own settings and route table, as in a cluster.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from transformers.cli.serving.chat_completion import TransformersCompletionCreateParamsStreaming
from transformers.cli.serving.transcription import TransformersTranscriptionCreateParams

from testkit import standins
from testkit.audio import SENTENCES, convert, speak, wer
from testkit.host import free_port
from testkit.longaudio import long_recording
from testkit.processes import frontend, with_endpoints
from testkit.resources import make_td
from testkit.transformers_serve import WHISPER, Server, check_recording, launch
from transcription_api.capabilities import Engine, Mode, ModelFamily
from transcription_api.engines import capability_set
from transcription_api.engines.transformers import CHAT_FIELDS, TRANSCRIPTION_FIELDS
from transcription_api.openai import TranscriptionRequest
from transcription_api.params import parse_request
from transcription_api.routes import PoolRoute, RouteTable
from transcription_frontend.adapters.transformers import AudioLMAdapter
from transcription_frontend.inline import Base64Of, encoded
from transcription_operator.children import route_table, worker_settings
from transcription_operator.plan import plan

AUDIO_LM = "qwen2-audio-tiny"


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speak(SENTENCES[1], tmp_path_factory.mktemp("speech"))


@contextmanager
def deployment(
    spec: dict[str, Any], cwd: Path, d: Path
) -> Iterator[tuple[RouteTable, Server, str]]:
    """The operator's plan and route table for `spec` (one transformers pool), its worker
    and a frontend; all stopped at the end, also when one fails to start."""
    td = make_td(spec)
    the_plan = plan(td.spec)
    [pool] = the_plan.pools
    assert pool.engine == Engine.TRANSFORMERS
    settings = worker_settings(td, pool).model_copy(update={"port": free_port()})
    server = launch(settings, cwd, d / f"{pool.name}.log")
    fe = None
    try:
        table = route_table(td, the_plan)
        url, fe = frontend(with_endpoints(table, {pool.name: server.url}), d)
        yield table, server, url
    finally:
        if fe is not None:
            fe.terminate()
            fe.wait(timeout=30)
        server.stop()


@pytest.fixture(scope="module")
def chat_deployment(
    checkpoints: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, str, openai.OpenAI]]:
    """An audio LM baked into the image, served in continuous mode: chat and transcription
    traffic, one pool (it transcribes through chat)."""
    spec = {"model": {"name": AUDIO_LM, "aliases": ["qwen"], "family": "audio-lm",
                      "source": "image", "path": str(checkpoints / "audio-lm")},
            "engine": "transformers", "pools": [{"name": "batch", "mode": "continuous"}],
            "traffic": {"endpoints": ["chat", "transcriptions"], "features": ["stream"]}}  # fmt: skip
    with deployment(spec, checkpoints, tmp_path_factory.mktemp("chat")) as (table, server, url):
        assert [(p.name, p.worker_model) for p in table.pools] == [
            ("batch", str(checkpoints / "audio-lm"))]  # fmt: skip
        yield server, url, sdk(url)


def sdk(url: str) -> openai.OpenAI:
    """The SDK without its retries, so that each answer is seen as it is, and so without
    reusing a connection: the frontend closes one idle for `idle_timeout_seconds` (5 s), and
    a request sent on it as it closes gets no answer (seen on the slower class, where a
    direct request to the server between two through the frontend took about that long).
    The SDK's default retries cover that race for users."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                         default_headers={"Connection": "close"})  # fmt: skip


def audio_part(data: bytes, fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}  # fmt: skip


def user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "Transcribe this."}]}]


def direct(server: Server, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", timeout=120,
                      json={"model": server.model, "max_tokens": 5, **body})  # fmt: skip


def requests_seen(server: Server) -> int:
    return server.log_text().count("[Request received]")


# --------------------------------------------------------------------------- chat


def test_chat_with_audio_input_through_the_frontend(chat_deployment: Any, wav: Path) -> None:
    server, _, client = chat_deployment
    messages = user(audio_part(wav.read_bytes()))
    r = client.chat.completions.create(model="qwen", messages=messages, max_tokens=5)  # type: ignore[arg-type]
    # The client's alias became the path the worker loaded, and the primary name came back.
    assert r.model == AUDIO_LM
    assert r.usage is not None and r.usage.prompt_tokens > 100  # the audio reached the model
    want = direct(server, messages=messages).json()
    assert r.choices[0].message.content == want["choices"][0]["message"]["content"]
    assert want["model"] == server.model


def test_chat_stream_through_the_frontend(chat_deployment: Any) -> None:
    server, url, client = chat_deployment
    messages = [{"role": "user", "content": "hi"}]
    chunks = list(client.chat.completions.create(
        model="qwen", messages=messages, max_tokens=5, stream=True))  # type: ignore[arg-type]  # fmt: skip
    assert {c.model for c in chunks} == {AUDIO_LM}
    assert chunks[-1].choices[0].finish_reason == "length"
    raw = direct(server, messages=messages, stream=True).text
    want = [json.loads(e.removeprefix("data: ")) for e in raw.split("\n\n") if e]
    assert [c.choices[0].delta.content for c in chunks] == [
        w["choices"][0]["delta"].get("content") for w in want]  # fmt: skip
    # transformers sends no [DONE]; the frontend ends the stream with it.
    assert "[DONE]" not in raw
    through = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "qwen", "messages": messages, "max_tokens": 5, "stream": True}).text  # fmt: skip
    assert through.endswith("data: [DONE]\n\n")


def short(body: bytes, max_tokens: int = 5) -> bytes:
    """The same chat request with a short generation: the recordings keep the shape of the
    answer, not hundreds of random-weight tokens."""
    return json.dumps({**json.loads(body), "max_tokens": max_tokens}).encode()


def asked_of(adapter: AudioLMAdapter, audio: bytes, request: TranscriptionRequest) -> bytes:
    """The chat request the frontend sends the pool for a transcription of this wav."""
    inline = Base64Of(io.BytesIO(audio), len(audio))
    return b"".join(encoded(adapter.chat_transcription(inline, "wav", AUDIO_LM, request)))


def starts_with(text: str, words: list[str]) -> bool:
    """Whether a random-weight model's answer starts with these words: long generations
    drift between runs (its logits are nearly tied), their start does not."""
    return text.split()[: len(words)] == words


def test_chat_and_transcription_share_one_deployment(chat_deployment: Any, wav: Path) -> None:
    """The same audio LM, the same pool: a transcription goes to its chat endpoint with the
    audio and the instruction, and comes back in OpenAI's transcription shapes."""
    server, _, client = chat_deployment
    audio = wav.read_bytes()
    pool = PoolRoute(name="batch", engine=Engine.TRANSFORMERS, mode=Mode.CONTINUOUS,
                     service="s", family=ModelFamily.AUDIO_LM, worker_model=server.model)  # fmt: skip
    headers = {"content-type": "application/json"}
    asked = asked_of(AudioLMAdapter(pool), audio, parse_request([]))
    straight = httpx.post(f"{server.url}/v1/chat/completions", content=short(asked),
                          headers=headers, timeout=300)  # fmt: skip
    check_recording("chat_transcription_json", straight, {server.model: "<checkpoint>"})
    assert straight.status_code == 200, straight.text
    assert straight.json()["usage"]["prompt_tokens"] > 100  # the audio reached the model
    # The first words of the short answer (its last may be cut mid-word).
    want = straight.json()["choices"][0]["message"]["content"].split()[:-1]
    assert want
    out = client.audio.transcriptions.create(model="qwen", file=("a.wav", audio))
    assert starts_with(out.text, want)  # random weights: the words are noise, not speech
    text = client.audio.transcriptions.create(model="qwen", file=("a.wav", audio),
                                              response_format="text")  # fmt: skip
    assert starts_with(text, want) and text.endswith("\n")
    streamed = asked_of(AudioLMAdapter(pool), audio, parse_request([("stream", "true")]))
    raw = httpx.post(f"{server.url}/v1/chat/completions", content=short(streamed),
                     headers=headers, timeout=300)  # fmt: skip
    check_recording("chat_transcription_stream", raw, {server.model: "<checkpoint>"})
    assert "[DONE]" not in raw.text and '"finish_reason":"length"' in raw.text
    events = list(client.audio.transcriptions.create(model="qwen", file=("a.wav", audio),
                                                     stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    assert events[-1].text == "".join(e.delta for e in events[:-1])  # type: ignore[union-attr]
    assert starts_with(events[-1].text, want)
    # And the same deployment still chats.
    r = client.chat.completions.create(model="qwen", max_tokens=5,
                                       messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert r.model == AUDIO_LM and r.choices[0].message.content


def test_audio_in_another_container_than_it_says(
    chat_deployment: Any, wav: Path, tmp_path: Path
) -> None:
    """FLAC labelled wav (the OpenAI SDK types only wav and mp3): the frontend names the
    container the bytes are in, and the model gets the audio."""
    _, _, client = chat_deployment
    flac = convert(wav, "flac").read_bytes()
    r = client.chat.completions.create(model="qwen", messages=user(audio_part(flac, "wav")),  # type: ignore[arg-type]
                                       max_tokens=5)  # fmt: skip
    assert r.usage is not None and r.usage.prompt_tokens > 100


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"type": "audio_url", "audio_url": {"url": "http://169.254.169.254/latest"}},
         "audio_url parts are not accepted (the worker would fetch the URL itself)"),
        ({"type": "input_audio", "input_audio": {"data": "//uQ///proc/self/environ", "format": "wav"}},
         "must be the audio itself, base64-encoded: not a URL, a path"),
        ("m4a", "the audio is MP4/M4A (AAC), which the transformers engine of pool batch cannot decode"),
    ],
)  # fmt: skip
def test_what_the_worker_must_not_see_is_refused_before(
    chat_deployment: Any, wav: Path, part: Any, message: str
) -> None:
    server, _, client = chat_deployment
    if part == "m4a":
        part = audio_part(convert(wav, "m4a").read_bytes(), "m4a")
    seen = requests_seen(server)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qwen", messages=user(part))  # type: ignore[arg-type]
    assert message in e.value.message
    assert requests_seen(server) == seen
    r = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=5)  # fmt: skip
    assert r.model == AUDIO_LM


# --------------------------------------------------------------------------- transcriptions


@pytest.fixture(scope="module")
def whisper_deployment(
    checkpoints: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, str, openai.OpenAI]]:
    """Whisper, sequential, transcriptions only: no other pool to fall back on."""
    spec = {"model": {"name": WHISPER, "aliases": ["whisper-1"]}, "engine": "transformers",
            "pools": [{"name": "seq", "mode": "sequential"}],
            "traffic": {"endpoints": ["transcriptions"], "features": ["stream"]}}  # fmt: skip
    with deployment(spec, checkpoints, tmp_path_factory.mktemp("whisper")) as (_, server, url):
        yield server, url, sdk(url)


def containers(wav: Path) -> dict[str, bytes]:
    out = {
        fmt: convert(wav, fmt).read_bytes() for fmt in ("wav", "flac", "mp3", "ogg", "webm", "m4a")
    }
    for fmt in ("aiff", "au"):
        path = wav.with_suffix(f".{fmt}")
        subprocess.run(["sox", str(wav), str(path)], check=True)
        out[fmt] = path.read_bytes()
    return out


def test_the_containers_it_decodes_are_the_capability_tables(
    whisper_deployment: Any, wav: Path
) -> None:
    """The evidence for `audio_formats`: each container straight to the real server, and
    through the frontend, which refuses the ones the server answers with a bare 500."""
    server, _, client = whisper_deployment
    table = capability_set(Engine.TRANSFORMERS, Mode.SEQUENTIAL)
    assert table is not None and table.audio_formats is not None
    decoded = set()
    for fmt, data in containers(wav).items():
        r = httpx.post(f"{server.url}/v1/audio/transcriptions", data={"model": server.model},
                       files={"file": (f"a.{fmt}", data)}, timeout=120)  # fmt: skip
        if r.status_code == 200:
            decoded.add(fmt)
            assert wer(SENTENCES[1], r.json()["text"]) == 0, fmt
            assert client.audio.transcriptions.create(
                model="whisper-1", file=(f"a.{fmt}", data)).text == r.json()["text"]  # fmt: skip
        else:
            assert (r.status_code, r.text) == (500, "Internal Server Error"), fmt
            with pytest.raises(openai.BadRequestError, match="cannot decode"):
                client.audio.transcriptions.create(model="whisper-1", file=(f"a.{fmt}", data))
    assert decoded == {"wav", "flac", "mp3", "ogg", "aiff", "au"}
    assert decoded <= table.audio_formats  # caf too: not produced here


def test_long_audio_is_chunked_instead_of_cut(whisper_deployment: Any, tmp_path: Path) -> None:
    """The server transcribes the first 30 s and drops the rest (`long_audio`); through the
    frontend, longer audio is cut on silence into pieces it takes whole, and nothing is
    dropped."""
    _, _, client = whisper_deployment
    recording = long_recording(tmp_path, 40, sentences=SENTENCES, pause_range=(0.8, 1.2))
    assert recording.seconds > 30
    with recording.wav.open("rb") as f:
        out = client.audio.transcriptions.create(model="whisper-1", file=f)
    assert wer(recording.text, out.text) <= 0.25, out.text
    assert recording.sentences[-1].text.split()[-1].strip(".").lower() in out.text.lower()


def test_fields_it_refuses_are_a_400_not_its_422(whisper_deployment: Any, wav: Path) -> None:
    _, url, client = whisper_deployment
    r = httpx.post(f"{url}/v1/audio/transcriptions", timeout=60,
                   data={"model": "whisper-1", "seed": "1"}, files={"file": ("a.wav", wav.read_bytes())})  # fmt: skip
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(
        "the transformers engine of pool seq does not accept the field(s) `seed`"
    )
    # The SDK's `include[]`, which transformers accepts and ignores, is refused by name
    # (api/transcription_api/fields.py: no engine here returns logprobs yet); the rest passes.
    with pytest.raises(openai.BadRequestError, match="capability logprobs"):
        client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav.read_bytes()),
                                           include=["logprobs"])  # fmt: skip
    t = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav.read_bytes()),
                                           language="en", prompt="Hi.")  # fmt: skip
    assert wer(SENTENCES[1], t.text) == 0


def test_the_field_lists_are_transformers_own() -> None:
    """The frontend's lists (and the stand-in's) of what transformers serve accepts, against
    its own validators' parameter classes: a new transformers release that changes them
    fails here."""
    transcription = set(TransformersTranscriptionCreateParams.__mutable_keys__)  # type: ignore[attr-defined]
    chat = set(TransformersCompletionCreateParamsStreaming.__mutable_keys__)  # type: ignore[attr-defined]
    assert TRANSCRIPTION_FIELDS | {"file"} == transcription
    assert chat == CHAT_FIELDS
    assert transcription == standins.TRANSFORMERS_FORM
    assert chat == standins.TRANSFORMERS_CHAT
