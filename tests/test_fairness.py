"""Fair sharing of one busy pool (issue 34), over real HTTP: a noisy tenant at many times a
quiet tenant's load, on one pool of stand-in workers whose service time is proportional to
the audio's length, each sent at most `BOUND` requests at once. The quiet tenant's p50
alone, then beside the noisy one with tenants declared (weighted fair queuing in the
gateway) and without (first come, first served), in one run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.audio import tone_wav
from testkit.fairness import alone, beside_noisy
from testkit.frontend import PRIMARY, Frontend, pool
from testkit.standins import Behaviour, serve, vllm_app
from transcription_api.frontend import TenantQuota, TenantSpec
from transcription_api.routes import RouteTable

# Seconds a worker takes per second of audio: long beside the gateway's own work per request,
# so that a machine busy with other suites slows the quiet tenant's answers by a small part.
SERVICE = 0.4
BOUND = 2  # requests each of the two workers is sent at once
QUIET, NOISY = tone_wav(1.0), tone_wav(0.5)  # 0.4 s and 0.2 s at a worker
# The quiet tenant's requests, one at a time; the noisy one's loops. A quiet request queued
# behind the noisy ones (first come, first served) waits for about 28 of them, 3.5 times its
# own service time: the two ways differ by far more than the CPU time other suites take from
# this process.
REQUESTS, CLIENTS = 15, 32


@pytest.fixture
def busy_pool() -> Iterator[tuple[RouteTable, list[Behaviour]]]:
    behaviours = [Behaviour(per_audio_second=SERVICE) for _ in range(2)]
    with (
        serve(vllm_app([PRIMARY, "whisper-1"], behaviours[0])) as a,
        serve(vllm_app([PRIMARY, "whisper-1"], behaviours[1])) as b,
    ):
        batch = pool("batch", [a.url, b.url]).model_copy(
            update={"max_in_flight_per_replica": BOUND}
        )
        yield RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[batch]), behaviours


def test_a_quiet_tenant_keeps_its_latency_beside_a_noisy_one_that_gets_429s_over_its_quota(
    busy_pool: tuple[RouteTable, list[Behaviour]], tmp_path: Path
) -> None:
    table, behaviours = busy_pool
    keys = tmp_path / "keys"
    keys.write_text("sk-quiet group=quiet\nsk-noisy group=noisy\n")
    # The noisy tenant's quota lasts through the quiet tenant's requests (its answers report
    # 0.5 s each, about 20 a second), then runs out.
    noisy = TenantSpec(name="noisy", quota=TenantQuota(audio_seconds_per_minute=250))
    fe = Frontend(table, keys=keys, tenants=[TenantSpec(name="quiet"), noisy])
    load = {"quiet_key": "sk-quiet", "noisy_key": "sk-noisy", "quiet_audio": QUIET,
            "noisy_audio": NOISY, "requests": REQUESTS, "clients": CLIENTS}  # fmt: skip
    try:
        by_itself = asyncio.run(alone(fe.url, "sk-quiet", QUIET, REQUESTS))
        fair = asyncio.run(beside_noisy(fe.url, **load, until_refused=30))  # type: ignore[arg-type]
        queued = fe.gateway.holds.held("batch")
    finally:
        fe.running.stop()
    # The same, first come first served: no tenants (every key is tenant `default`).
    keys.write_text("sk-quiet\nsk-noisy\n")
    fe = Frontend(table, keys=keys)
    try:
        fifo = asyncio.run(beside_noisy(fe.url, **load))  # type: ignore[arg-type]
    finally:
        fe.running.stop()
    on, off = fair.p50 / by_itself.p50, fifo.p50 / by_itself.p50
    print(f"\nquiet tenant p50: alone {by_itself.p50 * 1000:.0f} ms; beside a noisy tenant "
          f"{fair.p50 * 1000:.0f} ms with fair queuing ({on:.2f}x), {fifo.p50 * 1000:.0f} ms "
          f"without ({off:.2f}x); noisy: {dict(fair.noisy)} (first 429 after "
          f"{fair.refused_after} s)")  # fmt: skip
    assert on <= 1.5, (by_itself.summary(), fair.summary())
    assert off >= 2 * on, (by_itself.summary(), fifo.summary())
    # The noisy tenant was served (fairly) while the quiet one was measured, then refused
    # once over its quota.
    assert fair.noisy[200] > 5 * REQUESTS and fair.noisy[429] > 0, fair.noisy
    assert fair.refused_after and fair.quiet_after and fair.refused_after > fair.quiet_after
    assert fifo.noisy[429] == 0
    assert queued == 0  # nothing left waiting
    # The queue was in the gateway: no worker was sent more than its bound.
    assert max(b.max_in_flight for b in behaviours) == BOUND
