"""The gateway in-process over real HTTP, for the fast tests: a route table's pools, the
frontend serving them, and the readers of its answers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai

from testkit import rawhttp
from testkit.audio import tone_wav
from testkit.standins import TRANSFORMERS, VLLM, Running, recording, start
from transcription_api.capabilities import Engine, Mode, ModelFamily
from transcription_api.frontend import FrontendSettings
from transcription_api.routes import PoolRoute, Routes, RouteTable
from transcription_frontend.app import Gateway, create_app
from transcription_frontend.routing import Router
from transcription_frontend.tracing import Tracer

PRIMARY = "openai/whisper-large-v3-turbo"
SERVED = [PRIMARY, "whisper-1"]
AUDIO_LM_MODEL = "/models/qwen2-audio"  # the name the worker loaded; clients never say it
WAV = tone_wav(0.5)
FIXTURE_TEXT = json.loads(recording(VLLM, "json")[2])["text"]  # what the vLLM stand-in says
RECORDED = json.loads(recording(TRANSFORMERS, "cb_audio_lm_chat_audio")[2])
RECORDED_DELTAS = ["International", " Rush", "mes", " Officials", " Exile"]


def pool(
    name: str, urls: list[str], engine: Engine = Engine.VLLM, mode: Mode = Mode.CONTINUOUS
) -> PoolRoute:
    return PoolRoute(name=name, engine=engine, mode=mode, service=f"svc-{name}", endpoints=urls)


def in_process(**settings: Any) -> FrontendSettings:
    """A gateway's settings in a test's process: no scaler and no internal port (on their
    fixed ports, gateways side by side would collide), `settings` over that."""
    return FrontendSettings(**{"scaler_port": None, "internal_port": None, **settings})


class Frontend:
    """The gateway on `table` (one deployment's, or a gateway's `Routes`), with `settings`
    (fields of `FrontendSettings`) and API keys from `keys`; no scaler and no internal port
    unless the settings say so. With `table_path`, the table is written there and re-read
    when it changes, as the operator's ConfigMap is."""

    def __init__(self, table: RouteTable | Routes, keys: Path | None = None,
                 tracer: Tracer | None = None, table_path: Path | None = None,
                 **settings: Any) -> None:  # fmt: skip
        self.settings = in_process(api_keys_path=keys, **settings)
        self.router = Router(table, policy=self.settings.balancer.value)
        if table_path is not None:
            table_path.write_text(table.dumps())
        self.gateway = Gateway(router=self.router, settings=self.settings, table_path=table_path,
                               tracer=tracer or Tracer())  # fmt: skip
        # No keepalive pings on realtime sessions: the test's own event loop answers them, and
        # under a cold `make test`'s load its process went unscheduled past uvicorn's 20 s, so
        # that a session was closed with 1011 mid-test. The tests bound their waits themselves.
        self.running: Running = start(create_app(self.gateway), ws_ping_interval=None)
        self.url = self.running.url
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0)

    def endpoints(self, pool: str, urls: list[str], terminating: Sequence[str] = ()) -> None:
        """Discovery's view of a pool changes: an EndpointSlice event, as the watch sends it."""
        self.gateway.apply_slice("MODIFIED", endpoint_slice(f"svc-{pool}", urls, terminating))

    def post(self, fields: dict[str, Any] | list[tuple[str, str]], file: bytes | None = WAV,
             endpoint: str = "transcriptions", **kw: Any) -> httpx.Response:  # fmt: skip
        return httpx.post(f"{self.url}/v1/audio/{endpoint}", files=multipart(fields, file),
                          **{"timeout": 30, **kw})  # fmt: skip

    def hang_up(self, fields: dict[str, Any], reached: Callable[[], bool], file: bytes = WAV,
                timeout: float = 30) -> None:  # fmt: skip
        """Send a transcription request and leave once `reached()` holds (`rawhttp.leave`)."""
        url = f"{self.url}/v1/audio/transcriptions"
        rawhttp.leave(httpx.Request("POST", url, files=multipart(fields, file)), reached, timeout)

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.url}/metrics").text
        total = 0.0
        for line in text.splitlines():
            if line.startswith((name + "{", name + " ")) and all(
                f'{k}="{v}"' in line for k, v in labels.items()
            ):
                total += float(line.rsplit(" ", 1)[1])
        return total


