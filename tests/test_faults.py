"""Scale from zero and faults at the gateway, over real HTTP with stand-in workers:
requests held while a pool has no ready worker (and the bounds of that), workers that
die before or during their answer, hung workers, terminating endpoints, and SIGTERM."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.frontend import (
    FIXTURE_TEXT,
    PATIENCE,
    PRIMARY,
    SERVED,
    WAV,
    Frontend,
    assert_still_serving,
    error,
    sse_events,
    wait_until,
)
from testkit.frontend import pool as pool_route
from testkit.host import free_port
from testkit.processes import local_settings
from testkit.standins import Behaviour, RawWorker, Running, serve, vllm_app
from transcription_api.frontend import SETTINGS_ENV, FrontendSettings, HoldLimits, WorkerTimeouts
from transcription_api.routes import RouteTable

HELD = "transcription_frontend_held_requests"
REJECTIONS = "transcription_frontend_hold_rejections_total"


@pytest.fixture
def pool() -> Iterator[Callable[..., Frontend]]:
    """Frontends whose pool `batch` starts with the given endpoints (none: at zero)."""
    started: list[Frontend] = []

    def make(urls: list[str] | None = None, **gateway: Any) -> Frontend:
        table = RouteTable(
            model=PRIMARY, aliases=["whisper-1"], pools=[pool_route("batch", urls or [])]
        )
        started.append(Frontend(table, **gateway))
        return started[-1]

    yield make
    for fe in started:
        fe.running.stop()


@pytest.fixture
def ex() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(8) as executor:
        yield executor


# --------------------------------------------------------------------------- scale from zero


def test_a_pool_at_zero_holds_the_request_until_an_endpoint_appears(
    pool: Callable[..., Frontend], worker: tuple[Running, Behaviour],
    ex: concurrent.futures.ThreadPoolExecutor,
) -> None:  # fmt: skip
    fe = pool()
    # At zero the frontend is ready (it can hold) and the model is still listed.
    assert httpx.get(f"{fe.url}/ready").json() == {"status": "ready"}
    assert [m.id for m in fe.client.models.list()] == SERVED
    holds = fe.metric("transcription_frontend_hold_seconds_count", pool="batch")
    started = time.monotonic()
    held = ex.submit(
        lambda: fe.client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
    )
    wait_until(lambda: fe.metric(HELD, pool="batch") == 1, what="the request to be held")
    load = httpx.get(f"{fe.url}/internal/load").json()["pools"]["batch"]
    counts = {k: v for k, v in load.items() if isinstance(v, int)}
    assert counts == {"in_flight": 0, "held": 1, "spilled": 0, "sessions": 0}
    assert load["audio"]["queued"] == 1.0  # its half second of audio, counted as one
    time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))  # the pool scales up: 2 s
    assert not held.done()
    appeared = time.monotonic()
    fe.endpoints("batch", [worker[0].url])
    assert held.result(timeout=PATIENCE).text == FIXTURE_TEXT
    # Woken by the discovery event itself, not by a polling loop.
    assert time.monotonic() - appeared < 0.5
    assert fe.metric(HELD, pool="batch") == 0
    assert fe.metric("transcription_frontend_hold_seconds_count", pool="batch") == holds + 1
    assert_still_serving(fe)


def test_hold_bounds_answer_503_with_retry_after_naming_the_bound(
    pool: Callable[..., Frontend], worker: tuple[Running, Behaviour],
    ex: concurrent.futures.ThreadPoolExecutor,
) -> None:  # fmt: skip
    fe = pool(hold=HoldLimits(max_requests=1, max_bytes=3 * len(WAV), timeout_seconds=1.0))
    before = {r: fe.metric(REJECTIONS, pool="batch", reason=r) for r in ("requests", "bytes", "timeout")}  # fmt: skip
    first = ex.submit(fe.post, {"model": PRIMARY})
    wait_until(lambda: fe.metric(HELD, pool="batch") == 1, what="the first request held")
    # count: one request may wait per pool
    r = fe.post({"model": PRIMARY})
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert "1 request(s) already wait for one, the limit of held requests per pool" in error(r)["message"]  # fmt: skip
    # time: the first one gave up after its second
    r = first.result(timeout=PATIENCE)
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    e = error(r)
    assert (e["type"], e["code"]) == ("service_unavailable", "no_ready_worker")
    assert e["message"] == (
        "pool batch had no ready worker within 1 s, the limit of time a request is held "
        "while its pool scales up; retry later"
    )
    # bytes: this upload alone is over the bytes all held uploads may take
    r = fe.post({"model": PRIMARY}, file=WAV * 4)
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert f"would exceed {3 * len(WAV)} bytes, the limit of held upload bytes" in error(r)["message"]  # fmt: skip
    for reason in ("requests", "bytes", "timeout"):
        assert fe.metric(REJECTIONS, pool="batch", reason=reason) == before[reason] + 1
    assert fe.metric(HELD, pool="batch") == 0
    fe.endpoints("batch", [worker[0].url])
    assert_still_serving(fe)


def test_a_client_that_leaves_while_held_is_dropped_from_the_hold(
    pool: Callable[..., Frontend], worker: tuple[Running, Behaviour]
) -> None:
    fe = pool(hold=HoldLimits(max_requests=1))
    fe.hang_up({"model": PRIMARY}, reached=lambda: fe.metric(HELD, pool="batch") == 1)
    wait_until(lambda: fe.metric(HELD, pool="batch") == 0, what="the hold to drop the request")
    assert httpx.get(f"{fe.url}/internal/load").json()["pools"]["batch"]["held"] == 0
    # Its place is free again (the limit is one), and nothing reached a worker.
    fe.endpoints("batch", [worker[0].url])
    assert_still_serving(fe)
    assert len(worker[1].seen) == 1


# --------------------------------------------------------------------------- worker faults


def test_a_worker_that_closes_before_answering_is_retried_elsewhere(
    pool: Callable[..., Frontend], worker: tuple[Running, Behaviour]
) -> None:
    killed = RawWorker("close")
    try:
        fe = pool([killed.url, worker[0].url])
        retries = fe.metric("transcription_frontend_retries_total", pool="batch")
        for _ in range(4):
            r = fe.client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
            assert r.text == FIXTURE_TEXT
        assert killed.connections >= 1
        assert fe.metric("transcription_frontend_retries_total", pool="batch") >= retries + 1
    finally:
        killed.stop()


def test_the_only_worker_dying_holds_the_request_until_another_is_ready(
    pool: Callable[..., Frontend], worker: tuple[Running, Behaviour],
    ex: concurrent.futures.ThreadPoolExecutor,
) -> None:  # fmt: skip
    """It closes the request's connection, then is gone (its port refuses), still listed:
    the request keeps trying it, with a backoff, and is held, until discovery lists the
    replacement."""
    killed = RawWorker("close")
    try:
        fe = pool([killed.url])
        pending = ex.submit(fe.post, {"model": PRIMARY})
        wait_until(lambda: killed.connections >= 1, what="the first try")
        killed.stop()
        wait_until(lambda: fe.metric(HELD, pool="batch") == 1, what="the request to be held")
        fe.endpoints("batch", [worker[0].url])  # the pod restarted elsewhere
        r = pending.result(timeout=PATIENCE)
        assert r.status_code == 200 and r.json()["text"] == FIXTURE_TEXT
    finally:
        killed.stop()


def test_the_only_worker_failing_once_is_tried_again_without_waiting_for_discovery(
    pool: Callable[..., Frontend], ex: concurrent.futures.ThreadPoolExecutor
) -> None:
    """The pool's one endpoint closes a connection before answering, and stays listed and
    ready: no discovery change is coming, so the request is not held until one is (until
    the hold's timeout, 5 s here): it tries the endpoint again after a backoff."""
    flaky = RawWorker("close")
    try:
        fe = pool([flaky.url], hold=HoldLimits(timeout_seconds=5))
        pending = ex.submit(fe.post, {"model": PRIMARY})
        wait_until(lambda: flaky.connections >= 1, what="the first try")
        flaky.mode = "answer"  # the worker is fine again; its endpoint never changed
        r = pending.result(timeout=PATIENCE)
        assert r.status_code == 200 and r.json()["text"] == FIXTURE_TEXT
        assert 2 <= flaky.connections <= 3
    finally:
        flaky.stop()


def test_the_only_worker_closing_every_connection_fails_the_request_after_three_tries(
    pool: Callable[..., Frontend], worker: tuple[Running, Behaviour]
) -> None:
    """A worker listed and ready that closes every connection: three tries (backing off),
    then 503 naming what the worker did, not the hold's timeout (30 s here) running out."""
    broken = RawWorker("close")
    try:
        fe = pool([broken.url], hold=HoldLimits(timeout_seconds=30))
        r = fe.post({"model": PRIMARY})
        assert r.status_code == 503, r.text
        assert error(r)["message"] == (
            "no worker could take the request (pools: batch): a worker of pool batch failed "
            "before answering (ServerDisconnectedError)"
        )
        assert broken.connections == 3
        fe.endpoints("batch", [worker[0].url])  # discovery replaces it
        assert_still_serving(fe)
    finally:
        broken.stop()


def test_a_worker_killed_mid_answer_is_retried_since_no_byte_reached_the_client(
    pool: Callable[..., Frontend], worker: tuple[Running, Behaviour]
) -> None:
    cut = RawWorker("partial")
    try:
        fe = pool([cut.url, worker[0].url])
        for _ in range(4):
            r = fe.post({"model": PRIMARY})
            assert r.status_code == 200 and r.json() == {"text": FIXTURE_TEXT, "usage": r.json()["usage"]}  # fmt: skip
        assert cut.connections >= 1
    finally:
        cut.stop()


def test_a_stream_cut_before_its_first_event_is_retried(
    pool: Callable[..., Frontend], worker: tuple[Running, Behaviour]
) -> None:
    b = Behaviour(cut_stream_after=0)
    with serve(vllm_app(SERVED, b)) as cut:
        fe = pool([cut.url, worker[0].url])
        for _ in range(4):
            events = sse_events(fe.post({"model": PRIMARY, "stream": "true"}))
            assert events[-1]["type"] == "transcript.text.done"
            assert events[-1]["text"] == FIXTURE_TEXT
        assert b.seen  # it was tried


def test_a_stream_cut_mid_way_ends_with_an_error_event(
    pool: Callable[..., Frontend], worker: tuple[Running, Behaviour]
) -> None:
    worker[1].cut_stream_after = 2
    fe = pool([worker[0].url])
    r = fe.post({"model": PRIMARY, "stream": "true"})
    assert r.status_code == 200  # the stream had begun: its end says what happened
    events = sse_events(r)
    assert [e["type"] for e in events] == ["transcript.text.delta"] * 2 + ["error"]
    err = events[-1]["error"]
    assert (err["type"], err["code"]) == ("server_error", "worker_error")
    assert "its stream broke off: ClientPayloadError" in err["message"]
    worker[1].cut_stream_after = None
    assert_still_serving(fe)


def test_a_hung_worker_times_out_with_504_and_is_not_retried(
    pool: Callable[..., Frontend], worker: tuple[Running, Behaviour]
) -> None:
    hung = RawWorker("silent")
    try:
        fe = pool([hung.url], worker_timeouts=WorkerTimeouts(read_seconds=1.0))
        started = time.monotonic()
        r = fe.post({"model": PRIMARY})
        assert 0.9 < time.monotonic() - started < 5
        assert r.status_code == 504
        e = error(r)
        assert (e["type"], e["code"]) == ("server_error", "worker_timeout")
        assert "worker of pool batch sent nothing for longer than" in e["message"]
        assert hung.url.split("//")[1] not in e["message"]  # addresses go to the log only
        assert hung.connections == 1  # it may still be working on it: not sent twice
    finally:
        hung.stop()


def test_a_stream_that_stalls_ends_with_an_error_event_after_the_read_timeout(
    pool: Callable[..., Frontend],
) -> None:
    hung = RawWorker("stall")
    try:
        fe = pool([hung.url], worker_timeouts=WorkerTimeouts(read_seconds=1.0))
        started = time.monotonic()
        events = sse_events(fe.post({"model": PRIMARY, "stream": "true"}))
        assert 0.9 < time.monotonic() - started < 5
        assert [e["type"] for e in events] == ["transcript.text.delta", "error"]
        assert "its stream sent nothing for longer than the worker read timeout" in events[-1]["error"]["message"]  # fmt: skip
    finally:
        hung.stop()


def test_a_terminating_endpoint_finishes_its_requests_and_gets_no_new_ones(
    pool: Callable[..., Frontend], ex: concurrent.futures.ThreadPoolExecutor
) -> None:
    old_b, new_b = Behaviour(delay=1.5), Behaviour()
    with serve(vllm_app(SERVED, old_b)) as old, serve(vllm_app(SERVED, new_b)) as new:
        fe = pool([old.url])
        in_flight = ex.submit(fe.post, {"model": PRIMARY})
        wait_until(lambda: old_b.in_flight == 1, what="a request at the old worker")
        fe.endpoints("batch", [new.url], terminating=[old.url])  # old pod is deleted
        wait_until(lambda: fe.router.endpoints("batch") == [new.url], what="discovery")
        for _ in range(3):
            assert fe.post({"model": PRIMARY}).status_code == 200
        assert (len(old_b.seen), len(new_b.seen)) == (1, 3)
        assert in_flight.result(timeout=PATIENCE).status_code == 200  # finished, not cut


# --------------------------------------------------------------------------- SIGTERM


def run_frontend(routes: Path, port: int, **settings: Any) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "transcription_frontend.main", "--routes", str(routes),
         "--log-level", "warning"],
        env={**os.environ, SETTINGS_ENV: local_settings(port, **settings).to_env()},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    wait_until(lambda: _up(port), timeout=30, what="the frontend to start")
    return proc


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    except httpx.TransportError:
        return False


