"""Hostile-client benchmark (issues 25 and 37): the frontend's peak resident memory under
hostile connections, with its default limits, while good requests keep coming.

The frontend process runs as the pod runs it (`transcription-frontend`, default limits,
a stand-in vLLM worker behind it). For `seconds` (40; 15 with --quick), 100 connections
at once, each reopened as soon as the gateway cuts it off:
- 34 send an endless header (64 KiB at a time; a 20 MB header took 25 MB each before),
- 33 send headers one byte a second (slow loris),
- 33 declare a 20 MB upload and send its body at 100 bytes/s;
and a good 0.5 s transcription is sent every 0.25 s. Reported: RSS before and at peak
(VmHWM and 10 ms samples), how the hostile connections were answered, and how many good
requests were served and how fast. Target: the peak stays under the frontend's default
memory limit (512 MiB) and every good request is served.

Realtime (issue 37; alone: `python -m bench hostile-realtime`): ten sessions at once, for
`seconds`, each sending the largest append the default limits allow
(`realtimeMaxAppendBytes`, 1 MiB: 21.8 s of 24 kHz PCM16 noise), half with server VAD (an
append, then a clear, waited for), half with manual commits (two appends, a commit, its
turn transcribed, waited for); then ten sessions that each send the
append of the finding (10 MB of base64), which is not read (close 1009); then the most
sessions a replica takes (`maxRealtimeSessions`, 100), each filling its buffer to
`realtimeMaxBufferSeconds` (60 s, 2.9 MB) with manual commits and holding it: 288 MB of
audio in all, past what `bufferedBodyBytes` (128 MiB) lets them hold, so the appends past it
are refused (`memory_budget_exceeded`) and the sessions go on. Targets: the appends' peak
stays under half the default memory limit (256 MiB), the full buffers' under the limit, and
good requests are all served.

Then connection exhaustion (issue 37): 2,100 connections (past the default 2,048
`maxConnections`) that keep sending partial headers, a byte a second, each reopened as soon
as the gateway answers or cuts it off, for `seconds` again:
- from one client address (127.0.0.1): its share is `maxConnectionsPerClient` (512); good
  requests from another address (127.0.0.2) are all served;
- spread over eight addresses (127.0.0.10-17, 263 each, within their share): together past
  `maxConnections`, so a good client beyond it is refused, with 503 and `Retry-After` in
  OpenAI's shape (before: uvicorn's plain text, and resets).

Then slot exhaustion (issue 37, finding 5; alone: `python -m bench hostile-slots`), on a
frontend with API keys: 260 uploads from one key, each declaring 20 MB and sending 1.3 kB
a second (above the 1 kB/s minimum rate), each reopened as soon as the gateway answers it,
while another key sends a good request every 0.25 s. Before `maxUploadsPerKey` they held
all 256 request slots for hours and every good request failed; now the key holds its 64,
the rest get 429 with `Retry-After`, and each held upload is cut by its deadline
(`bodyDeadlineBytesPerSecond`: about 21 minutes for 20 MB, past the run).

Then bodies held in memory (issue 37, finding 2; alone: `python -m bench hostile-bodies`):
ten 20 MB chat bodies and ten 20 MB uploads to an audio language model's pool at once.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import websockets

from testkit.audio import tone_wav
from transcription_api.frontend import FrontendLimits
from transcription_frontend.limits import body_deadline

from .common import (
    LIMIT_MIB,
    RESULTS,
    Proc,
    frontend_proc,
    pct,
    refusal,
    sampled,
    say,
    table,
    write,
)
from .frontend import routes, worker
from .hostile_bodies import bodies, bodies_table

BASE = 18760
CONNECTIONS = 100
EXHAUSTING = 2100  # connections of the exhaustion scenarios (the finding: past 2,048)
SLOW_UPLOADS = 260  # uploads of the slot exhaustion scenario (the finding: past 256 slots)
SLOW_RATE = 1300  # bytes/s each sends (the finding's 1.3 kB/s)
ATTACKER, GOOD_KEY = "k-attacker", "k-good"
GOOD_CLIENT = "127.0.0.2"
SESSIONS = 10  # realtime sessions of the append rows
FINDING_APPEND = 10_000_000  # base64 characters of the finding's append
HOLDING = 100  # sessions of the full-buffers row: maxRealtimeSessions' default


def frontend(port: int, route_file: Path) -> Proc:
    return frontend_proc(route_file, port, f"hostile-frontend-{port}")


def _status(data: bytes) -> str:
    parts = data.split(b" ", 2)
    return parts[1].decode() if len(parts) > 1 and data.startswith(b"HTTP/") else "closed"


def _attack(kind: str, port: int, stop: threading.Event, outcomes: Counter[str]) -> None:
    upload = (b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 20000000\r\n\r\n"
              b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF')  # fmt: skip
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.settimeout(0.05)
                if kind == "header":
                    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Junk: ")
                    chunk, pause = b"a" * 65536, 0.0
                elif kind == "loris":
                    s.sendall(b"GET /v1/models HTTP/1.1\r\n")
                    chunk, pause = b"x", 1.0
                else:
                    s.sendall(upload)
                    chunk, pause = b"\x00" * 100, 1.0
                data = b""
                while not stop.is_set():
                    try:
                        s.sendall(chunk)
                    except OSError:
                        break
                    try:
                        got = s.recv(65536)
                        if not got:
                            break
                        data += got
                    except TimeoutError:
                        pass
                    stop.wait(pause)
                if not stop.is_set():
                    try:
                        s.settimeout(2)
                        data += s.recv(65536)
                    except OSError:
                        pass
                    outcomes[f"{kind}: {_status(data)}"] += 1
        except OSError:
            outcomes[f"{kind}: refused"] += 1
            stop.wait(0.1)


async def _partial_headers(port: int, source: str, stop: threading.Event,
                           outcomes: Counter[str]) -> None:  # fmt: skip
    """One connection at a time from `source` that sends a header a byte a second, reopened
    as soon as the gateway answers or closes it; how each was answered is counted."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                           local_addr=(source, 0))  # fmt: skip
        except OSError:
            outcomes["connect failed"] += 1
            await asyncio.sleep(0.1)
            continue
        data = b""
        try:
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            while not stop.is_set():
                writer.write(b"x")
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), 1.0)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                data += chunk
        except OSError:
            outcomes["reset"] += 1
            continue
        finally:
            writer.close()
        if not stop.is_set():
            outcomes[_status(data)] += 1


