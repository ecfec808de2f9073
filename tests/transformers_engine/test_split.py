"""One resource, no manual step: the operator's plan and route table, the launcher, a real
`transformers serve --continuous-batching` and a real faster-whisper worker, and the
frontend routing each request to a pool whose capabilities cover it.

transformers serve (5.24) transcribes Whisper in continuous mode but has no translations
route and no segments; the operator adds `auto-faster-whisper` for the declared
translations, and the frontend sends segment formats there too.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from testkit.audio import SENTENCES, speak, wer
from testkit.host import free_port
from testkit.processes import BIN, frontend, start, with_endpoints
from testkit.resources import make_td
from testkit.transformers_serve import WHISPER, Server, launch
from transcription_api.capabilities import Engine, Mode
from transcription_api.routes import RouteTable
from transcription_api.v1alpha1 import TranscriptionDeployment
from transcription_api.worker import SETTINGS_ENV
from transcription_operator.children import route_table, worker_settings
from transcription_operator.plan import plan
from transcription_worker.hf_whisper import default_source

SPEC: dict[str, Any] = {
    "model": {"name": WHISPER, "aliases": ["whisper-1"]},
    "engine": "transformers",
    "pools": [{"name": "batch", "mode": "continuous"}],
    "traffic": {"endpoints": ["transcriptions", "translations"], "features": ["stream"]},
}


@pytest.fixture(scope="module")
def deployment(
    checkpoints: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TranscriptionDeployment, RouteTable, openai.OpenAI, str]]:
    """Workers started from the operator's own settings; each finds `whisper-tiny.en` in its
    working directory in its own format, as each image bakes it."""
    td = make_td(SPEC)
    the_plan = plan(td.spec)
    table = route_table(td, the_plan)
    d = tmp_path_factory.mktemp("split")
    procs: list[subprocess.Popen[bytes]] = []
    urls = {}
    try:  # what started is stopped, also when a later process fails to start
        for pool in the_plan.pools:
            settings = worker_settings(td, pool).model_copy(update={"port": free_port()})
            if pool.engine == Engine.TRANSFORMERS:
                s = launch(settings, checkpoints, d / f"{pool.name}.log")
                procs.append(s.proc)
            else:
                ct2 = d / "ct2"
                ct2.mkdir()
                (ct2 / WHISPER).symlink_to(default_source())
                procs.append(start([str(BIN / "transcription-worker")], d / f"{pool.name}.log",
                                   f"http://127.0.0.1:{settings.port}/health", cwd=ct2,
                                   env={SETTINGS_ENV: settings.to_env()}))  # fmt: skip
            urls[pool.name] = f"http://127.0.0.1:{settings.port}"
        url, fe = frontend(with_endpoints(table, urls), d)
        procs.append(fe)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        yield td, table, client, url
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return speak(SENTENCES[1], tmp_path_factory.mktemp("speech")).read_bytes()


def served_by(url: str, endpoint: str, pool: str) -> float:
    """Requests the frontend counted for (endpoint, pool), from its /metrics."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("transcription_frontend_requests_total{") and \
                f'endpoint="{endpoint}"' in line and f'pool="{pool}"' in line:  # fmt: skip
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_operator_adds_faster_whisper_for_translations_only(deployment: Any) -> None:
    td, table, _, _ = deployment
    assert [(p.name, p.engine, p.mode, p.automatic) for p in plan(td.spec).pools] == [
        ("batch", Engine.TRANSFORMERS, Mode.CONTINUOUS, False),
        ("auto-faster-whisper", Engine.FASTER_WHISPER, Mode.SEQUENTIAL, True),
    ]
    assert plan(td.spec).automatic[0].reason == "added for traffic needing stream, translations"
    # transformers serve has no aliases: the frontend must send the name it loaded.
    assert [(p.name, p.worker_model) for p in table.pools] == [
        ("batch", WHISPER), ("auto-faster-whisper", None)]  # fmt: skip


def test_transcriptions_go_to_transformers_in_every_plain_text_format(
    deployment: Any, wav: bytes
) -> None:
    _, _, client, url = deployment
    create = client.audio.transcriptions.create
    r = create(model="whisper-1", file=("a.wav", wav))
    assert wer(SENTENCES[1], r.text) == 0
    # `text` is rendered by the frontend from transformers' {"text"}.
    text = create(model="whisper-1", file=("a.wav", wav), response_format="text")
    assert text == r.text.strip() + "\n"
    events = list(create(model="whisper-1", file=("a.wav", wav), stream=True))
    assert events[-1].type == "transcript.text.done"
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) > 3 and "".join(deltas) == events[-1].text == r.text
    assert served_by(url, "transcriptions", "batch") == 3


def test_what_transformers_lacks_goes_to_the_automatic_pool(deployment: Any, wav: bytes) -> None:
    _, _, client, url = deployment
    tr = client.audio.translations.create(model="whisper-1", file=("a.wav", wav))
    assert wer(SENTENCES[1], tr.text) <= 0.2
    assert served_by(url, "translations", "auto-faster-whisper") == 1
    srt = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav),
                                             response_format="srt")  # fmt: skip
    assert srt.startswith("1\n00:00:00,000 --> ")
    assert served_by(url, "transcriptions", "auto-faster-whisper") == 1


def test_a_bare_500_becomes_an_openai_error_and_serving_goes_on(
    deployment: Any, wav: bytes
) -> None:
    _, _, client, url = deployment
    # An mp3 frame header passes the frontend's sniffing; transformers cannot decode the rest.
    r = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                   files={"file": ("a.mp3", b"\xff\xfb\x90" + b"\x00" * 64)}, timeout=60)  # fmt: skip
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert "transformers worker of pool batch" in error["message"]
    assert wer(SENTENCES[1], client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", wav)).text) == 0  # fmt: skip


def test_frontend_sends_the_worker_model_of_a_baked_in_checkpoint(
    checkpoints: Path, tmp_path: Path, wav: bytes
) -> None:
    """Weights baked into the image: the worker loads /models/..., clients say whisper-1."""
    td = make_td({**SPEC, "model": {"name": WHISPER, "aliases": ["whisper-1"], "source": "image",
                                    "path": str(checkpoints / WHISPER)},
                  "traffic": {"endpoints": ["transcriptions"]}})  # fmt: skip
    the_plan = plan(td.spec)
    settings = worker_settings(td, the_plan.pools[0]).model_copy(update={"port": free_port()})
    server: Server = launch(settings, tmp_path, tmp_path / "worker.log")
    try:
        table = route_table(td, the_plan)
        assert table.pools[0].worker_model == str(checkpoints / WHISPER)
        url, fe = frontend(with_endpoints(table, {"batch": server.url}), tmp_path)
        try:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            r = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav))
            assert wer(SENTENCES[1], r.text) == 0
        finally:
            fe.terminate()
            fe.wait(timeout=30)
    finally:
        server.stop()
