"""Who spoke when on the wire (api/transcription_api/diarization.py): the diarized shapes
against the installed SDK's own types, every bad known-speaker input a 400 naming its field,
and the join of a transcript's words or segments with speaker turns."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from openai.types.audio import (
    TranscriptionDiarized,
    TranscriptionDiarizedSegment,
    TranscriptionTextSegmentEvent,
)
from pydantic import BaseModel

from transcription_api.capabilities import Capability, request_needs
from transcription_api.diarization import (
    DiarizedSegment,
    DiarizedTranscription,
    Turn,
    check_reference_length,
    diarize,
    known_speakers,
)
from transcription_api.errors import APIError
from transcription_api.openai import ResponseFormat, VerboseTranscription
from transcription_api.params import parse_request

WAV = "data:audio/wav;base64," + base64.b64encode(b"RIFF....WAVEfmt ").decode()


def fields_of(model: type[BaseModel]) -> dict[str, bool]:
    """Each field's name and whether it is required."""
    return {name: f.is_required() for name, f in model.model_fields.items()}


@pytest.mark.parametrize(
    ("ours", "sdks"),
    [
        (DiarizedTranscription, TranscriptionDiarized),
        (DiarizedSegment, TranscriptionDiarizedSegment),
        (DiarizedSegment, TranscriptionTextSegmentEvent),
    ],
)
def test_the_shapes_have_the_installed_sdks_fields(
    ours: type[BaseModel], sdks: type[BaseModel]
) -> None:
    """Fails on the SDK release that changes a field: ours has each of its fields (the
    constant `type`/`task` defaulted here, required there) and no other."""
    assert set(fields_of(ours)) == set(fields_of(sdks)), (ours, sdks)


def test_a_diarized_answer_parses_as_the_sdks_type() -> None:
    turns = [Turn(0.0, 1.4, "A"), Turn(1.6, 3.0, "B")]
    verbose = VerboseTranscription.model_validate({
        "language": "en", "duration": 3.0, "text": "Hello there. Hi.",
        "words": [{"word": " Hello", "start": 0.1, "end": 0.5}, {"word": " there.", "start": 0.6, "end": 1.2},
                  {"word": " Hi.", "start": 1.8, "end": 2.2}],
    })  # fmt: skip
    answer = diarize(verbose, turns, seconds=3)
    parsed = TranscriptionDiarized.model_validate_json(answer.model_dump_json(exclude_none=True))
    assert [(s.speaker, s.text, s.type) for s in parsed.segments] == [
        ("A", "Hello there.", "transcript.text.segment"),
        ("B", "Hi.", "transcript.text.segment"),
    ]
    assert (parsed.task, parsed.duration, parsed.text) == ("transcribe", 3.0, "Hello there. Hi.")
    assert parsed.usage is not None and parsed.usage.type == "duration"
    assert [s.id for s in parsed.segments] == ["seg_0", "seg_1"]
    event = TranscriptionTextSegmentEvent.model_validate(answer.segments[1].model_dump())
    assert (event.start, event.end) == (1.8, 2.2)


def test_without_words_each_segment_gets_the_speaker_covering_most_of_it() -> None:
    verbose = VerboseTranscription.model_validate({
        "language": "en", "duration": 6.0, "text": "One. Two. Three.",
        "segments": [{"id": 0, "start": 0.0, "end": 2.0, "text": " One."},
                     {"id": 1, "start": 2.0, "end": 4.5, "text": " Two."},
                     {"id": 2, "start": 5.2, "end": 5.6, "text": " Three."}],
    })  # fmt: skip
    turns = [Turn(0.0, 2.4, "A"), Turn(2.4, 4.8, "Ada")]
    got = diarize(verbose, turns)
    # The third segment overlaps no turn (said in what the VAD took for silence): the
    # nearest turn's speaker.
    assert [(s.speaker, s.text) for s in got.segments] == [("A", "One."), ("Ada", "Two."),
                                                           ("Ada", "Three.")]  # fmt: skip
    assert got.usage is None
    no_turns = diarize(verbose, [])
    assert {s.speaker for s in no_turns.segments} == {"A"}  # one voice, or none found
    with pytest.raises(ValueError, match="ends"):
        diarize(verbose.model_copy(update={"segments": [verbose.segments[0].model_copy(  # type: ignore[index]
            update={"start": 3.0, "end": 1.0})]}), turns)  # fmt: skip


def request(**fields: Any) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = [("model", "whisper-1")]
    for name, value in fields.items():
        for v in value if isinstance(value, list) else [value]:
            out.append((name, v))
    return out


def test_known_speakers_are_parsed_with_a_diarized_request() -> None:
    r = parse_request(request(response_format="diarized_json",
                              **{"known_speaker_names[]": ["agent", "customer"],
                                 "known_speaker_references[]": [WAV, WAV]}))  # fmt: skip
    assert r.diarized and r.known_speaker_names == ["agent", "customer"]
    [agent, _] = known_speakers(r.known_speaker_names, r.known_speaker_references)
    assert (agent.name, agent.media_type, agent.audio[:4]) == ("agent", "audio/wav", b"RIFF")
    needs = request_needs(Capability.TRANSCRIPTIONS, response_format=r.response_format)
    assert {Capability.DIARIZATION, Capability.SEGMENT_TIMESTAMPS} <= needs
    streamed = parse_request(request(response_format="diarized_json", stream="true"))
    assert streamed.stream and streamed.response_format == ResponseFormat.DIARIZED_JSON


