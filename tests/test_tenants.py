"""Tenants without HTTP: key groups in the key file, callers and their scope, quotas as token
buckets in audio seconds (a fake clock), the headers' durations, and the fair order of
requests waiting for a busy pool."""

from __future__ import annotations

import json

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from transcription_api.errors import APIError
from transcription_api.frontend import (
    FrontendSettings,
    Priority,
    SettingsError,
    TenantQuota,
    TenantSpec,
)
from transcription_api.v1alpha1.frontend import FrontendSpec
from transcription_frontend.auth import Key, parse_keys
from transcription_frontend.fair import FairQueue, Flow
from transcription_frontend.quota import Quotas, duration
from transcription_frontend.tenants import Tenants

NAMES = {"big": "big", "whisper-1": "big", "tiny": "tiny"}  # every served name -> primary


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ---- the key file


def test_a_key_joins_a_tenant_with_group_anywhere_after_it() -> None:
    keys = parse_keys(
        "sk-a\nsk-b whisper-1 group=drafts\nsk-c group=drafts, tiny\nsk-d group=a group=b\n"
        "sk-e group=\n"
    )
    assert [(k.secret, k.models, k.group) for k in keys] == [
        (b"sk-a", None, None),
        (b"sk-b", frozenset({"whisper-1"}), "drafts"),
        (b"sk-c", frozenset({"tiny"}), "drafts"),
        (b"sk-d", None, "a,b"),  # two groups: a name no tenant has (refused below)
        (b"sk-e", None, ""),
    ]


def test_a_key_of_an_undeclared_tenant_is_refused_with_403_naming_it() -> None:
    tenants = Tenants([TenantSpec(name="drafts"), TenantSpec(name="calls")])
    for group in ("nope", "a,b", ""):
        with pytest.raises(APIError) as e:
            tenants.caller(Key(b"sk", None, group))
        assert (e.value.status, e.value.code) == (403, "unknown_tenant")
        assert (
            f"tenant `{group}`, which this gateway does not declare (its tenants: drafts, calls)"
            in e.value.message
        )
    assert tenants.caller(Key(b"sk", None, "calls")).tenant.name == "calls"


def test_each_key_file_with_undeclared_tenants_is_reported_once_by_label() -> None:
    problems: list[str] = []
    tenants = Tenants([TenantSpec(name="drafts")], problems.append)
    keys = parse_keys("sk-secret group=nope\nsk-ok group=drafts\n")
    tenants.keys_read(keys)
    tenants.keys_read(keys)  # the same problem: said once
    assert len(problems) == 1
    assert f"API keys {keys[0].label} (group=nope) name tenants" in problems[0]
    assert "sk-secret" not in problems[0]  # keys are never logged
    tenants.keys_read(parse_keys("sk-ok group=drafts\n"))  # fixed
    tenants.keys_read(keys)  # and broken again: said again
    assert len(problems) == 2


def test_keys_without_a_group_are_the_default_tenant_declared_or_not() -> None:
    assert Tenants([]).caller(None).tenant == TenantSpec(name="default")
    assert Tenants([]).caller(Key(b"sk", None)).tenant.name == "default"
    declared = TenantSpec(name="default", weight=3, priority=Priority.BATCH)
    assert Tenants([declared]).caller(Key(b"sk", None)).tenant == declared
    assert Tenants([declared]).caller(None).tenant == declared  # no key file at all


def test_a_tenants_models_further_restrict_its_keys_scope() -> None:
    tenants = Tenants([TenantSpec(name="t", models=["tiny"])])
    everything = tenants.caller(Key(b"sk", None, "t"))
    assert everything.refusal("tiny", NAMES) is None
    refused = everything.refusal("big", NAMES)
    assert refused is not None and refused.status == 403 and refused.code == "model_not_allowed"
    assert refused.message == (
        "Tenant `t` (this API key's group) may not use the model `big`; its models: tiny."
    )
    # The key's own scope applies first, in its own words; both must allow a model.
    narrow = tenants.caller(Key(b"sk", frozenset({"tiny"}), "t"))
    error = narrow.refusal("big", NAMES)
    assert error is not None and error.message == "This API key may not use the model `big`."
    apart = tenants.caller(Key(b"sk", frozenset({"whisper-1"}), "t"))
    assert apart.refusal("tiny", NAMES) is not None  # the key may not
    assert apart.refusal("big", NAMES) is not None  # its tenant may not
    aliased = Tenants([TenantSpec(name="t", models=["whisper-1"])]).caller(Key(b"sk", None, "t"))
    assert aliased.refusal("big", NAMES) is None  # an alias names its primary


