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
from transcription_api.fields import FIELDS

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


def test_a_diarized_request_where_no_pool_has_the_speaker_stage_is_a_400_naming_it(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    """Every field is honoured somewhere; a deployment without diarization answers what it
    lacks, before any worker is asked, and serving goes on."""
    seen = len(worker[1].seen)
    for kwargs, param in [
        ({"response_format": "diarized_json"}, None),
        # Known speakers label diarized segments only.
        ({"extra_body": {"known_speaker_names": ["agent"],
                         "known_speaker_references": ["data:audio/wav;base64,AAAA"]}},
         "known_speaker_names[]"),
    ]:  # fmt: skip
        with pytest.raises(openai.BadRequestError) as e:
            frontend.client.audio.transcriptions.create(
                model="whisper-1", file=("a.wav", WAV), **kwargs
            )
        body = e.value.body
        assert isinstance(body, dict), body
        assert body["param"] == param, body
        if param is None:
            assert body["code"] == "unsupported_capability", body
            assert "missing capability diarization" in body["message"], body
        else:
            assert "need response_format=diarized_json, not json" in body["message"], body
    assert len(worker[1].seen) == seen  # no worker was asked
    ok = frontend.client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
    assert ok.text


def test_no_engine_profile_claims_diarization_until_a_pool_runs_the_speaker_stage() -> None:
    for family in ModelFamily:
        for sets in capability_sets(family).values():
            assert Capability.DIARIZATION not in sets.capabilities
