"""Work in audio-seconds on one frontend replica (`transcription_frontend.work`): each
request's ticket through its stages, the decode meters, and the upload hook that counts
audio before the upload ends."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from testkit.audio import tone_wav
from transcription_api.errors import APIError
from transcription_api.multipart import FILE_HEAD, parse_upload
from transcription_frontend.work import (
    FADE,
    FORGET_SECONDS,
    MIN_SECONDS,
    PRIOR_SECONDS,
    SMOOTH_SECONDS,
    SPILLED,
    TAU,
    Stage,
    Ticket,
    Work,
    decode_rate,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stages(work: Work, pool: str) -> dict[str, float]:
    return {s: work.seconds(pool, s) for s in [*Stage, SPILLED] if work.seconds(pool, s)}


def at_worker(work: Work, seconds: float, url: str = "http://w:8000") -> Ticket:
    """A request of `seconds` of audio, at endpoint `url` of pool batch from now."""
    ticket = work.ticket()
    ticket.count(seconds, "batch")
    work.started(ticket, "batch", url, None)
    return ticket


def test_a_request_counts_for_its_pool_from_its_length_to_its_answer() -> None:
    work = Work()
    t = work.ticket()
    assert stages(work, "batch") == {}
    t.count(30.0, "batch")  # the header, while the upload arrives
    assert stages(work, "batch") == {"arriving": 30.0}
    t.count(29.5)  # known better once parsed: the same pool
    t.queued("batch")  # held: the pool has no worker
    assert stages(work, "batch") == {"queued": 29.5}
    # At a fallback pool's worker, in the preferred pool's place.
    work.started(t, "words", "http://w:8000", spilled_from="batch")
    assert stages(work, "words") == {"in_flight": 29.5}
    assert stages(work, "batch") == {"spilled": 29.5}
    work.ended(t, answered=True)
    t.close()
    t.close()  # twice: nothing more
    assert stages(work, "batch") == stages(work, "words") == {}
    gauge = REGISTRY.get_sample_value(
        "transcription_frontend_backlog_audio_seconds", {"pool": "batch", "stage": "spilled"}
    )
    assert gauge == 0


def test_the_level_is_the_audio_now_or_its_recent_average_when_higher() -> None:
    """What the autoscaler reads: a burst at once, a gap between batches bridged by the
    average, and nothing a few SMOOTH_SECONDS after the audio ended."""
    clock = Clock()
    work = Work(clock)
    assert work.level("batch") == 0
    first = at_worker(work, 4.0)
    assert work.level("batch") == 4.0  # at once: the level now, the average still rising
    clock.now += 2 * SMOOTH_SECONDS
    held = 4.0 * (1 - math.exp(-2))  # the average after 2 time constants at 4
    assert work.level("batch") == 4.0
    work.ended(first, answered=True)
    first.close()
    assert work.level("batch") == pytest.approx(held)  # the batch answered: a gap
    clock.now += 1.0
    assert work.level("batch") == pytest.approx(held * math.exp(-1 / SMOOTH_SECONDS))
    second = at_worker(work, 3.0)  # the client's next request, a second later
    assert work.level("batch") == 3.0
    work.ended(second, answered=True)
    second.close()
    clock.now += FADE * SMOOTH_SECONDS - 0.1
    assert 0 < work.level("batch") < 0.01 * held
    clock.now += 0.1
    assert work.level("batch") == 0  # exactly: the load has ended
    assert Work(clock, smooth=0).level("batch") == 0
    instant = Work(clock, smooth=0)
    t = at_worker(instant, 2.0)
    instant.ended(t, answered=True)
    t.close()
    assert instant.level("batch") == 0  # without an average: the level now


def test_short_or_silent_requests_count_a_second_and_a_closed_ticket_nothing() -> None:
    work = Work()
    t, u = work.ticket(), work.ticket()
    t.count(0.2, "batch")
    u.count(0.0, "batch")
    assert work.seconds("batch", "arriving") == 2 * MIN_SECONDS
    t.close()
    t.count(50, "batch")  # a late hook after the request ended
    assert work.seconds("batch", "arriving") == MIN_SECONDS
    u.close()
    assert work.seconds("batch", "arriving") == 0.0  # exactly: no float left behind


def test_the_busy_time_is_shared_among_the_requests_in_flight() -> None:
    """Two requests overlap at one endpoint: the endpoint was busy 4 s (not 2 + 3), and
    each request's share is added when it ends, with its audio."""
    clock = Clock()
    work = Work(clock)
    start = clock.now
    a = at_worker(work, 6)
    clock.now = start + 1
    b = at_worker(work, 4)
    clock.now = start + 2  # both running: nothing counts yet (a long request lowers no rate)
    assert work.sample("batch").busy == 0 and work.sample("batch").decoded == 0
    assert decode_rate([work.sample("batch")], prior=7) == 7
    clock.now = start + 3
    work.ended(a, answered=True)
    clock.now = start + 4
    work.ended(b, answered=True)
    s = work.sample("batch")
    f = math.exp(-1 / TAU)  # a's share and audio, counted a second earlier, have decayed
    assert s.busy == pytest.approx(2 * f + 2)  # 0-1 a alone; 1-3 half each; 3-4 b alone
    assert s.decoded == pytest.approx(6 * f + 4)
    assert s.window == pytest.approx(TAU * (1 - math.exp(-4 / TAU)))
    measured = s.decoded / s.busy
    assert measured == pytest.approx(2.5, rel=0.01)
    rate = REGISTRY.get_sample_value("transcription_frontend_decode_rate", {"pool": "batch"})
    assert rate == pytest.approx(measured)
    # With the default rate weighing as PRIOR_SECONDS of busy time.
    prior = decode_rate([s], prior=20)
    assert prior == pytest.approx((s.decoded + 20 * PRIOR_SECONDS) / (s.busy + PRIOR_SECONDS))