def test_a_batch_tenants_flow_is_batch_but_its_realtime_turns_are_interactive() -> None:
    caller = Tenants([TenantSpec(name="b", priority=Priority.BATCH, weight=5)]).caller(
        Key(b"sk", None, "b")
    )
    assert caller.flow() == Flow("b", 5, batch=True)
    assert caller.flow(interactive=True) == Flow("b", 5, batch=False)


# ---- bad tenants


@pytest.mark.parametrize(
    ("tenant", "message"),
    [
        ({"name": "a", "weight": 0}, "greater than or equal to 1"),
        ({"name": "a", "weight": -3}, "greater than or equal to 1"),
        ({"name": "a", "weight": 1001}, "less than or equal to 1000"),
        ({"name": "a", "quota": {"audioSecondsPerMinute": -1}}, "greater than or equal to 0"),
        ({"name": "a", "quota": {"audioSecondsPerDay": 1.5}}, "valid integer"),
        ({"name": "a", "quota": {"audioSecondsPerHour": 60}}, "Extra inputs are not permitted"),
        ({"name": "a", "priority": "urgent"}, "'interactive' or 'batch'"),
        ({"name": "Team A"}, "should match pattern"),
        ({"name": "a", "models": []}, "at least 1 item"),
    ],
)
def test_a_bad_tenant_gets_a_clear_error_in_the_spec_and_in_the_settings(
    tenant: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        FrontendSpec.model_validate({"tenants": [tenant]})
    with pytest.raises(SettingsError, match=r"tenants\.0"):
        FrontendSettings.from_json(json.dumps({"tenants": [tenant]}))


def test_two_tenants_of_one_name_are_refused_in_the_spec_and_in_the_settings() -> None:
    twice = {"tenants": [{"name": "a"}, {"name": "a", "weight": 2}]}
    with pytest.raises(ValidationError, match="tenant names must be unique"):
        FrontendSpec.model_validate(twice)
    with pytest.raises(SettingsError, match="tenant names must be unique"):
        FrontendSettings.from_json('{"tenants": [{"name": "a"}, {"name": "a"}]}')


# ---- quotas


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def quotas(minute: int | None = None, day: int | None = None, share: int = 1
           ) -> tuple[Quotas, TenantSpec, Clock]:  # fmt: skip
    tenant = TenantSpec(
        name="t", quota=TenantQuota(audio_seconds_per_minute=minute, audio_seconds_per_day=day)
    )
    clock = Clock()
    return Quotas([tenant], lambda: share, clock), tenant, clock


def refusal(q: Quotas, tenant: TenantSpec, seconds: float) -> APIError:
    with pytest.raises(APIError) as e:
        q.admit(tenant, seconds)
    return e.value


def test_a_minute_bucket_refuses_past_its_quota_and_refills_at_its_rate() -> None:
    q, tenant, clock = quotas(minute=60)
    before = sample("transcription_frontend_tenant_rejections_total", tenant="t",
                    reason="quota_minute")  # fmt: skip
    charge = q.admit(tenant, 45)
    assert charge is not None and charge.standing.headers() == {
        "x-ratelimit-limit-audio-seconds": "60",
        "x-ratelimit-remaining-audio-seconds": "15",
        "x-ratelimit-reset-audio-seconds": "45s",
    }
    e = refusal(q, tenant, 20)  # 15 left: 5 more take 5 s at 1 a second
    assert (e.status, e.type, e.code) == (429, "audio_seconds", "rate_limit_exceeded")
    assert e.headers == {
        "Retry-After": "5", "retry-after-ms": "5000",
        "x-ratelimit-limit-audio-seconds": "60", "x-ratelimit-remaining-audio-seconds": "15",
        "x-ratelimit-reset-audio-seconds": "45s",
    }  # fmt: skip
    assert e.message == (
        "Rate limit reached for tenant `t` on audio seconds per minute: Limit 60, Remaining "
        "15.0, Requested 20.0. Please try again in 5s."
    )
    assert sample("transcription_frontend_tenant_rejections_total", tenant="t",
                  reason="quota_minute") == before + 1  # fmt: skip
    clock.now += 4.9
    assert refusal(q, tenant, 20).headers["retry-after-ms"] == "100"
    clock.now += 0.1
    assert q.admit(tenant, 20) is not None
    clock.now += 600  # refilled, never past the quota
    assert q.admit(tenant, 60) is not None
    assert refusal(q, tenant, 1).headers["Retry-After"] == "1"


def test_the_day_bucket_binds_once_the_minute_refilled() -> None:
    q, tenant, clock = quotas(minute=60, day=100)
    assert q.admit(tenant, 60) is not None
    clock.now += 60  # the minute is full again; the day has 40 and 60 s of its refill
    e = refusal(q, tenant, 41)
    # 40 + 60 s x 100/86400 left: the 41st second comes 804 s later (86400/100 - 60)
    assert e.message.startswith("Rate limit reached for tenant `t` on audio seconds per day")
    assert e.headers["Retry-After"] == "804"
    assert e.headers["x-ratelimit-limit-audio-seconds"] == "100"
    assert e.headers["x-ratelimit-remaining-audio-seconds"] == "40"
    charge = q.admit(tenant, 30)  # fits both; the day has less left: its headers
    assert charge is not None and charge.standing.limit == 100
    assert charge.standing.headers()["x-ratelimit-remaining-audio-seconds"] == "10"


def test_a_charge_is_settled_to_what_the_answer_reports() -> None:
    q, tenant, clock = quotas(minute=60)
    before = sample("transcription_frontend_tenant_audio_seconds_total", tenant="t",
                    outcome="served")  # fmt: skip
    charge = q.admit(tenant, 30)  # the header said 30 s
    assert charge is not None
    charge.settle(20)  # the answer: 20 s; 10 refunded
    assert q.admit(tenant, 40) is not None
    assert sample("transcription_frontend_tenant_audio_seconds_total", tenant="t",
                  outcome="served") == before + 20  # fmt: skip
    clock.now += 60
    charge = q.admit(tenant, 50)
    assert charge is not None
    charge.settle(None)  # not served: refunded whole
    assert q.admit(tenant, 60) is not None
    clock.now += 60
    charge = q.admit(tenant, 10)
    assert charge is not None
    charge.settle(70)  # longer than the estimate: 60 more, 10 owed
    assert refusal(q, tenant, 1).headers["Retry-After"] == "11"


def test_each_replica_enforces_its_share_and_reports_the_whole() -> None:
    q, tenant, clock = quotas(minute=60, share=2)
    charge = q.admit(tenant, 20)  # 30 of this replica's share; 10 left, 20 of the whole
    assert charge is not None
    assert charge.standing.headers()["x-ratelimit-limit-audio-seconds"] == "60"
    assert charge.standing.headers()["x-ratelimit-remaining-audio-seconds"] == "20"
    e = refusal(q, tenant, 15)  # 5 more at 0.5 a second
    assert e.headers["Retry-After"] == "10"
    clock.now += 60
    # Longer than the share, within the whole: fits a full bucket, and owes the rest.
    assert q.admit(tenant, 50) is not None
    assert refusal(q, tenant, 1).headers["Retry-After"] == "42"  # 20 owed + 1, at 0.5/s


def test_audio_longer_than_the_whole_quota_can_never_fit_and_says_so() -> None:
    q, tenant, _ = quotas(minute=60)
    e = refusal(q, tenant, 95)
    assert (e.status, e.code) == (429, "rate_limit_exceeded")
    assert e.message.startswith(
        "This request's audio (95.0 s) is longer than tenant `t`'s whole quota of 60 audio "
        "seconds per minute (spec.frontend.tenants[].quota.audioSecondsPerMinute): it can "
        "never fit, so retrying will not help."
    )
    assert e.headers["x-should-retry"] == "false" and "Retry-After" not in e.headers
    assert q.admit(tenant, 60) is not None  # nothing was charged


def test_a_quota_of_zero_refuses_every_request_and_says_the_quota_is_zero() -> None:
    q, tenant, _ = quotas(day=0)
    for seconds in (0, 1, 1000):
        e = refusal(q, tenant, seconds)
        assert (e.status, e.type, e.code) == (429, "audio_seconds", "insufficient_quota")
        assert e.message.startswith("Tenant `t`'s quota is 0 audio seconds per day")
        assert e.headers == {"x-should-retry": "false"}
    with pytest.raises(APIError, match="quota is 0"):
        q.check_open(tenant)


def test_requests_without_audio_and_tenants_without_a_quota_are_never_refused() -> None:
    q, tenant, _ = quotas(minute=10)
    assert q.admit(tenant, 10) is not None
    assert q.admit(tenant, 0) is not None  # a chat request without audio
    assert q.admit(TenantSpec(name="free"), 10**6) is None  # no quota: nothing charged
    q.check_open(tenant)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.12, "120ms"), (0.0001, "1ms"), (0.9995, "1s"), (1, "1s"), (2.5, "2.5s"),
     (59.999, "59.999s"), (60, "1m0s"), (62.5, "1m2.5s"), (3600, "1h0m0s"),
     (86_399.9, "23h59m59.9s"), (-1, "0s")],
)  # fmt: skip
def test_durations_are_written_as_openais_headers_write_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


