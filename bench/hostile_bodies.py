"""Bodies held in memory (issue 37, finding 2; alone: `python -m bench hostile-bodies`): the
frontend's RSS before, at peak and after ten concurrent 20 MB bodies sent to an audio
language model's pool (the stand-in `transformers serve`, which takes 2 s over each):

- chat completions of 20 MB of JSON each (15 MB of WAV inline as base64), with the default
  `bufferedBodyBytes` (128 MiB: six fit, the rest get 503 with `Retry-After`), then with
  it raised to 1 GiB so that all ten are held at once;
- transcriptions of a 20 MB WAV each, which the gateway sends to the model's chat endpoint
  with the audio inline as base64.

Before (the finding): ten 23 MB chat bodies peaked at 864 MiB and ten 20 MB transcriptions
at 674 MiB. Target: under half the frontend's default 512 Mi memory limit.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from testkit.audio import noise_wav
from testkit.frontend import PRIMARY, chat_pool
from transcription_api.frontend import FrontendLimits
from transcription_api.routes import RouteTable

from .common import LIMIT_MIB, PY, RESULTS, Proc, frontend_proc, refusal, sampled, say, table, write

BASE = 18790
BODIES = 10
BODY_BYTES = 20_000_000
SECONDS = 29  # of audio in each: under the audio LM's 30 s, so that none is cut up
WORKER_DELAY = 2.0


def _worker(port: int) -> Proc:
    return Proc([PY, "-m", "bench.standin_server", "--port", str(port), "--audio-lm",
                 "--delay", str(WORKER_DELAY)], f"http://127.0.0.1:{port}/health",
                f"standin-audio-lm-{port}")  # fmt: skip


def _routes(path: Path, worker_url: str) -> Path:
    table_ = RouteTable(model=PRIMARY, aliases=["qwen"], max_upload_bytes=26_214_400,
                        pools=[chat_pool(worker_url)])  # fmt: skip
    path.write_text(table_.dumps())
    return path


def _chat_body() -> bytes:
    audio = noise_wav(SECONDS, rate=BODY_BYTES * 3 // 4 // (2 * SECONDS))
    part = {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"}}  # fmt: skip
    content = [part, {"type": "text", "text": "Transcribe this."}]
    return json.dumps(
        {"model": "qwen", "messages": [{"role": "user", "content": content}]}
    ).encode()


def _row(name: str, defaults: bool, url: str, fe: Proc, send: Any) -> dict[str, Any]:
    """BODIES requests at once (`send(client)`, a response), RSS around them."""

    def during() -> Counter[str]:
        with httpx.Client(timeout=120) as c, ThreadPoolExecutor(BODIES) as pool:
            answers = list(pool.map(lambda _: send(c), range(BODIES)))
        return Counter("200" if r.status_code == 200 else refusal(r) for r in answers)

    outcomes, rss = sampled(fe, during)
    return {"row": name, "default_limits": defaults, **rss,
            "outcomes": dict(sorted(outcomes.items()))}  # fmt: skip


def bodies() -> list[dict[str, Any]]:
    RESULTS.mkdir(exist_ok=True)
    chat = _chat_body()
    upload = noise_wav(SECONDS, rate=BODY_BYTES // (2 * SECONDS))
    say(f"{BODIES} concurrent bodies: chat {len(chat) / 1e6:.1f} MB, upload "
        f"{len(upload) / 1e6:.1f} MB")  # fmt: skip
    rows: list[dict[str, Any]] = []
    w = _worker(BASE + 1)
    try:
        rf = _routes(RESULTS / "routes-hostile-bodies.json", f"http://127.0.0.1:{BASE + 1}")
        cases = [
            (f"{BODIES} concurrent 20 MB chat bodies (default bufferedBodyBytes, 128 MiB)",
             FrontendLimits(), "chat"),
            (f"{BODIES} concurrent 20 MB chat bodies (bufferedBodyBytes 1 GiB: all held)",
             FrontendLimits(buffered_body_bytes=1024**3), "chat"),
            (f"{BODIES} concurrent 20 MB uploads to an audio-LM pool", FrontendLimits(),
             "transcription"),
        ]  # fmt: skip
        for i, (name, limits, kind) in enumerate(cases):
            port = BASE + 2 + i
            fe = frontend_proc(rf, port, f"hostile-bodies-{port}", limits=limits)
            url = f"http://127.0.0.1:{port}"
            try:
                if kind == "chat":

                    def send(c: httpx.Client, url: str = url) -> httpx.Response:
                        return c.post(f"{url}/v1/chat/completions", content=chat,
                                      headers={"content-type": "application/json"})  # fmt: skip
                else:

                    def send(c: httpx.Client, url: str = url) -> httpx.Response:
                        return c.post(f"{url}/v1/audio/transcriptions", data={"model": "qwen"},
                                      files={"file": ("a.wav", upload)})  # fmt: skip

                with httpx.Client(timeout=120) as c:  # warm: the route, the modules
                    assert send(c).status_code == 200
                say(name)
                rows.append(_row(name, limits == FrontendLimits(), url, fe, send))
            finally:
                fe.stop()
    finally:
        w.stop()
    return rows


def bodies_table(rows: list[dict[str, Any]]) -> None:
    table(f"Bodies held in memory: {BODIES} at once, to an audio LM's pool (worker takes "
          f"{WORKER_DELAY:g} s)",
          ["scenario", "RSS before MiB", "peak MiB", "after MiB", "answers"],
          [[r["row"], r["rss_before_mib"], r["rss_peak_mib"], r["rss_after_mib"],
            ", ".join(f"{k}: {v}" for k, v in r["outcomes"].items())] for r in rows])  # fmt: skip


def run(quick: bool = False) -> dict[str, Any]:
    """The bodies scenarios alone (`python -m bench hostile-bodies`)."""
    rows = bodies()
    bodies_table(rows)
    result = {
        "bodies": BODIES,
        "body_bytes": BODY_BYTES,
        "rows": rows,
        "targets": {f"peak_under_{LIMIT_MIB // 2}mib_with_default_limits": all(
            r["rss_peak_mib"] < LIMIT_MIB / 2 for r in rows if r["default_limits"])},
    }  # fmt: skip
    write("hostile-bodies", result)
    return result