def test_the_measurement_decays_and_keeps_its_rate_then_is_forgotten() -> None:
    clock = Clock()
    work = Work(clock)
    t = at_worker(work, 10)
    clock.now += 2
    work.ended(t, answered=True)
    fresh = work.sample("batch")
    clock.now += TAU  # idle: both sums decay alike, the rate they give stays
    old = work.sample("batch")
    assert old.busy == pytest.approx(fresh.busy / math.e)
    assert old.decoded / old.busy == pytest.approx(fresh.decoded / fresh.busy) == 5
    clock.now += FORGET_SECONDS
    assert work.sample("batch").window == 0  # the endpoint's meter is gone


def test_a_refused_attempt_costs_busy_time_and_decodes_nothing() -> None:
    clock = Clock()
    work = Work(clock)
    t = at_worker(work, 10)
    clock.now += 1
    work.ended(t, answered=False)  # a 503: retried elsewhere
    work.started(t, "batch", "http://v:8000", None)
    clock.now += 2
    work.ended(t, answered=True)
    s = work.sample("batch")
    assert s.decoded == pytest.approx(10) and s.busy == pytest.approx(3, rel=0.02)


# --------------------------------------------------------------------------- the upload hook


def form(file: bytes) -> tuple[list[bytes], str]:
    head = (b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\n")  # fmt: skip
    body = head + file + b"\r\n--b--\r\n"
    return [
        body[i : i + 1000] for i in range(0, len(body), 1000)
    ], "multipart/form-data; boundary=b"


async def feed(chunks: list[bytes], seen: list[int], heads: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        seen.append(len(heads))  # how many heads had been handed out before this chunk
        yield chunk


def test_the_file_head_is_handed_out_once_as_soon_as_it_has_arrived() -> None:
    wav = tone_wav(10.0)  # 320 KB
    chunks, ctype = form(wav)
    heads: list[bytes] = []
    seen: list[int] = []
    upload = asyncio.run(
        parse_upload(feed(chunks, seen, heads), ctype, 10**7, on_file_head=heads.append)
    )
    assert heads == [wav[:FILE_HEAD]]
    # Handed out within the first few chunks, long before the upload ended.
    assert seen.index(1) <= FILE_HEAD // 1000 + 2 < len(chunks) // 10
    assert upload.size == len(wav)


def test_a_file_shorter_than_the_head_is_handed_out_whole_and_a_refused_one_never() -> None:
    short = tone_wav(0.05)
    chunks, ctype = form(short)
    heads: list[bytes] = []
    asyncio.run(parse_upload(feed(chunks, [], heads), ctype, 10**7, on_file_head=heads.append))
    assert heads == [short]
    big, ctype = form(tone_wav(10.0))
    heads.clear()
    with pytest.raises(APIError, match="too large"):
        asyncio.run(parse_upload(feed(big, [], heads), ctype, 2000, on_file_head=heads.append))
    assert heads == []  # over the limit before 4 KiB had arrived
