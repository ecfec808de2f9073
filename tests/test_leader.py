"""Leader election through a Lease: client-go's decisions with a fake clock, the requests
against a stand-in API server with resourceVersion semantics, and the async loop.

The real API server is in e2e/test_leader.py (two operator processes, a killed leader)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from testkit.apiserver import ApiServer
from transcription_operator.kinds import LEASE
from transcription_operator.kube import KubeError
from transcription_operator.leader import (
    ElectionConfig,
    ElectionConfigError,
    Elector,
    LeaderElection,
    LeaseLock,
    LeaseRecord,
    parse_duration,
)
from transcription_operator.main import parse_args

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def config(identity: str = "a", **kw: Any) -> ElectionConfig:
    return ElectionConfig(namespace="ops", name="transcription-operator", identity=identity, **kw)


def held_by(holder: str, transitions: int = 0, renewed: datetime = T0) -> LeaseRecord:
    return LeaseRecord(holder, 15, renewed, renewed, transitions)


# --------------------------------------------------------------------------- decisions


def test_a_free_lease_is_created_with_this_identity() -> None:
    record = Elector(config()).claim(None, now=0.0, wall=T0)
    assert record == LeaseRecord("a", 15, T0, T0, 0)
    assert record.to_spec() == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "leaseTransitions": 0,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:00:00.000000Z",
    }
    assert LeaseRecord.from_spec(record.to_spec()) == record


def test_a_held_lease_expires_by_the_candidates_own_clock_not_the_holders() -> None:
    b = Elector(config("b"))
    # The holder's clock is an hour behind: its renewTime says nothing to the candidate,
    # which counts 15 s from when it first saw this record.
    stale = held_by("a", renewed=T0 - timedelta(hours=1))
    assert b.claim(stale, now=100.0, wall=T0) is None
    assert b.claim(stale, now=114.9, wall=T0) is None
    taken = b.claim(stale, now=115.0, wall=T0 + timedelta(seconds=15))
    assert taken == LeaseRecord("b", 15, T0 + timedelta(seconds=15), T0 + timedelta(seconds=15), 1)


def test_a_holders_clock_ahead_does_not_extend_its_lease() -> None:
    b = Elector(config("b"))
    future = held_by("a", renewed=T0 + timedelta(hours=1))
    assert b.claim(future, now=0.0, wall=T0) is None
    assert b.claim(future, now=15.0, wall=T0) is not None


def test_every_renewal_restarts_the_candidates_count() -> None:
    b = Elector(config("b"))
    assert b.claim(held_by("a"), now=0.0, wall=T0) is None
    renewed = held_by("a", renewed=T0 + timedelta(seconds=10))
    assert b.claim(renewed, now=10.0, wall=T0) is None
    assert b.claim(renewed, now=24.9, wall=T0) is None  # 15 s from 10, not from 0
    assert b.claim(renewed, now=25.0, wall=T0) is not None


def test_the_holder_renews_keeping_its_term() -> None:
    a = Elector(config())
    first = a.claim(held_by("x", transitions=4), now=0.0, wall=T0)
    assert first is None  # x's lease is valid
    first = a.claim(held_by("x", transitions=4), now=15.0, wall=T0)
    assert first is not None and first.transitions == 5
    a.wrote(first, now=15.0)
    later = T0 + timedelta(seconds=2)
    renewal = a.renewal(now=17.0, wall=later)  # the fast path: no read first
    assert renewal == LeaseRecord("a", 15, first.acquire_time, later, 5)
    # The slow path (after a 409, say) keeps the term as well.
    again = a.claim(first, now=17.0, wall=later)
    assert again == renewal


def test_no_fast_path_once_the_lease_may_have_expired() -> None:
    a = Elector(config())
    record = a.claim(None, now=0.0, wall=T0)
    assert record is not None
    a.wrote(record, now=0.0)
    assert a.renewal(now=14.9, wall=T0) is not None
    assert a.renewal(now=15.0, wall=T0) is None  # read it first: someone may hold it now
    assert Elector(config("b")).renewal(now=0.0, wall=T0) is None  # never held


def test_a_released_lease_is_taken_at_once() -> None:
    b = Elector(config("b"))
    released = LeaseRecord("", 1, T0, T0, 3)
    assert b.claim(released, now=0.0, wall=T0) == LeaseRecord("b", 15, T0, T0, 4)


def test_release_clears_the_holder_only_when_it_is_ours() -> None:
    a = Elector(config())
    mine = held_by("a", transitions=2)
    assert a.release(mine, now=1.0, wall=T0) == LeaseRecord("", 1, T0, T0, 2)
    assert a.release(held_by("b", transitions=3), now=1.0, wall=T0) is None


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"lease_duration": 10.0}, "must be longer than the renew deadline"),
        ({"renew_deadline": 2.0}, "must be longer than 1.2 x the retry period"),
        ({"lease_duration": 15.5}, "must be whole seconds"),
        ({"identity": ""}, "identity is empty"),
        ({"retry_period": 0.0}, "retry period 0s must be positive"),
    ],
)
def test_unsafe_settings_are_refused_naming_the_rule(kw: dict[str, Any], message: str) -> None:
    args = {"identity": "a", **kw}
    with pytest.raises(ElectionConfigError, match=message):
        config(**args)


@pytest.mark.parametrize(
    ("text", "seconds"), [("15s", 15.0), ("500ms", 0.5), ("1m30s", 90.0), ("2", 2.0), ("0.5s", 0.5)]
)
def test_durations_parse_like_go(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15x", "s", "15s junk", "-1s", "-1", "inf", "nan"])
def test_bad_durations_say_what_to_write(text: str) -> None:
    with pytest.raises(ValueError, match=r"use e\.g\. 15s"):
        parse_duration(text)


def test_flags_default_off_and_take_kubernetes_names(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("LEADER_ELECT", "POD_NAME", "POD_NAMESPACE", "LEADER_ELECT_RENEW_DEADLINE"):
        monkeypatch.delenv(var, raising=False)
    assert parse_args([]).election is None
    assert parse_args(["--leader-elect=false"]).election is None
    monkeypatch.setenv("POD_NAME", "operator-7d9-abc")
    monkeypatch.setenv("POD_NAMESPACE", "transcription-system")
    monkeypatch.setenv("LEADER_ELECT_RENEW_DEADLINE", "8s")
    cfg = parse_args(["--leader-elect", "--leader-elect-retry-period=1s"]).election
    assert cfg == ElectionConfig(
        namespace="transcription-system", name="transcription-operator",
        identity="operator-7d9-abc", lease_duration=15.0, renew_deadline=8.0, retry_period=1.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--leader-elect"], {}, "set --leader-elect-resource-namespace (or POD_NAMESPACE)"),
        (["--leader-elect=maybe"], {}, "'maybe' is not a boolean"),
        (["--leader-elect-lease-duration=15"], {}, None),  # a bare number: seconds
        (["--leader-elect-retry-period=2x"], {}, "invalid duration '2x'"),
        ([], {"LEADER_ELECT_LEASE_DURATION": "soon"}, "invalid duration 'soon'"),
        (
            ["--leader-elect", "--leader-elect-resource-namespace=ops",
             "--leader-elect-lease-duration=5s"],
            {}, "lease duration 5s must be longer than the renew deadline 10s",
        ),
    ],
)  # fmt: skip
def test_bad_flags_exit_with_a_clear_error(
    argv: list[str], env: dict[str, str], message: str | None,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    for var in ("POD_NAMESPACE", "LEADER_ELECT_LEASE_DURATION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("transcription_operator.leader.SA_NAMESPACE_FILE", _missing())
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if message is None:
        parse_args(argv)
        return
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def _missing() -> Any:
    from pathlib import Path

    return Path("/nonexistent/namespace")


# --------------------------------------------------------------------------- requests


class LeaseServer(ApiServer):
    """The API-server stand-in (resourceVersion bumped on every write, an update carrying a
    stale one refused with 409), asking a time limit of every request: a hung request must
    not hold a leader."""

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        timeout = kw.get("timeout")
        assert timeout is not None and timeout > 0
        return super().request(method, path, body, **kw)

    @property
    def methods(self) -> list[str]:
        return [method for method, _ in self.requests]

    @property
    def record(self) -> LeaseRecord:
        lease = self.objects[LEASE.path("ops", "transcription-operator")]
        return LeaseRecord.from_spec(lease["spec"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return T0 + timedelta(seconds=self.now)


def candidate(server: LeaseServer, clock: Clock, identity: str, **kw: Any) -> LeaderElection:
    cfg = config(identity, **kw)
    lock = LeaseLock(server, cfg.namespace, cfg.name)  # type: ignore[arg-type]
    return LeaderElection(cfg, lock, lambda: None, lambda: None, clock=clock, wall=clock.wall)


def attempt(e: LeaderElection, clock: Clock) -> bool:
    return e.try_acquire_or_renew(deadline=clock() + 10)


def test_first_candidate_creates_the_lease_and_renews_it_without_reading() -> None:
    server, clock = LeaseServer(), Clock()
    a, b = candidate(server, clock, "a"), candidate(server, clock, "b")
    assert attempt(a, clock)
    assert server.methods == ["GET", "POST"]
    assert not attempt(b, clock)
    clock.now += 2
    server.requests.clear()
    assert attempt(a, clock)
    assert server.methods == ["PUT"]  # the fast path
    assert server.record == LeaseRecord("a", 15, T0 + timedelta(seconds=1000),
                                        T0 + timedelta(seconds=1002), 0)  # fmt: skip


def test_a_silent_leader_is_replaced_after_the_lease_duration() -> None:
    server, clock = LeaseServer(), Clock()
    a, b = candidate(server, clock, "a"), candidate(server, clock, "b")
    assert attempt(a, clock)
    clock.now += 1
    assert not attempt(b, clock)  # b first sees a's record now: counts from here
    clock.now += 14.9
    assert not attempt(b, clock)
    clock.now += 0.1
    assert attempt(b, clock)
    assert server.record.holder == "b" and server.record.transitions == 1
    # a wakes up: its fast path fails (409), the slow path finds b's valid lease.
    assert not attempt(a, clock)


def test_of_two_candidates_racing_for_an_expired_lease_exactly_one_wins() -> None:
    server, clock = LeaseServer(), Clock()
    gone = candidate(server, clock, "gone")
    assert attempt(gone, clock)
    b, c = candidate(server, clock, "b"), candidate(server, clock, "c")
    assert not attempt(b, clock) and not attempt(c, clock)
    clock.now += 15
    # Both read the same expired record, then both write: the second write carries a
    # stale resourceVersion.
    b_current = b.lock.get(1.0)
    c_current = c.lock.get(1.0)
    b_record = b.elector.claim(b_current, clock(), clock.wall())
    c_record = c.elector.claim(c_current, clock(), clock.wall())
    assert b_record is not None and c_record is not None
    b.lock.update(b_record, 1.0)
    with pytest.raises(KubeError) as conflict:
        c.lock.update(c_record, 1.0)
    assert conflict.value.status == 409
    assert server.record.holder == "b" and server.record.transitions == 1
    # Through the whole attempt the loser simply stays a candidate.
    assert not attempt(c, clock)


def test_release_hands_over_at_the_next_attempt() -> None:
    server, clock = LeaseServer(), Clock()
    a, b = candidate(server, clock, "a"), candidate(server, clock, "b")
    assert attempt(a, clock) and not attempt(b, clock)
    assert a.release_now(timeout=5)
    assert server.record == LeaseRecord("", 1, clock.wall(), clock.wall(), 0)
    assert attempt(b, clock)  # at once: no lease duration to wait out
    assert server.record.holder == "b" and server.record.transitions == 1
    assert not a.release_now(timeout=5)  # not ours any more: left alone
    assert server.record.holder == "b"


def test_leading_ends_at_the_renew_deadline_without_a_renewal() -> None:
    server, clock = LeaseServer(), Clock()
    a = candidate(server, clock, "a")
    a._leading, a._renewed_at = True, clock()  # what the loop does after a success
    assert a.is_leading()
    clock.now += 9.9
    assert a.is_leading()
    clock.now += 0.1
    assert not a.is_leading()  # before the loop even notices: workers stop taking keys


def test_api_errors_are_a_failed_attempt_not_a_crash() -> None:
    server, clock = LeaseServer(), Clock()
    a = candidate(server, clock, "a")
    server.down = True
    assert not attempt(a, clock)
    server.down = False
    assert attempt(a, clock)
    # A deadline already past sends nothing.
    server.requests.clear()
    clock.now += 2
    assert not a.try_acquire_or_renew(deadline=clock() - 1)
    assert server.methods == []


# --------------------------------------------------------------------------- the loop


async def until(predicate: Any, within: float) -> float:
    """Seconds until `predicate()` holds; fails after `within`."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not predicate():
        assert loop.time() - start < within, "timed out"
        await asyncio.sleep(0.02)
    return loop.time() - start