# ---- the fair order


def order(queued: list[tuple[Flow, float]]) -> list[str]:
    """The tenants of `queued` (all waiting at once, tagged in this order) in the order one
    slot serves them."""
    fq = FairQueue()
    tags = [(fq.tag(flow, seconds), flow.tenant) for flow, seconds in queued]
    out = []
    while tags:
        tag, tenant = min(tags)
        tags.remove((tag, tenant))
        fq.dispatched(tag)
        out.append(tenant)
    return out


A, B = Flow("a"), Flow("b")


def test_two_tenants_of_equal_weight_take_turns() -> None:
    assert order([(A, 1)] * 4 + [(B, 1)] * 4) == list("abababab")


def test_weights_share_a_busy_pool_in_audio_seconds() -> None:
    heavy = Flow("a", weight=3)
    served = order([(heavy, 1)] * 12 + [(B, 1)] * 12)[:8]
    assert (served.count("a"), served.count("b")) == (6, 2)
    # In audio seconds, not requests: b's 3 s requests take three of a's 1 s turns each.
    assert order([(A, 1)] * 6 + [(B, 3)] * 2)[:8] == list("abaaabaa")


def test_interactive_requests_go_before_batch_ones_whatever_their_tags() -> None:
    batch = Flow("batch", weight=1000, batch=True)
    assert order([(batch, 1)] * 3 + [(A, 100)] * 2) == ["a", "a", "batch", "batch", "batch"]


