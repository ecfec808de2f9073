"""Interactive requests first (issue 21): the gateway marks long audio's chunks background
work (`PRIORITY_HEADER`), and the faster-whisper worker's lane batches interactive windows
ahead of them -- never beside them while one waits -- with a bound on how long background
work waits. The real lane, the real model (tiny.en), the real gateway over HTTP."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from testkit.audio import SENTENCES, speak, wer
from testkit.frontend import PRIMARY, Frontend, pool
from testkit.lanes import admit, watched_lane
from testkit.longaudio import Recording, long_recording
from testkit.standins import Behaviour, Running, serve, start, vllm_app
from transcription_api.frontend import ChunkingSpec
from transcription_api.routes import RouteTable
from transcription_api.worker import BACKGROUND, PRIORITY_HEADER, is_background
from transcription_worker.batcher import BACKGROUND_WAIT, Job, Lane
from transcription_worker.main import default_model
from transcription_worker.server import WorkerConfig, create_app
from transcription_worker.transcriber import Options, Transcriber
from transcription_worker.windows import Audio

NAMES = ["whisper-tiny.en", "whisper-1"]


@pytest.fixture(scope="module")
def transcriber() -> Transcriber:
    return Transcriber(default_model(), threads=2)


def silence(seconds: float) -> Audio:
    return np.zeros(int(seconds * 16000), dtype=np.float32)


def job(seconds: float, background: bool = False) -> Job:
    return Job(silence(seconds), Options(), background=background)


# ---- the mark, as both ends read it


@pytest.mark.parametrize(
    ("value", "background"),
    [
        ("background", True),
        (" Background ", True),
        (None, False),
        ("", False),
        ("interactive", False),
        ("low", False),
        ("background, urgent", False),
        ("-1", False),
    ],
)
def test_only_the_background_mark_makes_a_request_background(
    value: str | None, background: bool
) -> None:
    """A missing, unknown or malformed value is interactive: it never demotes a request,
    and is not a reason to refuse one."""
    assert is_background(value) is background
    assert PRIORITY_HEADER.lower() == PRIORITY_HEADER and is_background(BACKGROUND)


# ---- the lane's choice of the next batch (admitted, not decoded)


def next_batches(lane: Lane, jobs: list[Job], batches: int = 1) -> list[list[object]]:
    """The lane's next `batches` batches (windows left ready: interactive load that never
    stops), after admitting `jobs` in order."""

    async def main() -> list[list[object]]:
        await admit(lane, jobs)
        return [list(lane.next_batch()) for _ in range(batches)]

    return asyncio.run(main())


def test_an_interactive_window_is_batched_alone_ahead_of_older_background_windows(
    transcriber: Transcriber,
) -> None:
    chunk, other, short = job(75, background=True), job(75, background=True), job(4)
    lane = Lane(transcriber, max_queue=8, max_batch_size=4)
    [batch] = next_batches(lane, [chunk, other, short])
    assert chunk.windows and other.windows and short.windows
    assert len(chunk.windows) == len(other.windows) == 3 and len(short.windows) == 1
    # free slots and older windows ready, and still the short request's window alone
    assert batch == short.windows
    # once no interactive window waits, the background ones fill the batch, round-robin
    short.windows[0].done = True
    assert lane.next_batch() == [chunk.windows[0], other.windows[0], chunk.windows[1],
                                 other.windows[1]]  # fmt: skip

    # The same requests, none background: the oldest first, all in one batch (as before).
    a, b, c = job(75), job(75), job(4)
    [batch] = next_batches(Lane(transcriber, max_queue=8, max_batch_size=4), [a, b, c])
    assert a.windows and b.windows and c.windows
    assert batch == [a.windows[0], b.windows[0], c.windows[0], a.windows[1]]


def test_background_work_waits_at_most_background_wait_batches(
    transcriber: Transcriber,
) -> None:
    """Under interactive load that never stops, a background request with a window ready
    is passed over `background_wait` batches in a row, then batched (with the interactive
    windows, round-robin), then waits again."""
    assert Lane(transcriber, max_queue=1).background_wait == BACKGROUND_WAIT == 8
    chunk, a, b = job(75, background=True), job(75), job(75)
    lane = Lane(transcriber, max_queue=8, max_batch_size=2, background_wait=3)
    batches = next_batches(lane, [chunk, a, b], batches=8)
    assert chunk.windows and a.windows and b.windows
    with_chunk = [chunk.windows[0] in batch for batch in batches]
    assert with_chunk == [False, False, False, True] * 2
    assert batches[3] == [chunk.windows[0], a.windows[0]]  # its turn: first, it is oldest
    assert batches[0] == [a.windows[0], b.windows[0]]


def test_background_batches_are_one_window_while_interactive_requests_are_about(
    transcriber: Transcriber,
) -> None:
    """A CPU worker's lane (background_batch_size 1): with no interactive request about,
    background windows fill the batch (a long file alone loses nothing); once one has been
    admitted, and for `interactive_recent_s` after, a background batch is one window, the
    most a short request arriving during it waits for."""
    chunk, other = job(75, background=True), job(75, background=True)
    lane = Lane(transcriber, max_queue=8, max_batch_size=4, background_batch_size=1,
                interactive_recent_s=1.0)  # fmt: skip
    [full] = next_batches(lane, [chunk, other])
    assert chunk.windows and other.windows
    assert full == [chunk.windows[0], other.windows[0], chunk.windows[1], other.windows[1]]
    short = job(4)
    [batch] = next_batches(lane, [short])
    assert short.windows and batch == short.windows
    short.windows[0].done = True
    assert lane.next_batch() == [chunk.windows[0]]  # the short one's request still admitted
    lane.jobs.remove(short)  # (answered)
    assert lane.next_batch() == [chunk.windows[0]]  # one came just now: more may come
    time.sleep(1.1)
    assert len(lane.next_batch()) == 4


def test_a_sequential_lane_serves_the_oldest_interactive_request_first(
    transcriber: Transcriber,
) -> None:
    chunk, short, later = job(75, background=True), job(4), job(4)
    lane = Lane(transcriber, max_queue=8, sequential=True)
    [batch] = next_batches(lane, [chunk, short, later])
    assert short.windows and later.windows and chunk.windows
    assert batch == short.windows  # one request's windows, as before
    short.windows[0].done = later.windows[0].done = True
    assert lane.next_batch() == chunk.windows


# ---- the worker over HTTP: the header read, and a short request ahead of a long one


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speak(SENTENCES[0], tmp_path_factory.mktemp("short"))


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    """About 75 s of speech: three windows."""
    return long_recording(tmp_path_factory.mktemp("long"), 75, sentences=SENTENCES, seed=3)


def transcribe(worker: Running, audio: bytes, priority: str | None = None) -> httpx.Response:
    headers = {PRIORITY_HEADER: priority} if priority is not None else {}
    return httpx.post(f"{worker.url}/v1/audio/transcriptions", headers=headers,
                      data={"model": "whisper-1"}, files={"file": ("a.wav", audio)},
                      timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    ("priority", "background"),
    [("background", True), ("BACKGROUND", True), (None, False), ("urgent", False), ("", False)],
)
def test_the_worker_reads_the_header_and_takes_a_bad_value_as_interactive(
    transcriber: Transcriber, clip: Path, priority: str | None, background: bool
) -> None:
    lane, recorder = watched_lane(transcriber, max_queue=2)
    worker = start(create_app(WorkerConfig(served_names=NAMES, model_path="tiny.en"), lane))
    try:
        r = transcribe(worker, clip.read_bytes(), priority)
    finally:
        worker.stop()
    assert r.status_code == 200, r.text
    assert wer(SENTENCES[0], r.json()["text"]) <= 0.25
    assert recorder.batches == [[background]]


def test_a_short_request_goes_ahead_of_a_long_background_one(
    transcriber: Transcriber, clip: Path, recording: Recording
) -> None:
    """One window a batch: a short request that arrives while a chunk's first window
    decodes is the next batch, not the chunk's next window (round-robin from the oldest,
    as before, would take the chunk's); both come back right."""
    lane, recorder = watched_lane(transcriber, max_queue=2, max_batch_size=1)
    worker = start(create_app(WorkerConfig(served_names=NAMES, model_path="tiny.en"), lane))
    recorder.gate.clear()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            long = ex.submit(transcribe, worker, recording.wav.read_bytes(), BACKGROUND)
            wait_for(lambda: len(recorder.batches) == 1)  # its first window is decoding
            short = ex.submit(transcribe, worker, clip.read_bytes())
            wait_for(lambda: any(not j.background and j.windows for j in lane.jobs))
            recorder.gate.set()
            short_answer = short.result()
            assert not long.done()  # the short one did not wait for the long one
            long_answer = long.result()
    finally:
        recorder.gate.set()
        worker.stop()
    assert recorder.batches[:2] == [[True], [False]], recorder.batches
    assert all(b == [True] for b in recorder.batches[2:])
    assert wer(SENTENCES[0], short_answer.json()["text"]) <= 0.25
    assert wer(recording.text, long_answer.json()["text"]) <= 0.25