def _exhaust(port: int, sources: list[str], stop: threading.Event,
             outcomes: Counter[str]) -> threading.Thread:  # fmt: skip
    """EXHAUSTING partial-header connections, spread over `sources`, in a thread of their own."""

    async def all_of_them() -> None:
        await asyncio.gather(*(_partial_headers(port, sources[i % len(sources)], stop, outcomes)
                               for i in range(EXHAUSTING)))  # fmt: skip

    thread = threading.Thread(target=asyncio.run, args=(all_of_them(),))
    thread.start()
    return thread


def _good_requests(url: str, wav: bytes, seconds: float, source: str = "127.0.0.1",
                   key: str | None = None) -> tuple[list[float], Counter[str]]:  # fmt: skip
    """A good transcription every 0.25 s for `seconds` (with `key`, if any): the latencies
    of those served, and how the others failed (a refusal counted by its error code and
    whether it had Retry-After)."""
    good: list[float] = []
    failed: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    transport = httpx.HTTPTransport(local_address=source)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(timeout=30, transport=transport, headers=headers) as c:
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            try:
                r = c.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                           files={"file": ("a.wav", wav)})  # fmt: skip
                if r.status_code == 200:
                    good.append(time.perf_counter() - t0)
                else:
                    failed[refusal(r)] += 1
            except httpx.HTTPError as e:
                failed[type(e).__name__] += 1
            time.sleep(0.25)
    return good, failed


