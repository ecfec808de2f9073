"""Stand-in workers that answer with engines' recorded responses, served over real HTTP.

`vllm_app` replays `fixtures/vllm-0.32/` (vLLM 0.32's verbatim answers) and
`transformers_app` replays `fixtures/transformers-5.24/` (transcriptions and chat
completions), choosing the recording the real engine would have sent for each request.
`serve()` runs any ASGI app on a free local port in a background thread.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import wave
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from testkit.host import free_port

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
VLLM = FIXTURES / "vllm-0.32"
TRANSFORMERS = FIXTURES / "transformers-5.24"
VLLM_MAX_BYTES = 25 * 1024 * 1024
WHISPER_LANGUAGES = {
    "af", "ar", "hy", "az", "be", "bs", "bg", "ca", "zh", "hr", "cs", "da", "nl", "en", "et",
    "fi", "fr", "gl", "de", "el", "he", "hi", "hu", "is", "id", "it", "ja", "kn", "kk", "ko",
    "lv", "lt", "mk", "ms", "mr", "mi", "ne", "no", "fa", "pl", "pt", "ro", "ru", "sr", "sk",
    "sl", "es", "sw", "sv", "tl", "ta", "th", "tr", "uk", "ur", "vi", "cy",
}  # fmt: skip
AUDIO_MAGIC = (b"RIFF", b"fLaC", b"OggS", b"ID3", b"\x1a\x45\xdf\xa3")


def recording(directory: Path, name: str) -> tuple[int, str, str]:
    """(status, content type, body) of one recorded response."""
    doc = json.loads((directory / f"{name}.json").read_text())
    status = int(doc["status_line"].split()[1])
    return status, doc["content_type"], doc["body"]


def replay(directory: Path, name: str, **replace: str) -> Response:
    status, ctype, body = recording(directory, name)
    for old, new in replace.items():
        body = body.replace(old, new)
    return Response(body, status_code=status, headers={"content-type": ctype})


@dataclass
class Seen:
    """What a stand-in received: for checking that nothing was dropped on the way."""

    fields: list[tuple[str, str]]
    file_bytes: int
    file_name: str
    headers: dict[str, str]
    path: str = ""  # which endpoint: /v1/audio/transcriptions or /v1/audio/translations
    body: dict[str, Any] | None = None  # a chat request's JSON


def wav_seconds(data: bytes) -> float:
    """How long a WAV file plays (0 for anything else)."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            frames, rate = w.getnframes(), w.getframerate()
    except (wave.Error, EOFError):
        return 0.0
    return float(frames / rate)


@dataclass
class Behaviour:
    delay: float = 0.0  # seconds of "compute" per request
    # and per second of its audio (WAV files), whose length its JSON answers then report
    per_audio_second: float = 0.0
    # While True, requests stay in "compute" past their delay: a window held open for as
    # long as a test needs it (a loaded machine can't shorten it), closed by setting False.
    hold: bool = False
    chunk_delay: float = 0.02  # between stream events
    status: int | None = None  # answer every request with this status (e.g. 503)
    # Fill verbose_json with two invented segments, as multilingual Whisper models do. The
    # recording (English-only tiny.en) has one empty segment; tests check that the invented
    # ones have exactly the recorded segment's fields and types.
    segments: bool = False
    # End the stream with vLLM's error event after this many chunks (then `[DONE]`, as
    # vLLM's stream generator does when the engine fails part-way).
    fail_stream_after: int | None = None
    # Break the connection after this many chunks, as a worker killed mid-stream does.
    cut_stream_after: int | None = None
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    cancelled: int = 0

    @asynccontextmanager
    async def busy(self) -> AsyncIterator[None]:
        """One request in flight for the block; a cancelled one (its client gone) counted."""
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1

    async def compute(self, request: Request, audio_seconds: float = 0.0) -> Response | None:
        """`delay` seconds of "compute" (and `per_audio_second` for each of `audio_seconds`),
        and on while `hold`; a 499 if the client goes away meanwhile (counted as cancelled,
        as vLLM aborts the request of a client that went away)."""
        deadline = time.monotonic() + self.delay + self.per_audio_second * audio_seconds
        while self.hold or time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            if await request.is_disconnected():
                self.cancelled += 1
                return Response(status_code=499)
        return None


async def _form(request: Request) -> tuple[list[tuple[str, str]], bytes | None, str]:
    form = await request.form(max_part_size=1024 * 1024)
    fields, data, name = [], None, ""
    for k, v in form.multi_items():
        if isinstance(v, str):
            fields.append((k, v))
        else:
            data = await v.read()
            name = v.filename or ""
    return fields, data, name


STREAM_ERROR = {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                          "type": "InternalServerError", "param": None, "code": 500}}  # fmt: skip


