"""The operator's split and the frontend's routing agree on what a deployment serves.

A property over every combination of model family, declared traffic, pools and request
options (audio forms and chat bodies, parsed by the frontend's own parsers): the operator's
plan covers a request exactly when the frontend, reading the route table the operator
writes, routes that request to a pool; and every request the declared traffic allows is
covered unless the resource says it is not (`uncovered`, the Degraded condition).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.resources import make_td
from transcription_api.capabilities import Capability, ModelFamily, request_needs
from transcription_api.chat import parse_chat
from transcription_api.engines import capability_sets, family_engines
from transcription_api.openai import Granularity, ResponseFormat
from transcription_api.params import parse_request
from transcription_api.routes import RouteTable
from transcription_api.v1alpha1 import spec_problems
from transcription_frontend.routing import Router
from transcription_operator.children import route_table
from transcription_operator.plan import plan

ENDPOINTS = ["transcriptions", "translations", "chat"]
FEATURES = ["stream", "segment_timestamps", "word_timestamps", "language_detection"]


def subsets(items: list[str], min_size: int = 0) -> Iterator[list[str]]:
    for n in range(min_size, len(items) + 1):
        yield from (list(c) for c in itertools.combinations(items, n))


def pool_shapes(family: ModelFamily) -> Iterator[list[dict[str, Any]]]:
    """No declared pools, one pool of each (engine, mode) that serves the family, and two
    pools of different engines."""
    yield []
    singles = [
        {"name": "p", "engine": e.value, "mode": m.value} for e, m in capability_sets(family)
    ]
    yield from ([p] for p in singles)
    for a, b in itertools.combinations(singles, 2):
        if a["engine"] != b["engine"]:
            yield [a, {**b, "name": "q"}]


def requests() -> Iterator[tuple[Capability, list[tuple[str, str]]]]:
    """Every valid combination of request options, as form fields."""
    for endpoint, stream, fmt, grans in itertools.product(
        [Capability.TRANSCRIPTIONS, Capability.TRANSLATIONS], [False, True], list(ResponseFormat),
        list(subsets([g.value for g in Granularity])),
    ):  # fmt: skip
        if stream and fmt not in (ResponseFormat.JSON, ResponseFormat.TEXT):
            continue
        if grans and fmt != ResponseFormat.VERBOSE_JSON:
            continue
        fields = [("response_format", fmt.value), ("stream", str(stream).lower())]
        fields += [("timestamp_granularities[]", g) for g in grans]
        yield endpoint, fields


def chat_requests() -> Iterator[bytes]:
    """Chat bodies: text or audio input, streamed or not."""
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    for stream, content in itertools.product([False, True], ["hi", [audio]]):
        yield json.dumps({"model": "m", "stream": stream,
                          "messages": [{"role": "user", "content": content}]}).encode()  # fmt: skip


REQUESTS = [
    (endpoint, request_needs(endpoint, stream=r.stream, response_format=r.response_format,
                             granularities=r.timestamp_granularities))
    for endpoint, fields in requests()
    for r in [parse_request(fields)]
] + [
    (Capability.CHAT, request_needs(Capability.CHAT, stream=r.stream))
    for body in chat_requests()
    for r, _ in [parse_chat(body)]
]  # fmt: skip


def specs() -> Iterator[dict[str, Any]]:
    """Every spec admission lets through, per family and engine that serves it."""
    for family in ModelFamily:
        for engine, endpoints, features, pools, split in itertools.product(
            family_engines(family), list(subsets(ENDPOINTS, 1)), list(subsets(FEATURES)),
            list(pool_shapes(family)), [True, False],
        ):  # fmt: skip
            if pools and not any(p["engine"] == engine.value for p in pools):
                continue  # the resource's engine is one of its pools' (or the default pool's)
            yield {"model": {"name": "m", "family": family.value}, "engine": engine.value,
                   "pools": pools, "traffic": {"endpoints": endpoints, "features": features},
                   "autoSplit": {"enabled": split}}  # fmt: skip


def test_operator_and_frontend_agree_on_every_request() -> None:
    checked = 0
    families = set()
    routed: dict[tuple[ModelFamily, Capability, bool], int] = {}
    for spec in specs():
        td = make_td(spec)
        assert spec_problems(td.spec) == [], spec
        families.add(td.spec.model.family)
        the_plan = plan(td.spec)
        # The frontend reads the route table the operator writes, as JSON.
        table = RouteTable.model_validate_json(route_table(td, the_plan).dumps())
        router = Router(table)
        declared = {Capability(f) for f in spec["traffic"]["features"]}
        for endpoint, needs in REQUESTS:
            operator_covers = the_plan.serves(needs)
            frontend_routes = isinstance(router.candidates(table, needs, size=1024), list)
            assert operator_covers == frontend_routes, (spec, sorted(needs))
            key = (td.spec.model.family, endpoint, frontend_routes)
            routed[key] = routed.get(key, 0) + 1
            allowed = (
                endpoint.value in spec["traffic"]["endpoints"] and needs - {endpoint} <= declared
            )
            if allowed and not the_plan.uncovered:
                assert operator_covers, ("declared traffic not served", spec, sorted(needs))
            checked += 1
    assert checked > 10_000
    assert families == set(ModelFamily)
    # Whisper deployments serve and refuse audio requests (by their pools and options) and
    # never chat; audio LM deployments always chat (every engine and mode that runs them
    # does, streams included), transcribe plain text through chat, and never translate.
    audio_lm, whisper = ModelFamily.AUDIO_LM, ModelFamily.WHISPER
    assert {k for k, n in routed.items() if n} == {
        (audio_lm, Capability.CHAT, True),
        (audio_lm, Capability.TRANSCRIPTIONS, True), (audio_lm, Capability.TRANSCRIPTIONS, False),
        (audio_lm, Capability.TRANSLATIONS, False),
        (whisper, Capability.CHAT, False),
        (whisper, Capability.TRANSCRIPTIONS, True), (whisper, Capability.TRANSCRIPTIONS, False),
        (whisper, Capability.TRANSLATIONS, True), (whisper, Capability.TRANSLATIONS, False),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "needs"),
    [
        ([], {"transcriptions"}),
        ([("stream", "true")], {"transcriptions", "stream"}),
        ([("response_format", "srt")], {"transcriptions", "segment_timestamps"}),
        ([("response_format", "verbose_json"), ("timestamp_granularities[]", "word")],
         {"transcriptions", "segment_timestamps", "word_timestamps"}),
    ],
)  # fmt: skip
def test_request_needs(fields: list[tuple[str, str]], needs: set[str]) -> None:
    r = parse_request(fields)
    got = request_needs(Capability.TRANSCRIPTIONS, stream=r.stream,
                        response_format=r.response_format, granularities=r.timestamp_granularities)  # fmt: skip
    assert got == {Capability(n) for n in needs}