def _append(audio: str) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio})


async def _expect(ws: Any, kind: str) -> None:
    while (event := json.loads(await asyncio.wait_for(ws.recv(), 120)))["type"] != kind:
        if event["type"] == "error":
            raise RuntimeError(event["error"]["message"])


async def _appending(url: str, audio: str, manual: bool, stop: threading.Event,
                     outcomes: Counter[str]) -> None:  # fmt: skip
    """One session sending the largest appends until `stop`: with server VAD, each followed
    by a clear; with manual commits, two then a commit whose turn is transcribed."""
    try:
        async with websockets.connect(url, max_size=None) as ws:
            await _expect(ws, "session.created")
            if manual:
                await ws.send(json.dumps({"type": "session.update", "session": {
                    "type": "transcription", "audio": {"input": {"turn_detection": None}}}}))  # fmt: skip
                await _expect(ws, "session.updated")
            while not stop.is_set():
                if manual:
                    await ws.send(_append(audio))
                    await ws.send(_append(audio))
                    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                    await _expect(ws, "conversation.item.done")
                    outcomes["turn transcribed"] += 1
                else:
                    await ws.send(_append(audio))
                    await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
                    await _expect(ws, "input_audio_buffer.cleared")
                    outcomes["append scored"] += 1
    except (OSError, RuntimeError, TimeoutError, websockets.WebSocketException) as e:
        outcomes[f"{type(e).__name__}: {e}"[:80]] += 1


async def _holding(url: str, parts: list[str], stop: threading.Event,
                   outcomes: Counter[str]) -> None:  # fmt: skip
    """One session with manual commits filling its buffer with `parts`, then holding it
    until `stop`: whether its appends were all taken."""
    manual = json.dumps({"type": "session.update", "session": {
        "type": "transcription", "audio": {"input": {"turn_detection": None}}}})  # fmt: skip
    try:
        async with websockets.connect(url, max_size=None) as ws:
            await _expect(ws, "session.created")
            await ws.send(manual)
            await _expect(ws, "session.updated")
            for part in parts:
                await ws.send(_append(part))
            await ws.send(manual)  # answered once every append before it is taken or refused
            refused = set()
            while (event := json.loads(await asyncio.wait_for(ws.recv(), 120)))["type"] != (
                "session.updated"
            ):
                if event["type"] == "error":
                    refused.add(event["error"]["code"])
            outcomes[f"append refused: {', '.join(sorted(refused))}" if refused
                     else "buffer filled"] += 1  # fmt: skip
            while not stop.is_set():  # noqa: ASYNC110 (set by another thread)
                await asyncio.sleep(0.2)
    except (OSError, TimeoutError, websockets.WebSocketException) as e:
        outcomes[f"{type(e).__name__}: {e}"[:80]] += 1


async def _all(sessions: Iterable[Coroutine[Any, Any, None]]) -> None:
    await asyncio.gather(*sessions)


async def _finding_append(url: str, audio: str, outcomes: Counter[str]) -> None:
    """One session sending the finding's append: how it was answered."""
    try:
        async with websockets.connect(url, max_size=None) as ws:
            await _expect(ws, "session.created")
            await ws.send(_append(audio))
            event = json.loads(await asyncio.wait_for(ws.recv(), 120))
            outcomes[f"event {event['type']}: {event.get('error', {}).get('code')}"] += 1
    except websockets.ConnectionClosed as e:
        outcomes[f"closed {e.rcvd.code if e.rcvd else None}"] += 1