# The loop's settings in real time: short, yet with room for the stalls of a loaded machine
# (this suite runs beside the e2e suite at a lower priority; a healthy holder lost its lease
# in runs made 2.45 times slower, once at 1 s, 0.6 s and 0.2 s, once at 3 s, 2 s and 0.4 s:
# its event loop went 2 s without a turn). NOISE: how late a step may come on such a
# machine and still count as on time. The test sleeps through most of its 20 s.
TERM, RENEW, RETRY, NOISE = 6.0, 4.0, 0.8, 2.0


def test_the_loop_fails_over_steps_down_and_reacquires() -> None:
    """Real time: lease 6 s, renew deadline 4 s, retry 0.8 s."""

    async def main() -> None:
        server = LeaseServer()
        events: list[str] = []
        times = {"lease_duration": TERM, "renew_deadline": RENEW, "retry_period": RETRY}

        def elected(identity: str) -> LeaderElection:
            cfg = config(identity, **times)
            return LeaderElection(
                cfg, LeaseLock(server, cfg.namespace, cfg.name),  # type: ignore[arg-type]
                lambda: events.append(f"{identity} started"),
                lambda: events.append(f"{identity} stopped"),
            )  # fmt: skip

        a, b = elected("a"), elected("b")
        task_a = asyncio.create_task(a.run())
        await until(a.is_leading, TERM)
        task_b = asyncio.create_task(b.run())
        await asyncio.sleep(1.5 * TERM)  # longer than the lease: a renews, b waits
        assert a.is_leading() and not b.is_leading()
        assert events == ["a started"]

        task_a.cancel()  # a dies without releasing
        took = await until(b.is_leading, 3 * TERM)
        assert took <= TERM + 2 * RETRY * 2.2 + RETRY + NOISE, took  # lease + jittered retries
        assert server.record.holder == "b" and server.record.transitions == 1

        # The API server goes away: b stops leading by its renew deadline...
        server.down = True
        await until(lambda: not b.is_leading(), RENEW + NOISE)
        await until(lambda: "b stopped" in events, 1 + NOISE)
        # ...and, once it is back, reacquires (still the holder: no transition).
        server.down = False
        await until(b.is_leading, 2 * TERM)
        assert events == ["a started", "b started", "b stopped", "b started"]
        assert server.record.holder == "b" and server.record.transitions == 1

        task_b.cancel()
        await asyncio.gather(task_a, task_b, return_exceptions=True)
        await b.release()
        assert server.record.holder == "" and not b.is_leading()

    asyncio.run(main())
