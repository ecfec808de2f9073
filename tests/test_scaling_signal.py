"""Issue 34's flapping case: four steady clients on a busy node, where uploading and parsing
take as long as decoding. Scaled on the requests at its workers, the pool flapped 2 -> 1 ->
2 -> 1: half of each request's life is spent where that count does not see it. Scaled on
its audio, counted from the file's header while the upload arrives, it settles at 2 and
stays there. The frontend's accounting runs for real on a virtual clock; the clients,
workers and HPA are modelled (testkit/autoscaling.py)."""

from __future__ import annotations

import statistics

import pytest

from testkit.autoscaling import Clients, Hpa, Signal, desired, simulate


def test_the_hpa_formula_keeps_the_count_within_its_tolerance() -> None:
    assert desired(2, 2.1, 1, 0.1) == 2  # 5 % over: within the tolerance
    assert desired(2, 2.3, 1, 0.1) == 3
    assert desired(2, 1.7, 1, 0.1) == 2  # ceil(1.7)
    assert desired(2, 0.9, 1, 0.1) == 1
    assert desired(0, 0.5, 1, 0.1) == 1


def test_scaled_on_requests_at_the_workers_the_pool_flaps() -> None:
    run = simulate(Signal.REQUESTS, seconds=600)
    assert run.changes >= 10, run.replicas
    assert set(run.after(60)) == {1, 2}


def test_scaled_on_its_audio_the_pool_settles_at_two_and_stays() -> None:
    run = simulate(Signal.AUDIO, seconds=600)
    assert run.changes <= 1, run.replicas
    assert set(run.after(30)) == {2}, run.replicas
    # The metric is steady: the same four requests' audio, wherever they are.
    late = run.values[len(run.values) // 2 :]
    assert max(late) - min(late) < 0.05 * statistics.mean(late)


def test_counting_the_audio_only_after_the_upload_hides_half_the_work() -> None:
    """What counting from the header, while the upload arrives, buys: without it the same
    metric misses the uploads and leaves the pool at one saturated replica."""
    after = simulate(Signal.AUDIO_AFTER_UPLOAD, seconds=600)
    during = simulate(Signal.AUDIO, seconds=600)
    assert set(after.after(30)) == {1}
    assert len(during.latencies) > 1.25 * len(after.latencies)  # requests answered


@pytest.mark.parametrize("decode", [0.5, 1.5, 3.0])
def test_the_audio_signal_is_steady_at_any_decode_speed(decode: float) -> None:
    """Faster or slower workers change how many replicas the work needs, not whether the
    count holds still."""
    run = simulate(Signal.AUDIO, Clients(decode=decode), Hpa(max_replicas=4), seconds=600)
    assert len(set(run.after(120))) == 1, run.replicas


def test_a_batching_pools_gaps_between_answers_are_bridged_by_the_levels_average() -> None:
    """Issue 36's e2e flapping: four clients of a continuous pool get their answers
    together and send their next requests seconds later, so the audio now is nothing for
    most of each cycle. Read at those moments twice within the scale-down window, it removes
    the replica the load needs; the level (the recent average when higher) holds the pool
    at two replicas from the first reading on."""
    clients = Clients(count=4, audio_seconds=3.4, upload=0.1, parse=0.1, decode=0.6, think=4.0,
                      batch=True, stagger=0.0)  # fmt: skip
    hpa = Hpa(target_queue_seconds=0.1, default_rate=4, ready_after=60)
    now = simulate(Signal.AUDIO_NOW, clients, hpa, seconds=600)
    assert now.changes >= 4 and set(now.after(60)) == {1, 2}, now.replicas
    assert 0 in now.values
    level = simulate(Signal.AUDIO, clients, hpa, seconds=600)
    assert level.changes == 0 and set(level.replicas) == {2}, level.replicas
    assert min(level.values) > hpa.target_queue_seconds  # two replicas' worth, always