# Seconds a test waits for what must come (an answer, a state, a process's exit): only a
# failure waits it out. On two cores busy with the e2e suite and two more test processes, a
# niced test process has gone unscheduled for 20 s (an in-process gateway's keepalive timed
# out), and bounds of 5-10 s were overrun (the fairness test's 5 s, in a cold `make test`).
PATIENCE = 60.0


def wait_until(check: Callable[[], bool], timeout: float = PATIENCE, what: str = "") -> None:
    """Poll `check` until it holds; past `timeout` seconds (`PATIENCE`), fail saying `what`
    was awaited."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def answered_with(status: int, request: Callable[[], httpx.Response], what: str) -> httpx.Response:
    """Send `request` again until it is answered `status`, and return that answer: for a
    state the gateway reaches on its own time (uploads counted in flight, their slots freed
    once they are closed), which a fixed pause would only guess at."""
    got: list[httpx.Response] = []

    def check() -> bool:
        got[:] = [request()]
        return got[0].status_code == status

    try:
        wait_until(check, what=f"{what} (status {status})")
    except AssertionError as e:
        raise AssertionError(f"{e}; the last answer: {got[0].status_code} {got[0].text}") from None
    return got[0]


def multipart(fields: dict[str, Any] | list[tuple[str, str]], file: bytes | None
              ) -> list[tuple[str, Any]]:  # fmt: skip
    """Every field as a multipart part, in order (as the OpenAI SDK sends them), then the
    file as `a.wav`."""
    items = list(fields.items()) if isinstance(fields, dict) else fields
    parts: list[tuple[str, Any]] = [(k, (None, v)) for k, v in items]
    if file is not None:
        parts.append(("file", ("a.wav", file, "audio/wav")))
    return parts


def endpoint_slice(
    service: str, urls: list[str], terminating: Sequence[str] = (), name: str = "abcde"
) -> dict[str, Any]:
    """An EndpointSlice of `service` listing base URLs (one port for all: the slice's)."""
    port = int((urls or terminating or ["http://x:8000"])[0].rsplit(":", 1)[1])
    eps = [
        {
            "addresses": [u.split("//")[1].rsplit(":", 1)[0]],
            "conditions": {"ready": True, "serving": True, "terminating": False},
        }
        for u in urls
    ]
    eps += [
        {
            "addresses": [u.split("//")[1].rsplit(":", 1)[0]],
            "conditions": {"ready": False, "serving": True, "terminating": True},
        }
        for u in terminating
    ]
    return {"metadata": {"name": f"{service}-{name}", "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": "http", "port": port}], "endpoints": eps}  # fmt: skip


def error(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def chat_pool(url: str, name: str = "chat", mode: Mode = Mode.CONTINUOUS) -> Any:
    p = pool(name, [url], engine=Engine.TRANSFORMERS, mode=mode)
    return p.model_copy(update={"family": ModelFamily.AUDIO_LM, "worker_model": AUDIO_LM_MODEL})


def assert_still_serving(fe: Frontend) -> None:
    r = fe.client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
    assert r.text == FIXTURE_TEXT


def assert_budget_released(gateway: Gateway, timeout: float = 10) -> None:
    """Every body the gateway held in memory was released. The answer reaches the client a
    moment before its request ends and lets go of what it held, so this waits for that (up to
    `timeout` seconds: longer on a machine busy with other suites)."""
    deadline = time.monotonic() + timeout
    while gateway.body_budget.bytes and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gateway.body_budget.bytes == 0, f"{gateway.body_budget.bytes} bytes still held"


def sse_events(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
