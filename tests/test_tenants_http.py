"""Tenants over real HTTP, with stand-in workers and the official SDK: quotas in audio
seconds (429 in OpenAI's shape with Retry-After and the x-ratelimit-* headers, served again
after the refill, on a fake clock), a charge corrected to the answer's seconds, a quota of 0
over HTTP and realtime, realtime turns charged to their session's tenant, a key scoped by
its tenant to one of a gateway's two deployments, and a key of an undeclared tenant."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from testkit.audio import tone_wav
from testkit.frontend import PRIMARY, Frontend, pool
from testkit.realtime import appends, refusal, silence, until
from testkit.standins import Behaviour, serve, vllm_app
from transcription_api.frontend import TenantQuota, TenantSpec
from transcription_api.routes import Routes, RouteTable

TINY = "openai/whisper-tiny.en"
INTENT = {"intent": "transcription"}
ANSWER_SECONDS = 7  # what the vLLM stand-in's recorded answer reports (usage.seconds)


class Clock:
    """The quotas' clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def frontend(tmp_path: Path, keys: str | None, *tenants: TenantSpec, **kw: Any
             ) -> tuple[Frontend, Clock, ExitStack]:  # fmt: skip
    """A gateway on one vLLM stand-in, with these keys and tenants, its quotas on a clock
    moved by hand."""
    stack = ExitStack()
    worker = stack.enter_context(serve(vllm_app([PRIMARY, "whisper-1"], Behaviour())))
    path = None
    if keys is not None:
        path = tmp_path / "keys"
        path.write_text(keys)
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker.url])])
    fe = Frontend(table, keys=path, tenants=list(tenants), **kw)
    stack.callback(fe.running.stop)
    clock = Clock()
    fe.gateway.quotas.clock = clock
    return fe, clock, stack


def client(fe: Frontend, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fe.url}/v1", api_key=key, max_retries=0)


def per_minute(name: str, seconds: int, **kw: Any) -> TenantSpec:
    return TenantSpec(name=name, quota=TenantQuota(audio_seconds_per_minute=seconds), **kw)


def test_over_its_quota_a_tenant_gets_429_and_is_served_again_after_the_refill(
    tmp_path: Path,
) -> None:
    fe, clock, stack = frontend(tmp_path, "sk-calls group=calls\nsk-other\n",
                                per_minute("calls", 20))  # fmt: skip
    with stack:
        calls = client(fe, "sk-calls")
        refused = fe.metric("transcription_frontend_tenant_rejections_total", tenant="calls",
                            reason="quota_minute")  # fmt: skip
        served = fe.metric("transcription_frontend_tenant_audio_seconds_total", tenant="calls",
                           outcome="served")  # fmt: skip
        audio = ("a.wav", tone_wav(ANSWER_SECONDS))  # its answer reports as long: no correction
        first = calls.audio.transcriptions.with_raw_response.create(model="whisper-1", file=audio)
        # Every answer says where the tenant stands, so that clients can pace themselves.
        assert {k: first.headers[k] for k in RATE_HEADERS} == {
            "x-ratelimit-limit-audio-seconds": "20",
            "x-ratelimit-remaining-audio-seconds": "13",
            "x-ratelimit-reset-audio-seconds": "21s",  # 7 s at 20 a minute
        }
        assert first.parse().text
        calls.audio.transcriptions.create(model="whisper-1", file=audio)  # 6 left
        with pytest.raises(openai.RateLimitError) as e:
            calls.audio.transcriptions.create(model="whisper-1", file=audio)
        r = e.value.response
        assert e.value.body == {
            "message": "Rate limit reached for tenant `calls` on audio seconds per minute: "
            "Limit 20, Remaining 6.0, Requested 7.0. Please try again in 3s.",
            "type": "audio_seconds", "param": None, "code": "rate_limit_exceeded",
        }  # fmt: skip
        assert (r.headers["retry-after"], r.headers["retry-after-ms"]) == ("3", "3000")
        assert {k: r.headers[k] for k in RATE_HEADERS} == {
            "x-ratelimit-limit-audio-seconds": "20",
            "x-ratelimit-remaining-audio-seconds": "6",
            "x-ratelimit-reset-audio-seconds": "42s",
        }
        # Another tenant (the keys without a group: unlimited) is not held back.
        other = client(fe, "sk-other").audio.transcriptions.with_raw_response.create(
            model="whisper-1", file=audio
        )
        assert "x-ratelimit-limit-audio-seconds" not in other.headers
        clock.now += 3  # the refill: one more second of audio every 3 s
        assert calls.audio.transcriptions.create(model="whisper-1", file=audio).text
        assert fe.metric("transcription_frontend_tenant_rejections_total", tenant="calls",
                         reason="quota_minute") == refused + 1  # fmt: skip
        assert fe.metric("transcription_frontend_tenant_audio_seconds_total", tenant="calls",
                         outcome="served") == served + 3 * ANSWER_SECONDS  # fmt: skip