def test_another_tenants_short_request_does_not_wait_for_a_long_files_chunks() -> None:
    fq = FairQueue()
    chunks = [fq.tag(A, 30) for _ in range(30)]  # one tenant's 2-hour file, cut
    fq.dispatched(chunks[0])  # its first chunk is at a worker
    short = fq.tag(B, 2)  # another tenant's short request arrives
    waiting = sorted([*chunks[1:], short])
    assert waiting[0] == short
    # A tenant back after a pause is not owed its idle time: it does not jump a backlog.
    later = FairQueue()
    first = later.tag(B, 1)
    later.dispatched(first)
    for tag in [later.tag(A, 1) for _ in range(10)][:5]:
        later.dispatched(tag)
    back = later.tag(B, 1)
    assert back.start == later.virtual[False] == 4.0


def test_tags_are_kept_per_tenant_and_class() -> None:
    fq = FairQueue()
    batch = Flow("a", batch=True)
    tags = [fq.tag(A, 2), fq.tag(batch, 2), fq.tag(A, 2), fq.tag(Flow("a", weight=4), 2)]
    assert [(t.batch, t.start, t.finish) for t in tags] == [
        (False, 0.0, 2.0), (True, 0.0, 2.0), (False, 2.0, 4.0), (False, 4.0, 4.5)
    ]  # fmt: skip