def write_routes(path: Path, urls: list[str]) -> None:
    new = path.with_suffix(".new")
    new.write_text(RouteTable(model=PRIMARY, pools=[pool_route("batch", urls)]).dumps())
    os.replace(new, path)  # as kubelet swaps a ConfigMap volume


def held_on(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(HELD + "{"))  # fmt: skip


def test_sigterm_forwards_held_requests_and_finishes_those_in_flight(
    tmp_path: Path, ex: concurrent.futures.ThreadPoolExecutor
) -> None:
    slow_b = Behaviour(delay=2.0)
    with serve(vllm_app(SERVED, slow_b)) as slow:
        routes, port = tmp_path / "routes.json", free_port()
        write_routes(routes, [])
        proc = run_frontend(routes, port, shutdown_grace_seconds=10)
        try:
            url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"
            held = ex.submit(httpx.post, url, files={"file": ("a.wav", WAV)},
                             data={"model": PRIMARY}, timeout=30)  # fmt: skip
            wait_until(lambda: held_on(port) == 1, what="the request to be held")
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda: not _up(port), what="the frontend to stop accepting")
            write_routes(routes, [slow.url])  # a worker becomes ready during the shutdown
            r = held.result(timeout=PATIENCE)  # forwarded, then in flight for 2 s, then answered
            assert r.status_code == 200 and r.json()["text"] == FIXTURE_TEXT
            assert proc.wait(timeout=PATIENCE) in (0, -signal.SIGTERM)  # uvicorn re-raises it
        finally:
            proc.kill()