RATE_HEADERS = (
    "x-ratelimit-limit-audio-seconds",
    "x-ratelimit-remaining-audio-seconds",
    "x-ratelimit-reset-audio-seconds",
)


def test_a_charge_is_corrected_to_the_seconds_the_answer_reports(tmp_path: Path) -> None:
    fe, _, stack = frontend(tmp_path, None, per_minute("default", 60))
    with stack:
        plain = client(fe)
        short = ("a.wav", tone_wav(2))  # 2 s by its header; its answer says 7
        first = plain.audio.transcriptions.with_raw_response.create(model="whisper-1", file=short)
        assert first.headers["x-ratelimit-remaining-audio-seconds"] == "58"  # charged 2
        second = plain.audio.transcriptions.with_raw_response.create(model="whisper-1", file=short)
        assert second.headers["x-ratelimit-remaining-audio-seconds"] == "51"  # 60 - 7 - 2
        # A request that is not served is refunded whole.
        with pytest.raises(openai.BadRequestError):
            plain.audio.transcriptions.create(model="whisper-1", file=short, language="xx")
        third = plain.audio.transcriptions.with_raw_response.create(model="whisper-1", file=short)
        assert third.headers["x-ratelimit-remaining-audio-seconds"] == "44"  # 60 - 7 - 7 - 2


def test_a_quota_of_zero_refuses_every_request_and_realtime_session_naming_it(
    tmp_path: Path,
) -> None:
    zero = TenantSpec(name="default", quota=TenantQuota(audio_seconds_per_day=0))
    fe, _, stack = frontend(tmp_path, None, zero)
    with stack:
        with pytest.raises(openai.RateLimitError) as e:
            client(fe).audio.transcriptions.create(model="whisper-1", file=("a.wav", tone_wav(1)))
        assert e.value.code == "insufficient_quota"
        assert e.value.body["message"].startswith(  # type: ignore[index]
            "Tenant `default`'s quota is 0 audio seconds per day "
            "(spec.frontend.tenants[].quota.audioSecondsPerDay): it may not send any audio."
        )
        assert e.value.response.headers["x-should-retry"] == "false"  # the SDK does not retry
        ws = fe.url.replace("http", "ws") + "/v1/realtime?intent=transcription"
        status, _, body = refusal(ws)
        assert status == 429 and body["error"]["code"] == "insufficient_quota"
        assert fe.metric("transcription_frontend_realtime_refused_total", reason="quota") >= 1


def commit_turns(fe: Frontend, seconds: float, turns: int) -> list[Any]:
    """One realtime session committing `turns` turns of `seconds` of audio each: the last
    event of each turn (completed or failed)."""

    async def session() -> list[Any]:
        rt = openai.AsyncOpenAI(base_url=f"{fe.url}/v1", api_key="none", max_retries=0)
        async with rt.realtime.connect(extra_query={**INTENT, "model": "whisper-1"}) as conn:
            await until(conn, "session.created")
            await conn.send({"type": "session.update", "session": {"type": "transcription",  # type: ignore[arg-type]
                             "audio": {"input": {"turn_detection": None}}}})  # fmt: skip
            await until(conn, "session.updated")
            out = []
            for _ in range(turns):
                for piece in appends(silence(seconds)):
                    await conn.send({"type": "input_audio_buffer.append", "audio": piece})
                await conn.send({"type": "input_audio_buffer.commit"})
                events = await until(conn, "conversation.item.done")
                out.append(next(e for e in events if e.type.endswith((".completed", ".failed"))))
            return out

    return asyncio.run(session())


def test_realtime_turns_are_charged_to_their_sessions_tenant(tmp_path: Path) -> None:
    fe, _, stack = frontend(tmp_path, None, per_minute("default", 2))
    with stack:
        first, second, third = commit_turns(fe, 0.8, 3)
        assert first.type.endswith(".completed") and second.type.endswith(".completed")
        assert third.type.endswith(".failed")  # 0.4 s left of 2
        assert third.error.code == "rate_limit_exceeded"
        assert "Rate limit reached for tenant `default`" in third.error.message


