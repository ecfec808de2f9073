"""Fair sharing of one busy pool (issue 34), over real HTTP: the order in which the gateway
gives a busy pool's free slot to the requests waiting for it. One stand-in worker, sent one
request at a time, holds its requests until the test lets them go; a noisy tenant's requests
wait for it, then a quiet tenant's one. With tenants declared (start-time fair queuing in
audio seconds) the quiet request goes before all of them; without (first come, first
served, every key the tenant `default`) after all of them.

The latencies this order makes (the quiet tenant's p50 alone and beside the noisy one, 1.5x
at most) are measured by `python -m bench gateway`, not asserted here: a loaded machine moves
them, not the order."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from testkit.audio import tone_wav
from testkit.frontend import PRIMARY, Frontend, pool, wait_until
from testkit.standins import Behaviour, serve, vllm_app
from transcription_api.frontend import TenantSpec
from transcription_api.routes import RouteTable

QUIET, NOISY = tone_wav(1.0), tone_wav(0.5)
WAITING = 8  # noisy requests waiting for the pool when the quiet one comes


@pytest.fixture
def one_slot() -> Iterator[tuple[RouteTable, Behaviour]]:
    """A pool of one worker that is sent one request at a time."""
    worker = Behaviour()
    with serve(vllm_app([PRIMARY, "whisper-1"], worker)) as w:
        batch = pool("batch", [w.url]).model_copy(update={"max_in_flight_per_replica": 1})
        yield RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[batch]), worker


def served(fe: Frontend, worker: Behaviour) -> list[str]:
    """Whose requests the worker was sent, in order: a noisy one at the worker (held there),
    `WAITING` more of the noisy tenant's waiting for it in the gateway, then the quiet
    tenant's one; then the worker lets them go, one at a time."""
    worker.hold = True

    def send(tenant: str) -> int:
        audio = QUIET if tenant == "quiet" else NOISY
        headers = {"authorization": f"Bearer sk-{tenant}"}
        return fe.post({"model": "whisper-1"}, audio, headers=headers).status_code

    with ThreadPoolExecutor(WAITING + 2) as ex:
        answers = [ex.submit(send, "noisy")]
        wait_until(lambda: worker.in_flight == 1, what="the first request at the worker")
        for n in range(1, WAITING + 1):  # one after another: each is tagged in its turn
            answers.append(ex.submit(send, "noisy"))
            wait_until(lambda n=n: fe.gateway.holds.held("batch") == n, what=f"{n} waiting")
        answers.append(ex.submit(send, "quiet"))
        wait_until(lambda: fe.gateway.holds.held("batch") == WAITING + 1, what="the quiet one")
        worker.hold = False
        assert [a.result(timeout=30) for a in answers] == [200] * (WAITING + 2)
    assert worker.max_in_flight == 1  # the queue was the gateway's, not the worker's
    assert fe.gateway.holds.held("batch") == 0
    sizes = {len(QUIET): "quiet", len(NOISY): "noisy"}
    return [sizes[s.file_bytes] for s in worker.seen]


def test_a_quiet_tenants_request_goes_before_a_noisy_tenants_waiting_ones(
    one_slot: tuple[RouteTable, Behaviour], tmp_path: Path
) -> None:
    table, worker = one_slot
    keys = tmp_path / "keys"
    keys.write_text("sk-quiet group=quiet\nsk-noisy group=noisy\n")
    fe = Frontend(table, keys=keys, tenants=[TenantSpec(name="quiet"), TenantSpec(name="noisy")])
    try:
        order = served(fe, worker)
    finally:
        fe.running.stop()
    # The request at the worker counts for its tenant too (tagged when it was sent), so the
    # noisy tenant's waiting ones start at its 0.5 s of audio and after; the quiet one, with
    # nothing of its tenant before it, starts at the virtual time (0) and goes first.
    assert order == ["noisy", "quiet"] + ["noisy"] * WAITING, order


def test_without_tenants_the_same_requests_are_served_first_come_first_served(
    one_slot: tuple[RouteTable, Behaviour], tmp_path: Path
) -> None:
    table, worker = one_slot
    keys = tmp_path / "keys"
    keys.write_text("sk-quiet\nsk-noisy\n")
    fe = Frontend(table, keys=keys)
    try:
        order = served(fe, worker)
    finally:
        fe.running.stop()
    assert order == ["noisy"] * (WAITING + 1) + ["quiet"], order