def test_sigterm_answers_what_no_worker_takes_before_the_grace_period_ends(
    tmp_path: Path, ex: concurrent.futures.ThreadPoolExecutor
) -> None:
    routes, port = tmp_path / "routes.json", free_port()
    write_routes(routes, [])
    proc = run_frontend(routes, port, shutdown_grace_seconds=3)
    try:
        url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"
        held = ex.submit(httpx.post, url, files={"file": ("a.wav", WAV)},
                         data={"model": PRIMARY}, timeout=30)  # fmt: skip
        wait_until(lambda: held_on(port) == 1, what="the request to be held")
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        r = held.result(timeout=PATIENCE)
        assert time.monotonic() - stopped < 3  # answered within the grace period
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "before this frontend replica shut down; retry" in error(r)["message"]
        assert proc.wait(timeout=PATIENCE) in (0, -signal.SIGTERM)
    finally:
        proc.kill()


def test_sigterm_ends_each_kept_alive_connection_after_an_answer_never_under_a_request(
    tmp_path: Path,
) -> None:
    """A client between two requests on a kept-alive connection (as an SDK is) when the
    frontend gets SIGTERM: the connection stays open, its next request is answered with
    `Connection: close`, and then the frontend exits without waiting out the window.
    Closing idle connections at once would race the client's next request: a reset
    (seen in the e2e frontend rollout, through kube-proxy)."""
    with serve(vllm_app(SERVED, Behaviour())) as worker:
        routes, port = tmp_path / "routes.json", free_port()
        write_routes(routes, [worker.url])
        proc = run_frontend(routes, port, shutdown_grace_seconds=10)
        url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"
        try:
            with httpx.Client(timeout=PATIENCE) as http:

                def post() -> httpx.Response:
                    return http.post(url, files={"file": ("a.wav", WAV)}, data={"model": PRIMARY})

                first = post()
                assert first.status_code == 200 and "connection" not in first.headers
                proc.send_signal(signal.SIGTERM)
                time.sleep(1.0)  # uvicorn alone closes idle connections within 0.1 s
                last = post()  # on the same connection: a new one would be refused
                stopped = time.monotonic()
                assert last.status_code == 200 and last.json()["text"] == FIXTURE_TEXT
                assert last.headers["connection"] == "close"
                assert proc.wait(timeout=PATIENCE) in (0, -signal.SIGTERM)
                assert time.monotonic() - stopped < 3  # not the whole 5 s window
                with pytest.raises(httpx.ConnectError):
                    post()
        finally:
            proc.kill()


