"""The operator's work queue: dedup, one worker per key, re-run after a change, backoff."""

from __future__ import annotations

import asyncio

import pytest

from transcription_operator.queue import BASE_DELAY, MAX_DELAY, WorkQueue


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_keys_are_deduplicated_while_pending() -> None:
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue()
        q.add("a")
        q.add("a")
        q.add("b")
        assert q.depth == 2
        assert await q.get() == "a"
        assert await q.get() == "b"

    run(main())


def test_a_key_changed_while_processing_is_processed_again_after() -> None:
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue()
        q.add("a")
        key = await q.get()
        q.add("a")  # an event arrives during the reconcile
        assert q.depth == 0  # ...but the same key is never handed to two workers
        q.done(key)
        assert q.depth == 1
        assert await q.get() == "a"

    run(main())


def test_delayed_adds_keep_the_earliest_wakeup() -> None:
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue()
        q.add("a", delay=10)
        q.add("a", delay=0.05)
        assert q.depth == 0
        assert await asyncio.wait_for(q.get(), timeout=1) == "a"

    run(main())


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue()
        delays = [q.retry("a") for _ in range(12)]
        assert delays[:3] == [BASE_DELAY, BASE_DELAY * 2, BASE_DELAY * 4]
        assert delays[-1] == MAX_DELAY
        q.forget("a")
        assert q.retry("a") == BASE_DELAY

    run(main())


@pytest.mark.parametrize("n", [1, 3])
def test_depth_counts_pending_keys(n: int) -> None:
    async def main() -> None:
        q: WorkQueue[int] = WorkQueue()
        for i in range(n):
            q.add(i)
        assert q.depth == n

    run(main())