def _segments_body(body: str) -> str:
    doc = json.loads(body)
    text = " The quick roundfoc stump over the lazy dog. Cuban eat separators reconcile denial to state into running workloads."
    doc["text"] = text
    doc["duration"] = 6.81675  # the invented segments' clip
    doc["segments"] = [
        {"id": 0, "avg_logprob": -0.2, "compression_ratio": 1.2, "end": 3.2, "no_speech_prob": 0.01,
         "seek": 0, "start": 0.0, "temperature": 0.0, "text": " The quick roundfoc stump over the lazy dog.", "tokens": [1, 2]},
        {"id": 1, "avg_logprob": -0.3, "compression_ratio": 1.2, "end": 6.8, "no_speech_prob": 0.01,
         "seek": 0, "start": 3.2, "temperature": 0.0, "text": " Cuban eat separators reconcile denial to state into running workloads.", "tokens": [3]},
    ]  # fmt: skip
    return json.dumps(doc)


def vllm_app(served: list[str], behaviour: Behaviour | None = None) -> Starlette:
    """A stand-in for `vllm serve <whisper> --served-model-name <served...>`."""
    b = behaviour or Behaviour()
    names = {"whisper-tiny.en": served[0], "whisper-1": served[1] if len(served) > 1 else served[0]}

    async def transcribe(request: Request) -> Response:
        async with b.busy():
            return await _transcribe(request)

    async def _transcribe(request: Request) -> Response:
        fields, data, fname = await _form(request)
        b.seen.append(
            Seen(fields, len(data or b""), fname, dict(request.headers), request.url.path)
        )
        if b.status:
            return PlainTextResponse("overloaded", status_code=b.status)
        f = dict(fields)
        if data is None:
            return replay(VLLM, "no_file")
        model = f.get("model")
        if model is not None and model not in served:
            status, ctype, body = recording(VLLM, "unknown_model")
            body = body.replace("`nope`", f"`{model}`").replace(
                "whisper-tiny.en, whisper-1", ", ".join(served)
            )
            return Response(body, status_code=status, headers={"content-type": ctype})
        if "temperature" in f:
            try:
                t = float(f["temperature"])
            except ValueError:
                return replay(VLLM, "bad_temperature")
            if not 0 <= t <= 2:
                return replay(VLLM, "temperature_range")
        if f.get("language") and f["language"] not in WHISPER_LANGUAGES:
            return replay(VLLM, "bad_language")
        if len(data) > VLLM_MAX_BYTES:
            return replay(VLLM, "big")
        if not data:
            return replay(VLLM, "empty_file")
        if not data.startswith(AUDIO_MAGIC):
            return replay(VLLM, "corrupt_audio")
        fmt = f.get("response_format", "json")
        if fmt not in ("json", "text", "verbose_json"):
            return replay(VLLM, "srt")
        stream = f.get("stream", "false").lower() in ("true", "1")
        if stream and fmt == "verbose_json":
            return replay(VLLM, "stream_verbose")
        if (gone := await b.compute(request, wav_seconds(data))) is not None:
            return gone
        if stream:
            return _stream(f.get("model") or served[0])
        status, ctype, body = recording(VLLM, fmt if fmt != "json" else "json")
        if fmt == "verbose_json" and b.segments:
            body = _segments_body(body)
        if b.per_audio_second:  # a worker whose time is its audio's reports that length too
            body = body.replace('"seconds":7', f'"seconds":{math.ceil(wav_seconds(data))}')
        return Response(body, status_code=status, headers={"content-type": ctype})

    def _stream(model: str) -> StreamingResponse:
        _, ctype, body = recording(VLLM, "stream")
        events = [e + "\n\n" for e in body.split("\n\n") if e]

        async def gen() -> AsyncIterator[bytes]:
            for i, e in enumerate(events):
                if i == b.cut_stream_after:
                    raise ConnectionAbortedError("worker killed mid-stream (stand-in)")
                if i == b.fail_stream_after:
                    yield f"data: {json.dumps(STREAM_ERROR)}\n\ndata: [DONE]\n\n".encode()
                    return
                yield e.replace('"model":"whisper-1"', f'"model":"{model}"').encode()
                await asyncio.sleep(b.chunk_delay)

        return StreamingResponse(gen(), headers={"content-type": ctype})

    async def models(request: Request) -> Response:
        return replay(VLLM, "models", **{'"whisper-tiny.en"': f'"{names["whisper-tiny.en"]}"',
                                         '"whisper-1"': f'"{names["whisper-1"]}"'})  # fmt: skip

    async def health(request: Request) -> Response:
        return Response(b"", status_code=200)

    async def metrics(request: Request) -> Response:
        return PlainTextResponse((VLLM / "metrics-families.txt").read_text())

    return Starlette(
        routes=[
            Route("/v1/audio/transcriptions", transcribe, methods=["POST"]),
            Route("/v1/audio/translations", transcribe, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
            Route("/metrics", metrics),
        ]
    )


# What `transformers serve` 5.24 accepts (its validators: anything else is a 422) and the
# containers soundfile decodes for it (others: a bare 500); the real suite checks both.
TRANSFORMERS_FORM = {
    "file", "model", "stream", "language", "prompt", "response_format", "temperature",
    "chunking_strategy", "include", "keywords", "known_speaker_names",
    "known_speaker_references", "languages", "timestamp_granularities",
}  # fmt: skip
TRANSFORMERS_CHAT = {
    "audio", "chat_template_kwargs", "frequency_penalty", "function_call", "functions",
    "generation_config", "logit_bias", "logprobs", "max_completion_tokens", "max_tokens",
    "messages", "metadata", "modalities", "model", "moderation", "n", "parallel_tool_calls",
    "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier",
    "seed", "service_tier", "stop", "store", "stream", "stream_options", "temperature",
    "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
}  # fmt: skip
SOUNDFILE_MAGIC = (
    b"RIFF",
    b"fLaC",
    b"OggS",
    b"ID3",
    b"\xff\xfb",
    b"\xff\xf3",
    b"FORM",
    b".snd",
    b"caff",
)
TORCHCODEC_ONLY = {"3gp", "aac", "ac3", "amr", "avi", "flv", "m4a", "m4v", "mkv", "mov", "mp4",
                   "mpg", "ogv", "sox", "ts", "webm", "wma", "wmv", "wv"}  # fmt: skip
# transformers' mid-stream error event: the exception's text, unescaped, in a JSON-ish shell.
TRANSFORMERS_STREAM_ERROR = 'data: {"error": "CUDA out of memory. Tried to allocate 2.00 GiB"}\n\n'


def decodable(data: bytes) -> bool:
    """Whether soundfile would decode it: a container it reads, with more than a header."""
    return data.startswith(SOUNDFILE_MAGIC) and data[4:].strip(b"\0") != b""


def _unexpected(fields: set[str]) -> Response:
    status, ctype, body = recording(TRANSFORMERS, "unknown_field")
    return Response(body.replace("{'foo'}", repr(fields)), status_code=status,
                    headers={"content-type": ctype})  # fmt: skip


TRANSFORMERS_WHISPER = "/models/whisper-tiny.en"  # the model the stand-in has loaded


def transformers_app(
    behaviour: Behaviour | None = None, model: str = TRANSFORMERS_WHISPER,
    family: str = "whisper",
) -> Starlette:  # fmt: skip
    """A stand-in for `transformers serve <model>`: a Whisper model (`family="whisper"`:
    transcriptions, no chat) or an audio language model (`"audio-lm"`: chat, audio input
    included; its transcription endpoint fails). It answers to `model` only."""
    b = behaviour or Behaviour()

    async def tracked(request: Request, handler: Any) -> Response:
        async with b.busy():
            if b.status:
                return PlainTextResponse("overloaded", status_code=b.status)
            if (gone := await b.compute(request)) is not None:
                return gone
            return await handler()  # type: ignore[no-any-return]

    async def transcribe(request: Request) -> Response:
        fields, data, fname = await _form(request)
        b.seen.append(
            Seen(fields, len(data or b""), fname, dict(request.headers), request.url.path)
        )
        return await tracked(request, lambda: _transcribe(dict(fields), fields, data))

    async def _transcribe(f: dict[str, str], fields: list[tuple[str, str]],
                          data: bytes | None) -> Response:  # fmt: skip
        names = {k for k, _ in fields} | ({"file"} if data is not None else set())
        if unexpected := names - TRANSFORMERS_FORM:
            return _unexpected(unexpected)
        if data is None:
            return replay(TRANSFORMERS, "no_file")
        if "model" not in f:
            return replay(TRANSFORMERS, "no_model")
        if f["model"] != model:
            return replay(TRANSFORMERS, "unknown_model")  # fetched from the hub: offline
        if not data:
            return replay(TRANSFORMERS, "empty_file")
        if data[4:8] == b"ftyp":
            return replay(TRANSFORMERS, "m4a")
        if not decodable(data):
            return replay(TRANSFORMERS, "corrupt_audio")
        if family != "whisper":
            return replay(TRANSFORMERS, "audio_lm_transcription")
        if f.get("stream", "false").lower() == "true":
            return _stream("stream", "")
        return replay(TRANSFORMERS, "json")

    def _stream(name: str, served: str) -> StreamingResponse:
        _, ctype, body = recording(TRANSFORMERS, name)
        events = [e + "\n\n" for e in body.replace("<checkpoint>", served).split("\n\n") if e]

        async def gen() -> AsyncIterator[bytes]:
            for i, e in enumerate(events):
                if i == b.fail_stream_after:
                    yield TRANSFORMERS_STREAM_ERROR.encode()
                    return
                yield e.encode()
                await asyncio.sleep(b.chunk_delay)

        return StreamingResponse(gen(), headers={"content-type": ctype})

    async def chat(request: Request) -> Response:
        body = await request.json()
        b.seen.append(Seen([], 0, "", dict(request.headers), request.url.path, body))
        return await tracked(request, lambda: _chat(body))

    async def _chat(body: dict[str, Any]) -> Response:
        if unexpected := set(body) - TRANSFORMERS_CHAT:
            return _unexpected(unexpected)
        requested = body.get("model")
        if requested is not None and requested != model:
            return replay(TRANSFORMERS, "chat_other_model", **{"<checkpoint>": model,
                          "'whisper-1'": f"'{requested}'"})  # fmt: skip
        if family == "whisper":
            return replay(TRANSFORMERS, "whisper_chat")
        for message in body["messages"]:
            content = message.get("content")
            for part in content if isinstance(content, list) else []:
                if part["type"] == "input_audio":
                    audio = part["input_audio"]
                    data = base64.b64decode(audio["data"])
                    if audio.get("format") in TORCHCODEC_ONLY or not decodable(data):
                        return replay(TRANSFORMERS, "corrupt_audio")
        if body.get("stream"):
            return _stream("cb_audio_lm_chat_stream", model)
        return replay(TRANSFORMERS, "cb_audio_lm_chat_audio", **{"<checkpoint>": model})

    async def health(request: Request) -> Response:
        return replay(TRANSFORMERS, "health")

    return Starlette(routes=[Route("/v1/audio/transcriptions", transcribe, methods=["POST"]),
                             Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/health", health)])  # fmt: skip


class RawWorker:
    """A worker that fails below HTTP, as a killed or hung one does, on a real socket:

    - "close":  reads the request head, then closes the connection (killed before answering)
    - "partial": sends a 200 head and part of its body, then closes (killed mid-answer)
    - "silent": reads the request and never answers (hung)
    - "stall":  starts vLLM's recorded stream, sends its first event, then nothing (hung)
    - "answer": reads the request, answers vLLM's recorded JSON (healthy again: `mode` is
      read per connection, so a test can mend a worker)
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.connections = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        server.close()
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The mode as the connection is counted: a test that waits for a connection, then
        # mends the worker, knows that connection got the old mode.
        self.connections += 1
        mode = self.mode
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if mode == "answer":
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                status, ctype, body = recording(VLLM, "json")
                data = body.encode()
                writer.write(f"HTTP/1.1 {status} OK\r\ncontent-type: {ctype}\r\n"
                             f"content-length: {len(data)}\r\n\r\n".encode() + data)  # fmt: skip
                await writer.drain()
            elif mode == "partial":
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: 100\r\n\r\n{\"text\": \"par")  # fmt: skip
                await writer.drain()
            elif mode == "stall":
                event = recording(VLLM, "stream")[2].split("\n\n")[0].encode() + b"\n\n"
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n"
                             + f"{len(event):x}\r\n".encode() + event + b"\r\n")  # fmt: skip
                await writer.drain()
                await asyncio.sleep(3600)
            elif mode == "silent":
                await asyncio.sleep(3600)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        """Stop serving: its port refuses from then on. Stopping it again does nothing."""
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(timeout=5)


@dataclass
class Running:
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start(app: Any, port: int | None = None, **more: Any) -> Running:
    """`app` served by uvicorn in a thread of this process; `more`: more of uvicorn's
    settings."""
    port = port or free_port()
    # A bounded graceful shutdown: a test that fails with requests still open (held by a
    # frontend, say) must not wait for them.
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=5, **more)  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    return Running(f"http://127.0.0.1:{port}", server, thread)


@contextmanager
def serve(app: Any, port: int | None = None) -> Iterator[Running]:
    running = start(app, port)
    try:
        yield running
    finally:
        running.stop()


# A vLLM stand-in in a process of its own, so that a test can SIGKILL it mid-request.
_PROCESS = """
import sys, uvicorn
from testkit.standins import Behaviour, vllm_app
uvicorn.run(vllm_app(sys.argv[2].split(","), Behaviour(delay=float(sys.argv[3]))),
            host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


@contextmanager
def vllm_process(served: list[str], delay: float) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The vLLM stand-in as a separate process (its URL, the process); killed on exit."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROCESS, str(port), ",".join(served), str(delay)]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the stand-in process did not start (exit {proc.poll()})"
                    ) from None
                time.sleep(0.05)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