def test_a_busy_scaler_port_stops_the_frontend_with_a_clear_error(tmp_path: Path) -> None:
    import socket

    routes, port = tmp_path / "routes.json", free_port()
    write_routes(routes, [])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "transcription_frontend.main", "--routes", str(routes)],
            env={**os.environ, SETTINGS_ENV: local_settings(port, scaler_port=busy).to_env()},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 3
    assert f"cannot serve KEDA's external scaler on 127.0.0.1:{busy}" in out.stderr
    assert "scaler_port" in out.stderr


@pytest.mark.parametrize(
    ("settings", "field"),
    [({"hold": {"timeout_seconds": 0}}, "hold.timeout_seconds"),
     ({"hold": {"max_requests": -1}}, "hold.max_requests"),
     ({"hold": {"max_bytes": 0}}, "hold.max_bytes"),
     ({"worker_timeouts": {"read_seconds": 0}}, "worker_timeouts.read_seconds"),
     ({"shutdown_grace_seconds": 0}, "shutdown_grace_seconds")],
)  # fmt: skip
def test_bad_bounds_are_refused_at_start(
    settings: dict[str, Any], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from transcription_frontend.main import main

    monkeypatch.setenv(SETTINGS_ENV, json.dumps(settings))
    assert main(["--routes", str(tmp_path / "routes.json")]) == 2  # before the route table
    err = capsys.readouterr().err
    assert (
        f"error: {SETTINGS_ENV} is not valid frontend settings: {field}: Input should be greater than"
        in err
    )
    defaults = FrontendSettings()
    assert (defaults.scaler_port, defaults.peers_service, defaults.hold.max_requests,
            defaults.hold.max_bytes, defaults.hold.timeout_seconds,
            defaults.shutdown_grace_seconds) == (9090, None, 100, 1024**3, 300.0, 30)  # fmt: skip
