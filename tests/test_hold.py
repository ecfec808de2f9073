"""Held requests (transcription_frontend/hold.py) and what wakes them (transcription_frontend/routing.py),
without HTTP."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from prometheus_client import REGISTRY

from testkit.frontend import PATIENCE
from transcription_api.capabilities import Engine, Mode
from transcription_api.errors import APIError
from transcription_api.frontend import HoldLimits
from transcription_api.multipart import Upload
from transcription_api.routes import PoolRoute, RouteTable
from transcription_frontend import routing
from transcription_frontend.fair import Flow
from transcription_frontend.forward import JsonBody
from transcription_frontend.hold import Holdable, Holds, Place
from transcription_frontend.routing import Router

A, B = (PoolRoute(name=n, engine=Engine.VLLM, mode=Mode.CONTINUOUS, service=f"w-{n}") for n in "ab")


T = TypeVar("T")


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def upload(size: int = 1000) -> Upload:
    f = tempfile.SpooledTemporaryFile(max_size=1024 * 1024)  # noqa: SIM115 (the Upload owns it)
    f.write(b"\0" * size)
    return Upload(file=f, size=size)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def setup(**limits: Any) -> tuple[Router, Holds]:
    router = Router(RouteTable(model="m", pools=[A, B]))
    return router, Holds(router, HoldLimits(**limits))


async def waiting(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """`coro` started, and given a moment to start waiting."""
    task = asyncio.create_task(coro)
    await asyncio.sleep(0.01)
    return task


async def held(
    holds: Holds, pools: list[PoolRoute], up: Holdable | None = None
) -> asyncio.Task[None]:
    return await waiting(holds.wait(pools, up or upload(), holds.deadline()))


def test_a_held_request_wakes_when_its_pool_gets_an_endpoint_and_not_before() -> None:
    async def main() -> None:
        router, holds = setup()
        gauge = sample("transcription_frontend_held_requests", pool="a")
        task = await held(holds, [A])
        assert (holds.held("a"), holds.bytes) == (1, 1000)
        assert sample("transcription_frontend_held_requests", pool="a") == gauge + 1
        router.set_endpoints("b", ["http://10.0.0.2:8000"])  # another pool
        router.set_endpoints("a", [])  # no change
        await asyncio.sleep(0.05)
        assert not task.done()
        router.set_endpoints("a", ["http://10.0.0.1:8000"])
        await asyncio.wait_for(task, 1)
        assert (holds.held("a"), holds.bytes) == (0, 0)
        assert sample("transcription_frontend_held_requests", pool="a") == gauge

    run(main())


def test_any_candidate_pool_wakes_it_and_it_counts_for_the_first() -> None:
    async def main() -> None:
        router, holds = setup()
        task = await held(holds, [A, B])
        assert (holds.held("a"), holds.held("b")) == (1, 0)
        router.set_endpoints("b", ["http://10.0.0.2:8000"])
        await asyncio.wait_for(task, 1)

    run(main())


def test_the_end_of_an_ejection_wakes_held_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routing, "EJECT_SECONDS", 0.1)

    async def main() -> None:
        router, holds = setup()
        router.set_endpoints("a", ["http://10.0.0.1:8000"])
        for _ in range(routing.EJECT_AFTER):
            router.failed("http://10.0.0.1:8000", "a")
        assert router.pick("a", set()) is None  # ejected
        task = await held(holds, [A])
        await asyncio.wait_for(task, 1)
        assert router.pick("a", set()) == "http://10.0.0.1:8000"

    run(main())


def test_how_long_until_a_pool_has_a_ready_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a held request's wake is set by: 0 with an endpoint ready, the rest of the first
    ejection when all are ejected, None with no endpoint (only a change can help then)."""
    monkeypatch.setattr(routing, "EJECT_SECONDS", 30.0)
    router = Router(RouteTable(model="m", pools=[A, B]))
    assert router.ready_in(["a", "b"]) is None
    router.set_endpoints("a", ["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    assert router.ready_in(["a"]) == 0
    for _ in range(routing.EJECT_AFTER):
        router.failed("http://10.0.0.1:8000", "a")
    assert router.ready_in(["a"]) == 0  # the other is ready
    for _ in range(routing.EJECT_AFTER):
        router.failed("http://10.0.0.2:8000", "a")
    assert 29 < (router.ready_in(["a"]) or 0) <= 30
    assert router.ready_in(["b"]) is None
    router.set_endpoints("b", ["http://10.0.0.3:8000"])
    assert router.ready_in(["a", "b"]) == 0


def test_a_held_upload_is_moved_out_of_memory() -> None:
    async def main() -> None:
        router, holds = setup()
        up = upload(4096)
        assert up.file is not None and not up.file._rolled  # type: ignore[attr-defined]
        task = await held(holds, [A], up)
        assert up.file._rolled  # type: ignore[attr-defined]
        up.file.seek(0)
        assert up.file.read() == b"\0" * 4096  # the same bytes, now on disk
        router.set_endpoints("a", ["http://10.0.0.1:8000"])
        await task

    run(main())


def test_listeners_hear_of_each_new_hold_at_once() -> None:
    async def main() -> None:
        _router, holds = setup()
        heard: list[str] = []
        holds.on_hold(heard.append)
        task = await held(holds, [B, A])
        assert heard == ["b"]
        task.cancel()

    run(main())


def test_the_count_bound_is_per_pool() -> None:
    async def main() -> None:
        _router, holds = setup(max_requests=2)
        before = sample("transcription_frontend_hold_rejections_total", pool="a", reason="requests")
        tasks = [await held(holds, [A]) for _ in range(2)]
        with pytest.raises(APIError) as e:
            await holds.wait([A], upload(), holds.deadline())
        assert (e.value.status, e.value.headers) == (503, {"Retry-After": "5"})
        assert (
            "2 request(s) already wait for one, the limit of held requests per pool"
            in e.value.message
        )
        assert (
            sample("transcription_frontend_hold_rejections_total", pool="a", reason="requests")
            == before + 1
        )
        tasks.append(await held(holds, [B]))  # another pool has room
        assert holds.held("b") == 1
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert (holds.held("a"), holds.held("b"), holds.bytes) == (0, 0, 0)

    run(main())


def test_the_bytes_bound_is_for_all_pools_together() -> None:
    async def main() -> None:
        _router, holds = setup(max_bytes=2500)
        first = await held(holds, [A], upload(1000))
        second = await held(holds, [B], upload(1000))
        with pytest.raises(
            APIError, match="would exceed 2500 bytes, the limit of held upload bytes"
        ):
            await holds.wait([B], upload(1000), holds.deadline())
        assert holds.bytes == 2000
        for t in (first, second):
            t.cancel()

    run(main())


def test_held_chat_bodies_count_against_the_memory_budget_not_the_disk_one() -> None:
    async def main() -> None:
        _router, holds = setup(max_bytes=2500, max_memory_bytes=1500)
        chat = await held(holds, [A], JsonBody("x" * 998))
        assert (holds.memory, holds.bytes) == (1000, 0)
        up = await held(holds, [A], upload(2000))  # the disk budget is untouched by chat
        with pytest.raises(APIError, match="the limit of held chat bodies"):
            await holds.wait([B], JsonBody("x" * 998), holds.deadline())
        for t in (chat, up):
            t.cancel()
        await asyncio.sleep(0.01)
        assert (holds.memory, holds.bytes) == (0, 0)

    run(main())


def test_the_time_bound_counts_from_the_first_hold() -> None:
    async def main() -> None:
        _router, holds = setup(timeout_seconds=0.2)
        deadline = holds.deadline()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(APIError) as e:
            await holds.wait([A], upload(), deadline)
        assert 0.15 < loop.time() - started < 0.5
        assert e.value.status == 503 and e.value.headers == {"Retry-After": "5"}
        assert e.value.message == (
            "pool a had no ready worker within 0.2 s, the limit of time a request is held "
            "while its pool scales up; retry later"
        )
        with pytest.raises(APIError):  # a later hold of the same request: no time left
            await holds.wait([A], upload(), deadline)
        assert holds.held("a") == 0

    run(main())


def test_a_held_request_with_a_wake_time_wakes_then_without_a_change() -> None:
    """How `transcription_frontend.forward` holds a request whose endpoints could not be
    reached: no discovery change may come, so it tries again once its backoff has passed."""

    async def main() -> None:
        _router, holds = setup()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(
            holds.wait([A], upload(), holds.deadline(), wake_at=started + 0.1), 1
        )
        assert loop.time() - started >= 0.09  # not before its wake time (wait_for: nor long after)
        assert (holds.held("a"), holds.bytes) == (0, 0)
        # A wake time past the deadline does not stretch it.
        _r, short = setup(timeout_seconds=0.2)
        with pytest.raises(APIError, match=r"within 0\.2 s"):
            await short.wait([A], upload(), short.deadline(), wake_at=loop.time() + 5)

    run(main())


def test_draining_answers_what_is_held_within_the_grace_period() -> None:
    async def main() -> None:
        _router, holds = setup()
        before = sample("transcription_frontend_hold_rejections_total", pool="a", reason="shutdown")
        task = await held(holds, [A])
        holds.drain(0.1)
        with pytest.raises(APIError) as e:
            await asyncio.wait_for(task, 1)
        assert e.value.status == 503 and e.value.headers == {"Retry-After": "1"}
        assert "before this frontend replica shut down" in e.value.message
        # One that arrives while draining is held for what is left of the grace period.
        with pytest.raises(APIError, match="shut down"):
            await asyncio.wait_for(holds.wait([A], upload(), holds.deadline()), 1)
        assert (
            sample("transcription_frontend_hold_rejections_total", pool="a", reason="shutdown")
            == before + 2
        )

    run(main())


def test_a_request_woken_while_draining_goes_on() -> None:
    async def main() -> None:
        router, holds = setup()
        task = await held(holds, [A])
        holds.drain(5)
        router.set_endpoints("a", ["http://10.0.0.1:8000"])
        await asyncio.wait_for(task, 1)  # forwarded, not refused

    run(main())


def test_pool_in_flight_counts_terminating_endpoints_until_their_requests_end() -> None:
    router = Router(RouteTable(model="m", pools=[A]))
    changes: list[str] = []
    router.on_change(changes.append)
    router.set_endpoints("a", ["http://10.0.0.1:8000"])
    router.acquire("http://10.0.0.1:8000", "a")
    router.set_endpoints("a", ["http://10.0.0.2:8000"])  # the first one is terminating
    assert router.pool_in_flight("a") == 1 and changes == ["a", "a"]
    assert router.pick("a", set()) == "http://10.0.0.2:8000"
    router.release("http://10.0.0.1:8000", "a")
    assert router.pool_in_flight("a") == 0


# ---- queued: every endpoint of the pool at its bound


BOUNDED = A.model_copy(update={"max_in_flight_per_replica": 1})
URL, URL2 = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


def busy_pool(**limits: Any) -> tuple[Router, Holds]:
    """Pool `a`, one endpoint taking one request at a time, already busy with one."""
    router = Router(RouteTable(model="m", pools=[BOUNDED]))
    holds = Holds(router, HoldLimits(**limits))
    router.set_endpoints("a", [URL])
    assert holds.take(BOUNDED, set(), Place(Flow("n"), 1)) == URL
    assert holds.take(BOUNDED, set(), Place(Flow("q"), 1)) is None  # at its bound
    return router, holds


async def queued(holds: Holds, tenant: str, seconds: float = 1) -> asyncio.Task[str | None]:
    place = Place(Flow(tenant), seconds)
    return await waiting(holds.queue([BOUNDED], BOUNDED, place, upload(), holds.deadline()))


def test_a_busy_pools_free_slots_go_to_the_queued_requests_in_fair_order() -> None:
    async def main() -> None:
        router, holds = busy_pool()
        gauge = sample("transcription_frontend_tenant_queued_audio_seconds", tenant="n")
        noisy = [await queued(holds, "n", 3) for _ in range(2)]
        quiet = await queued(holds, "q")  # arrives last, goes first: n has had its turn
        assert holds.held("a") == 3
        assert sample("transcription_frontend_tenant_queued_audio_seconds", tenant="n") == gauge + 6
        served: list[asyncio.Task[str | None]] = []
        for _ in range(3):
            router.release(URL, "a")  # the request at the worker ends: its slot is given
            done, _ = await asyncio.wait({quiet, *noisy} - set(served), timeout=PATIENCE,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            assert len(done) == 1 and done.pop().result() == URL
            served += [t for t in (quiet, *noisy) if t.done() and t not in served]
            assert router.in_flight(URL) == 1  # taken for the request it was given to
        assert served == [quiet, *noisy]
        assert holds.held("a") == 0
        assert sample("transcription_frontend_tenant_queued_audio_seconds", tenant="n") == gauge
        assert holds.take(BOUNDED, set(), Place()) is None  # the last still has it

    run(main())


def test_a_new_request_does_not_pass_those_queued() -> None:
    async def main() -> None:
        router, holds = busy_pool()
        first = await queued(holds, "n")
        router.release(URL, "a")
        # Given to the one queued, before it even runs again: a newcomer finds no room.
        assert holds.take(BOUNDED, set(), Place(Flow("q"), 1)) is None
        assert await asyncio.wait_for(first, 1) == URL

    run(main())


def test_a_slot_given_to_a_request_as_it_leaves_goes_to_the_next() -> None:
    async def main() -> None:
        router, holds = busy_pool()
        first, second = await queued(holds, "n"), await queued(holds, "n")
        router.release(URL, "a")  # given to `first`, which has not run since
        first.cancel()  # its client leaves before it does
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await asyncio.wait_for(second, 1) == URL
        assert router.in_flight(URL) == 1

    run(main())


def test_queued_requests_take_the_slots_of_new_endpoints_and_choose_again_without_any() -> None:
    async def main() -> None:
        router, holds = busy_pool()
        first, second = await queued(holds, "n"), await queued(holds, "n")
        router.set_endpoints("a", [URL, URL2])  # the pool scales up
        assert await asyncio.wait_for(first, 1) == URL2
        assert not second.done()
        router.set_endpoints("a", [])  # and away: the one queued chooses again (holds)
        assert await asyncio.wait_for(second, 1) is None

    run(main())


def test_the_waiting_bounds_count_queued_requests_and_name_the_tenant() -> None:
    async def main() -> None:
        _router, holds = busy_pool(max_requests=1)
        before = sample("transcription_frontend_tenant_rejections_total", tenant="q",
                        reason="queue_full")  # fmt: skip
        task = await queued(holds, "n")
        with pytest.raises(APIError) as e:
            await holds.queue([BOUNDED], BOUNDED, Place(Flow("q"), 2), upload(), holds.deadline())
        assert (e.value.status, e.value.headers) == (503, {"Retry-After": "5"})
        assert e.value.message == (
            "pool a has every worker busy and 1 request(s) already wait for one, the limit of "
            "waiting requests per pool; retry later"
        )
        assert sample("transcription_frontend_tenant_rejections_total", tenant="q",
                      reason="queue_full") == before + 1  # fmt: skip
        task.cancel()

    run(main())


def test_a_queued_request_times_out_saying_the_workers_were_busy() -> None:
    async def main() -> None:
        _router, holds = busy_pool(timeout_seconds=0.1)
        with pytest.raises(APIError) as e:
            await holds.queue([BOUNDED], BOUNDED, Place(), upload(), holds.deadline())
        assert e.value.message == (
            "pool a had every worker busy for 0.1 s, the limit of time a request waits for "
            "one; retry later"
        )

    run(main())


def test_a_higher_bound_in_a_new_route_table_gives_its_room_to_those_queued() -> None:
    async def main() -> None:
        router, holds = busy_pool()
        task = await queued(holds, "n")
        wider = BOUNDED.model_copy(update={"max_in_flight_per_replica": 2})
        router.set_routes(RouteTable(model="m", pools=[wider]))
        assert await asyncio.wait_for(task, 1) == URL
        assert router.in_flight(URL) == 2

    run(main())
