"""OpenAI's request fields (api/transcription_api/fields.py): the installed SDK's fields are
each decided on, and every refused one is a 400 naming the field and the capability, through
the gateway with the official SDK, before any worker is asked; serving goes on after."""

from __future__ import annotations

import openai
import pytest
from openai.types.audio import transcription_create_params, translation_create_params

from testkit.frontend import WAV, Frontend
from testkit.standins import Behaviour, Running
from transcription_api.capabilities import Capability, ModelFamily
from transcription_api.engines import capability_sets
from transcription_api.fields import FIELDS, REFUSED_FORMATS

ARRAYS = {"include", "keywords", "languages", "known_speaker_names", "known_speaker_references",
          "timestamp_granularities"}  # fmt: skip


def wire(name: str) -> str:
    return name + "[]" if name in ARRAYS else name


@pytest.mark.parametrize(
    "params",
    [
        transcription_create_params.TranscriptionCreateParamsBase,
        translation_create_params.TranslationCreateParams,
    ],
    ids=["transcriptions", "translations"],
)
def test_every_field_of_the_installed_sdk_is_decided_on(params: type) -> None:
    """Fails on the SDK release that adds a field: decide on it in fields.py."""
    undecided = {wire(n) for n in params.__annotations__} - set(FIELDS)
    assert not undecided, (
        f"openai {openai.__version__} sends fields fields.py does not decide on: {undecided}"
    )


def test_every_decision_says_what_honours_it_or_what_it_needs() -> None:
    for name, d in FIELDS.items():
        assert bool(d.honoured_by) != bool(d.needs), name


REFUSED = [
    ("known_speaker_names", {"extra_body": {"known_speaker_names": ["agent"]}}, "diarization"),
    ("known_speaker_references", {"extra_body": {"known_speaker_references": ["data:audio/wav;base64,AAAA"]}}, "diarization"),
    ("response_format", {"response_format": "diarized_json"}, "diarization"),
]  # fmt: skip


@pytest.mark.parametrize(("param", "kwargs", "capability"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_field_no_engine_honours_is_a_400_naming_it_and_serving_goes_on(
    frontend: Frontend, worker: tuple[Running, Behaviour], param: str, kwargs: dict, capability: str
) -> None:
    seen = len(worker[1].seen)
    with pytest.raises(openai.BadRequestError) as e:
        frontend.client.audio.transcriptions.create(
            model="whisper-1", file=("a.wav", WAV), **kwargs
        )
    body = e.value.body
    assert isinstance(body, dict), body
    assert body["param"].removesuffix("[]") == param, body
    assert capability in body["message"] and "not supported" in body["message"], body
    assert body["code"] == "unsupported_capability", body
    assert len(worker[1].seen) == seen  # no worker was asked
    ok = frontend.client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
    assert ok.text


def test_refused_formats_are_named() -> None:
    assert REFUSED_FORMATS == {"diarized_json": "diarization"}


def test_diarization_is_a_capability_no_engine_has_yet() -> None:
    """When an engine gets it, its profile lists the capability and the fields follow: the
    wire (the field names, the 400's capability name) does not change."""
    refusing = {n for n, d in FIELDS.items() if d.needs == Capability.DIARIZATION}
    assert refusing == {"known_speaker_names[]", "known_speaker_references[]"}
    assert REFUSED_FORMATS["diarized_json"] == Capability.DIARIZATION.value
    for family in ModelFamily:
        for sets in capability_sets(family).values():
            assert Capability.DIARIZATION not in sets.capabilities