def wait_for(condition: object, timeout: float = 30) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# ---- the gateway: chunks marked, a client's own requests never


@pytest.fixture
def standin() -> Iterator[tuple[Frontend, Behaviour]]:
    worker = Behaviour()
    with serve(vllm_app([PRIMARY, "whisper-1"], worker)) as w:
        table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [w.url])])
        fe = Frontend(table, chunking=ChunkingSpec(max_parallel_chunks=2))
        yield fe, worker
        fe.running.stop()


def test_the_gateway_marks_every_chunk_background_and_no_client_request(
    standin: tuple[Frontend, Behaviour], recording: Recording
) -> None:
    fe, worker = standin
    r = fe.post({"model": "whisper-1", "chunking_strategy": "auto"}, recording.wav.read_bytes(),
                timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    assert len(worker.seen) >= 3
    assert all(s.headers.get(PRIORITY_HEADER) == BACKGROUND for s in worker.seen)
    worker.seen.clear()
    # An ordinary request is not marked, and a client cannot mark its own (nor pass on
    # any other value): the gateway does not forward a client's headers.
    for headers in ({}, {PRIORITY_HEADER: BACKGROUND}, {PRIORITY_HEADER: "urgent"}):
        r = fe.post({"model": "whisper-1"}, headers=headers)
        assert r.status_code == 200, r.text
    assert len(worker.seen) == 3
    assert all(PRIORITY_HEADER not in s.headers for s in worker.seen)