def realtime(fe: Proc, url: str, wav: bytes, seconds: float) -> list[dict[str, Any]]:
    """The realtime rows: SESSIONS sessions of the largest appends for `seconds` while good
    requests are sent, then SESSIONS sessions of the finding's append."""
    ws_url = url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    size = FrontendLimits().realtime_max_append_bytes
    rng = np.random.default_rng(0)
    noise = rng.integers(-3000, 3000, size // 2, dtype="<i2").tobytes()
    largest = base64.b64encode(noise).decode()

    async def warm() -> None:  # the realtime modules and the VAD loaded, one append scored
        async with websockets.connect(ws_url, max_size=None) as ws:
            await _expect(ws, "session.created")
            await ws.send(_append(largest))
            await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
            await _expect(ws, "input_audio_buffer.cleared")

    asyncio.run(warm())

    def beside(sessions: Callable[[threading.Event, Counter[str]], Coroutine[Any, Any, Any]],
               seconds: float) -> Callable[[], tuple[list[float], Counter[str], Counter[str]]]:  # fmt: skip
        """Sessions in a thread of their own while good requests are sent for `seconds`;
        then `stop` is set for them."""

        def during() -> tuple[list[float], Counter[str], Counter[str]]:
            stop = threading.Event()
            outcomes: Counter[str] = Counter()
            thread = threading.Thread(target=asyncio.run, args=(sessions(stop, outcomes),))
            thread.start()
            try:
                good, failed = _good_requests(url, wav, seconds)
            finally:
                stop.set()
                thread.join(timeout=180)
            return good, failed, outcomes

        return during

    full = round(FrontendLimits().realtime_max_buffer_seconds * 24000 * 2)
    pcm = rng.integers(-3000, 3000, full // 2, dtype="<i2").tobytes()
    parts = [base64.b64encode(pcm[i : i + size]).decode() for i in range(0, full, size)]
    appending = beside(lambda stop, outcomes: _all(
        _appending(ws_url, largest, i % 2 == 1, stop, outcomes) for i in range(SESSIONS)),
        seconds)  # fmt: skip
    finding = beside(lambda _, outcomes: _all(
        _finding_append(ws_url, "A" * FINDING_APPEND, outcomes) for _ in range(SESSIONS)),
        min(seconds, 10.0))  # fmt: skip
    holding = beside(lambda stop, outcomes: _all(
        _holding(ws_url, parts, stop, outcomes) for _ in range(HOLDING)), seconds)  # fmt: skip

    rows = []
    for name, during in [(f"{SESSIONS} sessions appending the largest allowed appends "
                          f"({size} bytes)", appending),
                         (f"{SESSIONS} sessions sending the finding's {FINDING_APPEND // 10**6} "
                          "MB append", finding),
                         (f"{HOLDING} sessions each holding a full buffer (60 s, 2.9 MB) with "
                          "manual commits", holding)]:  # fmt: skip
        (good, failed, outcomes), rss = sampled(fe, during)
        rows.append({"scenario": name, **rss, "outcomes": dict(sorted(outcomes.items())),
                     "good_served": len(good), "good_failed": dict(failed),
                     "good_p50_ms": pct(good, 50) * 1000 if good else None})  # fmt: skip
    return rows


def realtime_table(rows: list[dict[str, Any]]) -> None:
    table("Realtime appends (default limits), a good request every 0.25 s",
          ["realtime", "RSS before MiB", "peak MiB", "after MiB", "sessions' outcomes",
           "good served", "good failed", "good p50 ms"],
          [[r["scenario"], r["rss_before_mib"], r["rss_peak_mib"], r["rss_after_mib"],
            ", ".join(f"{k}: {v}" for k, v in r["outcomes"].items()), r["good_served"],
            sum(r["good_failed"].values()), r["good_p50_ms"]] for r in rows])  # fmt: skip


def exhaustion(
    fe: Proc, url: str, wav: bytes, seconds: float, sources: list[str]
) -> dict[str, Any]:
    """EXHAUSTING partial-header connections from `sources` while a good client
    (GOOD_CLIENT) sends its requests."""

    def during() -> tuple[list[float], Counter[str], Counter[str]]:
        stop = threading.Event()
        outcomes: Counter[str] = Counter()
        thread = _exhaust(BASE, sources, stop, outcomes)
        try:
            time.sleep(min(5.0, seconds / 4))  # every connection open
            good, failed = _good_requests(url, wav, seconds, source=GOOD_CLIENT)
        finally:
            stop.set()
            thread.join(timeout=30)
        return good, failed, outcomes

    (good, failed, outcomes), rss = sampled(fe, during)
    return {
        "connections": EXHAUSTING,
        "clients": len(sources),
        "seconds": seconds,
        **rss,
        "hostile_outcomes": dict(sorted(outcomes.items())),
        "good_served": len(good),
        "good_failed": dict(failed),
        "good_p50_ms": pct(good, 50) * 1000 if good else None,
    }


async def _slow_upload(port: int, stop: threading.Event, held: list[int],
                       outcomes: Counter[str]) -> None:  # fmt: skip
    """One upload at a time from ATTACKER, declaring 20 MB and sending SLOW_RATE bytes a
    second, reopened as soon as the gateway answers it; how each was answered is counted,
    and `held[0]` those still sending after a second without an answer (in their slot)."""
    head = (b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer " + ATTACKER.encode() + b"\r\n"
            b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 20000000\r\n\r\n"
            b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF')  # fmt: skip
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            outcomes["connect failed"] += 1
            await asyncio.sleep(0.5)
            continue
        data = b""
        holding = False
        try:
            writer.write(head)
            while not stop.is_set() and not data:
                writer.write(b"\x00" * SLOW_RATE)
                try:
                    data = await asyncio.wait_for(reader.read(65536), 1.0)
                except TimeoutError:
                    if not holding:  # no answer within a second: it holds a slot
                        holding = True
                        held[0] += 1
                    continue
                if not data:
                    break
        except OSError:
            outcomes["reset"] += 1
            continue
        finally:
            if holding:
                held[0] -= 1
            writer.close()
        if not stop.is_set():
            outcomes[_status(data) if data else "closed"] += 1
            await asyncio.sleep(0.5)  # then again


def slots(seconds: float) -> dict[str, Any]:
    """SLOW_UPLOADS slow uploads from one key while another key's good requests come, on a
    frontend of its own (default limits, API keys)."""
    RESULTS.mkdir(exist_ok=True)
    keys = RESULTS / "keys-hostile"
    keys.write_text(f"{ATTACKER}\n{GOOD_KEY}\n")
    port = BASE + 2
    procs: list[Proc] = []
    try:
        w = worker(BASE + 3)
        procs.append(w)
        rf = routes(RESULTS / "routes-hostile-slots.json",
                    {"batch": [f"http://127.0.0.1:{BASE + 3}"]})  # fmt: skip
        fe = frontend_proc(rf, port, f"hostile-slots-{port}", api_keys_path=keys)
        procs.append(fe)
        url = f"http://127.0.0.1:{port}"
        wav = tone_wav(0.5)
        _good_requests(url, wav, 0.1, key=GOOD_KEY)  # warm

        def during() -> tuple[list[float], Counter[str], Counter[str], int]:
            stop = threading.Event()
            outcomes: Counter[str] = Counter()
            held = [0]

            async def all_of_them() -> None:
                await asyncio.gather(*(_slow_upload(port, stop, held, outcomes)
                                       for _ in range(SLOW_UPLOADS)))  # fmt: skip

            thread = threading.Thread(target=asyncio.run, args=(all_of_them(),))
            thread.start()
            try:
                time.sleep(min(5.0, seconds / 4))  # every upload under way
                good, failed = _good_requests(url, wav, seconds, key=GOOD_KEY)
                most = held[0]
            finally:
                stop.set()
                thread.join(timeout=30)
            return good, failed, outcomes, most

        (good, failed, outcomes, most), rss = sampled(fe, during)
    finally:
        for p in procs:
            p.stop()
    limits = FrontendLimits()
    cap = 26_214_400 + 1024**2  # the route table's upload limit and the body's overhead
    return {
        "uploads": SLOW_UPLOADS,
        "bytes_per_second": SLOW_RATE,
        "seconds": seconds,
        **rss,
        "uploads_open_at_end": most,
        "upload_deadline_seconds": round(body_deadline(20_000_000, cap, limits)),
        "hostile_outcomes": dict(sorted(outcomes.items())),
        "good_served": len(good),
        "good_failed": dict(failed),
        "good_p50_ms": pct(good, 50) * 1000 if good else None,
    }


def slots_table(r: dict[str, Any]) -> None:
    table(f"Slot exhaustion: {r['uploads']} uploads of 20 MB at {r['bytes_per_second']} B/s "
          f"from one key ({r['seconds']:g}s, default limits), good requests from another key",
          ["RSS before MiB", "peak MiB", "after MiB", "uploads open", "good served",
           "good failed", "good p50 ms", "upload cut after s"],
          [[r["rss_before_mib"], r["rss_peak_mib"], r["rss_after_mib"], r["uploads_open_at_end"],
            r["good_served"], ", ".join(f"{k}: {v}" for k, v in r["good_failed"].items()) or 0,
            r["good_p50_ms"], r["upload_deadline_seconds"]]])  # fmt: skip
    table("How the slow uploads were answered", ["answer", "count"],
          [[k, v] for k, v in r["hostile_outcomes"].items()])  # fmt: skip


def run_slots(quick: bool = False) -> dict[str, Any]:
    """The slot exhaustion scenario alone (`python -m bench hostile-slots`)."""
    seconds = 15.0 if quick else 40.0
    say(f"{SLOW_UPLOADS} slow uploads from one key for {seconds:g}s, good requests from another")
    result = slots(seconds)
    slots_table(result)
    write("hostile-slots", result)
    return result


def run_realtime(quick: bool = False) -> dict[str, Any]:
    """The realtime rows alone (`python -m bench hostile-realtime`)."""
    seconds = 15.0 if quick else 40.0
    procs: list[Proc] = []
    try:
        procs.append(worker(BASE + 1))
        rf = routes(RESULTS / "routes-hostile.json", {"batch": [f"http://127.0.0.1:{BASE + 1}"]})
        fe = frontend(BASE, rf)
        procs.append(fe)
        say(f"{SESSIONS} realtime sessions of the largest appends, then of the finding's, "
            f"then {HOLDING} holding full buffers")  # fmt: skip
        rows = realtime(fe, f"http://127.0.0.1:{BASE}", tone_wav(0.5), seconds)
    finally:
        for p in procs:
            p.stop()
    realtime_table(rows)
    result = {"seconds": seconds, "realtime": rows}
    write("hostile-realtime", result)
    return result


def run(quick: bool = False) -> dict[str, Any]:
    seconds = 15.0 if quick else 40.0
    procs: list[Proc] = []
    try:
        say("starting a stand-in worker and the frontend (default limits)")
        w = worker(BASE + 1)
        procs.append(w)
        rf = routes(RESULTS / "routes-hostile.json", {"batch": [f"http://127.0.0.1:{BASE + 1}"]})
        fe = frontend(BASE, rf)
        procs.append(fe)
        url = f"http://127.0.0.1:{BASE}"
        wav = tone_wav(0.5)
        with httpx.Client(timeout=30) as c:  # warm
            c.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                   files={"file": ("a.wav", wav)})  # fmt: skip
        stop = threading.Event()
        outcomes: Counter[str] = Counter()
        kinds = ["header", "loris", "body"]
        threads = [threading.Thread(target=_attack, args=(kinds[i % 3], BASE, stop, outcomes))
                   for i in range(CONNECTIONS)]  # fmt: skip
        say(f"{CONNECTIONS} hostile connections for {seconds:g}s, a good request every 0.25 s")

        def during() -> tuple[list[float], Counter[str]]:
            for t in threads:
                t.start()
            try:
                return _good_requests(url, wav, seconds)
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=10)

        (good, failed), rss = sampled(fe, during)
        say(f"{SESSIONS} realtime sessions of the largest appends, then of the finding's")
        appends = realtime(fe, url, wav, seconds)
        say(f"{EXHAUSTING} partial-header connections from one client, then from eight")
        one = exhaustion(fe, url, wav, seconds, ["127.0.0.1"])
        eight = exhaustion(fe, url, wav, seconds, [f"127.0.0.{10 + i}" for i in range(8)])
    finally:
        for p in procs:
            p.stop()
    say(f"{SLOW_UPLOADS} slow uploads from one key, good requests from another")
    slow = slots(seconds)
    held = bodies()
    peak = rss["rss_peak_mib"]
    result = {
        "connections": CONNECTIONS,
        "seconds": seconds,
        **rss,
        "hostile_outcomes": dict(sorted(outcomes.items())),
        "good_served": len(good),
        "good_failed": dict(failed),
        "good_p50_ms": pct(good, 50) * 1000 if good else None,
        "good_p99_ms": pct(good, 99) * 1000 if good else None,
        "realtime": appends,
        "exhaustion_one_client": one,
        "exhaustion_eight_clients": eight,
        "slot_exhaustion": slow,
        "bodies": held,
        "targets": {
            f"peak_under_{LIMIT_MIB}mib": max(
                peak, one["rss_peak_mib"], eight["rss_peak_mib"], slow["rss_peak_mib"]
            )
            < LIMIT_MIB,
            "every_good_request_served": bool(good) and not failed,
            f"realtime_appends_peak_under_{LIMIT_MIB // 2}mib": all(
                r["rss_peak_mib"] < LIMIT_MIB / 2 for r in appends[:2]
            ),
            f"realtime_full_buffers_peak_under_{LIMIT_MIB}mib": appends[2]["rss_peak_mib"]
            < LIMIT_MIB,
            "realtime_good_requests_served": all(
                r["good_served"] and not r["good_failed"] for r in appends
            ),
            "one_client_cannot_deny_another": bool(one["good_served"]) and not one["good_failed"],
            f"bodies_peak_under_{LIMIT_MIB // 2}mib": all(
                r["rss_peak_mib"] < LIMIT_MIB / 2 for r in held if r["default_limits"]
            ),
            "one_key_cannot_take_every_slot": bool(slow["good_served"]) and not slow["good_failed"],
            "refusals_are_503_with_retry_after": all(
                k.startswith("503 too_many_connections, Retry-After") for k in eight["good_failed"]
            ),
        },
    }
    table(f"Frontend under {CONNECTIONS} hostile connections ({seconds:g}s, default limits)",
          ["RSS before MiB", "peak MiB", "after MiB", "good served", "good failed", "good p50 ms", "good p99 ms"],
          [[rss["rss_before_mib"], peak, rss["rss_after_mib"], len(good),
            sum(failed.values()), result["good_p50_ms"], result["good_p99_ms"]]])  # fmt: skip
    table("How the hostile connections were answered", ["connection: answer", "count"],
          [[k, v] for k, v in result["hostile_outcomes"].items()])  # fmt: skip
    realtime_table(appends)
    table(f"Connection exhaustion: {EXHAUSTING} partial-header connections ({seconds:g}s, "
          f"default limits), a good client at {GOOD_CLIENT}",
          ["clients", "RSS before MiB", "peak MiB", "after MiB", "good served", "good failed",
           "good p50 ms"],
          [[r["clients"], r["rss_before_mib"], r["rss_peak_mib"], r["rss_after_mib"],
            r["good_served"], ", ".join(f"{k}: {v}" for k, v in r["good_failed"].items()) or 0,
            r["good_p50_ms"]] for r in (one, eight)])  # fmt: skip
    table("How the exhausting connections were answered", ["clients", "answer", "count"],
          [[r["clients"], k, v] for r in (one, eight) for k, v in r["hostile_outcomes"].items()])  # fmt: skip
    slots_table(slow)
    bodies_table(held)
    write("hostile", result)
    return result