BAD = [
    ({"known_speaker_names[]": ["a"], "known_speaker_references[]": [WAV]}, "known_speaker_names[]",
     "need response_format=diarized_json, not json"),
    ({"response_format": "diarized_json", "known_speaker_names[]": ["a", "b"],
      "known_speaker_references[]": [WAV]}, "known_speaker_references[]",
     "2 known_speaker_names[] and 1 known_speaker_references[]: send one reference per name"),
    ({"response_format": "diarized_json", "known_speaker_names[]": ["a"],
      "known_speaker_references[]": [WAV, WAV]}, "known_speaker_names[]", "1 known_speaker_names[] and 2"),
    ({"response_format": "diarized_json", "known_speaker_names[]": list("abcde"),
      "known_speaker_references[]": [WAV] * 5}, "known_speaker_names[]", "at most 4 known_speaker_names[], got 5"),
    ({"response_format": "diarized_json", "known_speaker_names[]": [" "],
      "known_speaker_references[]": [WAV]}, "known_speaker_names[]", "known_speaker_names[0] must be 1-64 characters"),
    ({"response_format": "diarized_json", "known_speaker_names[]": ["a", "a"],
      "known_speaker_references[]": [WAV, WAV]}, "known_speaker_names[]", "names 'a' twice"),
    ({"response_format": "diarized_json", "known_speaker_names[]": ["a"],
      "known_speaker_references[]": ["https://example.com/a.wav"]}, "known_speaker_references[]",
     "known_speaker_references[0] must be a base64 data URL of audio"),
    ({"response_format": "diarized_json", "known_speaker_names[]": ["a"],
      "known_speaker_references[]": ["data:image/png;base64,AAAA"]}, "known_speaker_references[]",
     "known_speaker_references[0] is image/png, not audio"),
    ({"response_format": "diarized_json", "known_speaker_names[]": ["a"],
      "known_speaker_references[]": ["data:audio/wav;base64,@@@@"]}, "known_speaker_references[]",
     "known_speaker_references[0] is not valid base64"),
    ({"response_format": "diarized_json", "known_speaker_names[]": ["a"],
      "known_speaker_references[]": ["data:audio/wav;base64,"]}, "known_speaker_references[]",
     "known_speaker_references[0] holds no audio"),
    ({"response_format": "diarized_json", "known_speaker_names[]": ["a"],
      "known_speaker_references[]": ["data:audio/wav;base64," + "A" * 3_000_000]},
     "known_speaker_references[]", "known_speaker_references[0] is over 2 MB"),
    ({"response_format": "diarized_json", "include[]": "logprobs"}, "include[]",
     "include[]=logprobs needs response_format=json"),
    ({"response_format": "diarized_json", "timestamp_granularities[]": "word"},
     "timestamp_granularities[]", "needs response_format=verbose_json"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param", "message"), BAD, ids=[b[2][:40] for b in BAD])
def test_every_bad_known_speaker_input_is_a_400_naming_its_field(
    fields: dict[str, Any], param: str, message: str
) -> None:
    with pytest.raises(APIError) as e:
        parse_request(request(**fields))
    assert (e.value.status, e.value.param) == (400, param)
    assert message in e.value.message, e.value.message


def test_a_reference_must_last_two_to_ten_seconds() -> None:
    for seconds in (2.0, 6.5, 10.0):
        check_reference_length(seconds, 0)
    for seconds, shown in ((1.9, "1.9"), (10.5, "10.5"), (0.0, "0.0")):
        with pytest.raises(APIError) as e:
            check_reference_length(seconds, 1)
        assert e.value.param == "known_speaker_references[]"
        assert f"known_speaker_references[1] lasts {shown} s: a reference must be 2-10 s" in (
            e.value.message
        )


def test_reference_fields_may_be_large_but_the_forms_fields_stay_bounded() -> None:
    """A 10 s clip as a data URL is far over the 64 KiB any other field may be; the fields
    together stay within FIELDS_BYTES, whatever number of references a client sends."""
    import asyncio
    from collections.abc import AsyncIterator

    from transcription_api.multipart import FIELDS_BYTES, MAX_FIELD_BYTES, parse_upload

    def part(name: str, value: str) -> bytes:
        return f'--b\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()

    clip = "data:audio/wav;base64," + "A" * 400_000  # 10 s of 16 kHz mono WAV, about
    cases = [
        ([part("known_speaker_references[]", clip)] * 4, None),
        ([part("prompt", "x" * (MAX_FIELD_BYTES + 1))], "form field `prompt` is over 65536 bytes"),
        ([part("known_speaker_references[]", clip + "A" * 2_500_000)],
         "form field `known_speaker_references[]` is over"),
        ([part("known_speaker_references[]", clip + "A" * 2_000_000)] * 5,
         f"the form's fields are over {FIELDS_BYTES} bytes together"),
    ]  # fmt: skip

    async def parse(parts: list[bytes]) -> str | None:
        async def chunks() -> AsyncIterator[bytes]:
            for p in parts:
                yield p
            yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
            yield b"RIFF\r\n--b--\r\n"

        try:
            upload = await parse_upload(chunks(), "multipart/form-data; boundary=b", 1 << 20)
        except APIError as e:
            return e.message
        upload.close()
        assert len(upload.fields) == len(parts)
        return None

    for parts, message in cases:
        got = asyncio.run(parse(parts))
        assert (got is None) if message is None else (got is not None and message in got), got
