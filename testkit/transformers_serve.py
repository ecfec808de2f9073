"""Real `transformers serve` processes started by our launcher, and the check of their answers
against the recordings in `tests/fixtures/transformers-<version>/` (`RECORD=1` rewrites
them from the live server). Needs torch and transformers: the transformers suite's own
environment (`make venv-transformers`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import transformers

from testkit import processes
from testkit.host import free_port
from testkit.standins import FIXTURES
from transcription_api.capabilities import Engine, Mode, ModelFamily
from transcription_api.worker import SETTINGS_ENV, WorkerSettings

RECORDINGS = FIXTURES / f"transformers-{'.'.join(transformers.__version__.split('.')[:2])}"
START_TIMEOUT = 300
# Keys of JSON answers that change on every request (and a completion's `id`).
VOLATILE = ("created", "system_fingerprint")
WHISPER = "whisper-tiny.en"


@dataclass
class Server:
    """A `transformers serve` process started by `transcription-transformers-launcher`."""

    url: str
    settings: WorkerSettings
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def model(self) -> str:
        return self.settings.model_reference

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def logged(self, text: str, timeout: float = 10) -> bool:
        """Whether the server logs `text` (soon: tracebacks come after the response)."""
        deadline = time.monotonic() + timeout
        while text not in self.log_text():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def stop(self) -> None:
        processes.stop(self.proc, grace=20)


def launch(
    settings: WorkerSettings, cwd: Path, log: Path, env: dict[str, str] | None = None
) -> Server:
    """Run the launcher as a pod would (settings in the environment) and wait for /health."""
    environ = {**os.environ, SETTINGS_ENV: settings.to_env(), "HF_HUB_OFFLINE": "1",
               "HF_HOME": str(cwd / ".hf-home"), **(env or {})}  # fmt: skip
    launcher = Path(sys.executable).parent / "transcription-transformers-launcher"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(launcher)], cwd=cwd, env=environ, stdout=out, stderr=out)
    server = Server(f"http://127.0.0.1:{settings.port}", settings, proc, log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"transformers serve exited ({proc.returncode}):\n{server.log_text()[-3000:]}"
            )
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(
        f"transformers serve not healthy in {START_TIMEOUT}s:\n{server.log_text()[-3000:]}"
    )


def worker_settings(
    model: str, mode: Mode, family: ModelFamily = ModelFamily.WHISPER
) -> WorkerSettings:
    return WorkerSettings(engine=Engine.TRANSFORMERS, mode=mode, model=model, family=family,
                          served_names=[model], port=free_port())  # fmt: skip


# --------------------------------------------------------------------------- recordings


def normalized_body(body: str, content_type: str) -> str:
    """The body with what changes per request taken out (ids, timestamps)."""
    if content_type.startswith("application/json"):
        return json.dumps(_drop(json.loads(body)), separators=(",", ":"), ensure_ascii=False)
    if content_type.startswith("text/event-stream"):
        events = []
        for event in body.split("\n\n"):
            data = event.removeprefix("data: ")
            if data.startswith("{"):
                event = "data: " + json.dumps(
                    _drop(json.loads(data)), separators=(",", ":"), ensure_ascii=False
                )
            events.append(event)
        return "\n\n".join(events)
    return body


def _drop(doc: Any) -> Any:
    if isinstance(doc, dict):
        completion = str(doc.get("object", "")).startswith("chat.completion")
        return {
            k: _drop(v)
            for k, v in doc.items()
            if k not in VOLATILE and not (completion and k == "id")
        }
    if isinstance(doc, list):
        return [_drop(v) for v in doc]
    return doc


def check_recording(name: str, r: httpx.Response, replace: dict[str, str] | None = None) -> None:
    """Compare a live answer with its recording (or, with RECORD=1, record it).

    `replace` maps run-specific strings (temporary paths) to stable placeholders."""
    content_type = r.headers.get("content-type", "")
    body = normalized_body(r.text, content_type)
    for old, new in (replace or {}).items():
        body = body.replace(old, new)
    live = {"status_line": f"HTTP/1.1 {r.status_code} {r.reason_phrase}",
            "content_type": content_type, "body": body}  # fmt: skip
    path = RECORDINGS / f"{name}.json"
    if os.environ.get("RECORD"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(live, indent=1, ensure_ascii=False))
        return
    assert path.exists(), f"no recording {path.name}: run with RECORD=1 to make it"
    recorded = json.loads(path.read_text())
    assert live == recorded, f"transformers serve no longer answers as recorded in {path.name}"