# ---- scopes in a gateway of two deployments


@pytest.fixture
def two_deployments() -> Iterator[Routes]:
    with (
        serve(vllm_app([PRIMARY, "whisper-1"])) as big,
        serve(vllm_app([TINY, "tiny"])) as tiny,
    ):
        yield Routes(deployments=[
            RouteTable(model=PRIMARY, aliases=["whisper-1"], deployment="speech/whisper",
                       pools=[pool("whisper/batch", [big.url])]),
            RouteTable(model=TINY, aliases=["tiny"], deployment="speech/tiny",
                       pools=[pool("tiny/batch", [tiny.url])]),
        ])  # fmt: skip


def test_a_key_scoped_by_its_tenant_to_one_model_cannot_reach_the_other(
    two_deployments: Routes, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-drafts group=drafts\nsk-lost group=nope\nsk-all\n")
    fe = Frontend(two_deployments, keys=keys, tenants=[TenantSpec(name="drafts", models=["tiny"])])
    try:
        drafts = client(fe, "sk-drafts")
        assert [m.id for m in drafts.models.list()] == [TINY, "tiny"]
        assert drafts.audio.transcriptions.create(model="tiny", file=("a.wav", tone_wav(1))).text
        with pytest.raises(openai.PermissionDeniedError) as e:
            drafts.audio.transcriptions.create(model="whisper-1", file=("a.wav", tone_wav(1)))
        assert e.value.body == {
            "message": f"Tenant `drafts` (this API key's group) may not use the model "
            f"`{PRIMARY}`; its models: tiny.",
            "type": "permission_error", "param": "model", "code": "model_not_allowed",
        }  # fmt: skip
        auth = {"authorization": "Bearer sk-drafts"}
        ws = fe.url.replace("http", "ws") + "/v1/realtime?intent=transcription"
        status, _, body = refusal(ws + "&model=whisper-1", additional_headers=auth)
        assert status == 403 and "Tenant `drafts`" in body["error"]["message"]

        async def switch() -> Any:
            rt = openai.AsyncOpenAI(base_url=f"{fe.url}/v1", api_key="sk-drafts", max_retries=0)
            async with rt.realtime.connect(extra_query={**INTENT, "model": "tiny"}) as conn:
                await until(conn, "session.created")
                await conn.send({"type": "session.update", "session": {"type": "transcription",  # type: ignore[arg-type]
                                 "audio": {"input": {"transcription": {"model": "whisper-1"}}}}})  # fmt: skip
                return (await until(conn, "error", "session.updated"))[-1]

        event = asyncio.run(switch())
        assert event.type == "error" and event.error.code == "model_not_allowed"
        # A key of an undeclared tenant: 403 naming it; the others and /ready are unaffected.
        with pytest.raises(openai.PermissionDeniedError) as e:
            client(fe, "sk-lost").models.list()
        assert e.value.code == "unknown_tenant" and "tenant `nope`" in e.value.message
        status, _, body = refusal(ws, additional_headers={"authorization": "Bearer sk-lost"})
        assert status == 403 and body["error"]["code"] == "unknown_tenant"
        everyone = client(fe, "sk-all")
        assert len(everyone.models.list().data) == 4
        assert everyone.audio.transcriptions.create(model="whisper-1", file=("a.wav",
                                                    tone_wav(1))).text  # fmt: skip
        assert httpx.get(f"{fe.url}/ready").status_code == 200
    finally:
        fe.running.stop()


def test_a_long_file_is_charged_once_its_whole_length_not_again_by_its_chunks(
    tmp_path: Path,
) -> None:
    fe, _, stack = frontend(tmp_path, None, per_minute("default", 100))
    with stack:
        chunked = fe.metric("transcription_frontend_chunked_requests_total")
        r = fe.post({"model": "whisper-1", "chunking_strategy": "auto"}, tone_wav(65), timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["x-ratelimit-remaining-audio-seconds"] == "35"  # the file, by its header
        assert fe.metric("transcription_frontend_chunked_requests_total") == chunked + 1
        # Its chunks (three, at most 30 s each) were not charged again: 100 - 65 - 1 left.
        again = fe.post({"model": "whisper-1"}, tone_wav(1))
        assert again.headers["x-ratelimit-remaining-audio-seconds"] == "34"
