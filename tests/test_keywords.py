"""`keywords[]` (issue 22 item 4): the words join the prompt the engine decodes after (what
faster-whisper's `hotwords` do), on faster-whisper pools; vLLM's (measured worse with them)
and transformers' (which ignore prompts) are never asked, and a deployment without a
faster-whisper pool answers a 400 naming `keywords`.
`python -m bench keywords` measures how much more often tiny.en then gets the words right."""

from __future__ import annotations

import pytest

from testkit.frontend import PRIMARY, WAV, Frontend, assert_still_serving, error, pool
from testkit.standins import TRANSFORMERS_WHISPER, Behaviour, Running
from transcription_api.capabilities import Capability, Engine
from transcription_api.errors import APIError
from transcription_api.params import MAX_KEYWORD_CHARS, parse_request
from transcription_api.routes import RouteTable


def test_keywords_follow_the_clients_prompt() -> None:
    r = parse_request([("keywords[]", "Kubernetes"), ("keywords[]", " PostgreSQL  replica ")])
    assert r.prompt == "Kubernetes, PostgreSQL replica."
    assert r.keywords == ["Kubernetes", " PostgreSQL  replica "]
    r = parse_request([("prompt", "A talk about databases. "), ("keywords", "PostgreSQL"),
                       ("keywords[]", "PostgreSQL")])  # fmt: skip
    assert r.prompt == "A talk about databases. PostgreSQL."  # each word once
    assert parse_request([("prompt", "as it was")]).prompt == "as it was"


@pytest.mark.parametrize(
    ("keywords", "says"),
    [
        ([""], "must not be empty"),
        (["  "], "must not be empty"),
        ([f"word{i:04d}" for i in range(100)], "send fewer"),
    ],
)
def test_bad_keywords_are_400s(keywords: list[str], says: str) -> None:
    with pytest.raises(APIError) as e:
        parse_request([("keywords[]", k) for k in keywords])
    assert e.value.status == 400 and e.value.param == "keywords[]" and says in e.value.message


def test_as_many_keywords_as_whisper_reads_are_taken() -> None:
    words = [f"w{i:03d}" for i in range(MAX_KEYWORD_CHARS // 6)]
    assert parse_request([("keywords[]", w) for w in words]).prompt.endswith(words[-1] + ".")


def test_vllm_pools_are_not_given_keywords(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    """Measured (bench keywords): vLLM's greedy decode runs away after a prompt of keywords
    (tiny.en: 6/25 keywords found without, 1/25 with), so the capability is faster-whisper's."""
    seen = len(worker[1].seen)
    r = frontend.post([("model", "whisper-1"), ("keywords[]", "Kubernetes")])
    assert r.status_code == 400
    body = error(r)
    assert body["code"] == "unsupported_capability", body
    assert "missing capability keywords" in body["message"], body
    assert len(worker[1].seen) == seen
    assert_still_serving(frontend)


def test_faster_whisper_gets_the_keywords_in_its_prompt(
    with_faster_whisper: tuple[Frontend, Behaviour],
) -> None:
    fe, behaviour = with_faster_whisper
    before = fe.metric("transcription_frontend_requests_total", pool="fw")
    out = fe.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), prompt="Ops call.",
        extra_body={"keywords": ["Kubernetes", "PostgreSQL"]},
    )  # fmt: skip
    assert out.text
    assert fe.metric("transcription_frontend_requests_total", pool="fw") == before + 1
    fields = behaviour.seen[-1].fields
    assert [v for k, v in fields if k == "prompt"] == ["Ops call. Kubernetes, PostgreSQL."]
    assert not any(k.startswith("keywords") for k, _ in fields)
    fe.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), extra_body={"keywords": ["Siobhan"]}
    )
    assert [v for k, v in behaviour.seen[-1].fields if k == "prompt"] == ["Siobhan."]


@pytest.mark.standin("transformers")
def test_a_pool_that_ignores_prompts_is_not_given_keywords(
    worker: tuple[Running, Behaviour],
) -> None:
    p = pool("t", [worker[0].url], engine=Engine.TRANSFORMERS)
    p = p.model_copy(update={"worker_model": TRANSFORMERS_WHISPER})
    fe = Frontend(RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[p]))
    try:
        seen = len(worker[1].seen)
        r = fe.post([("model", "whisper-1"), ("keywords[]", "Kubernetes")])
        assert r.status_code == 400
        body = error(r)
        assert body["code"] == "unsupported_capability"
        assert f"missing capability {Capability.KEYWORDS.value}" in body["message"]
        assert len(worker[1].seen) == seen
        assert fe.post({"model": "whisper-1"}).status_code == 200  # serving goes on
    finally:
        fe.running.stop()
