"""The transformers rows of the capability table stand on recorded answers, and the route
table tells the frontend what it needs for an engine without aliases."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from testkit.resources import make_td
from testkit.standins import TRANSFORMERS, recording
from transcription_api.capabilities import Capability, Engine, Mode, ModelFamily
from transcription_api.engines import Asked, capability_set, capability_sets, family_engines
from transcription_api.engines import transformers as table
from transcription_api.routes import PoolRoute, RouteTable
from transcription_operator.children import route_table
from transcription_operator.plan import plan

C = Capability
CB, SEQ = Mode.CONTINUOUS, Mode.SEQUENTIAL
WHISPER, AUDIO_LM = ModelFamily.WHISPER, ModelFamily.AUDIO_LM


def cited() -> set[str]:
    """Recordings named (in backticks) by the comments of the transformers profile."""
    source = Path(table.__file__).read_text()
    comments = " ".join(
        line.strip().lstrip("#") for line in source.splitlines() if line.strip().startswith("#")
    )
    return {
        n for n in re.findall(r"`([a-z_0-9]+)`", comments) if (TRANSFORMERS / f"{n}.json").exists()
    }


def status(name: str) -> int:
    return recording(TRANSFORMERS, name)[0]


def body(name: str) -> str:
    return recording(TRANSFORMERS, name)[2]


def test_every_transformers_entry_cites_recordings_that_exist() -> None:
    assert cited() >= {
        "cb_whisper_json", "espeak_verbose_json", "espeak_srt", "espeak_stream", "translations",
        "long_audio", "whisper_chat", "cb_audio_lm_chat_audio", "cb_audio_lm_transcription",
        "audio_lm_transcription", "chat_transcription_json", "chat_transcription_stream",
    }  # fmt: skip


@pytest.mark.parametrize("mode", [CB, SEQ])
def test_whisper_rows_match_the_recordings(mode: Mode) -> None:
    caps = capability_set(Engine.TRANSFORMERS, mode, WHISPER)
    assert caps is not None
    # Transcribes in both modes: continuous batching does not refuse it.
    assert status("cb_whisper_json") == 200 and json.loads(body("cb_whisper_json"))["text"]
    assert C.TRANSCRIPTIONS in caps.capabilities
    # Only {"text"}, whatever the format: no segments, json is all it renders.
    assert json.loads(body("espeak_verbose_json")).keys() == {"text"}
    assert C.SEGMENT_TIMESTAMPS not in caps.capabilities and caps.native_formats == {"json"}
    # Streams bare text deltas.
    assert (
        body("espeak_stream").startswith("data:  speech\n\n")
        and table.PROFILE.serves[WHISPER].stream_dialect == "raw-text"
    )
    assert C.STREAM in caps.capabilities
    # No translations route, no chat for Whisper.
    assert status("translations") == 404 and C.TRANSLATIONS not in caps.capabilities
    assert status("whisper_chat") == 500 and C.CHAT not in caps.capabilities
    # 30 s at most; one at a time.
    assert caps.max_audio_seconds == 30 and caps.max_concurrency == 1


@pytest.mark.parametrize("mode", [CB, SEQ])
def test_audio_lm_rows_match_the_recordings(mode: Mode) -> None:
    caps = capability_set(Engine.TRANSFORMERS, mode, AUDIO_LM)
    assert caps is not None
    assert status("cb_audio_lm_chat_audio") == 200 and C.CHAT in caps.capabilities
    assert status("cb_audio_lm_chat_stream") == 200 and C.STREAM in caps.capabilities
    # Its transcription endpoint fails on their processors in both modes...
    assert status("cb_audio_lm_transcription") == status("audio_lm_transcription") == 500
    # ...so transcriptions go through chat: plain text, streamed as chat chunks.
    assert C.TRANSCRIPTIONS in caps.capabilities
    assert table.PROFILE.serves[AUDIO_LM].asked == Asked.CHAT
    assert status("chat_transcription_json") == 200
    assert json.loads(body("chat_transcription_json"))["object"] == "chat.completion"
    stream = body("chat_transcription_stream")
    assert '"object":"chat.completion.chunk"' in stream and '"finish_reason"' in stream
    assert table.PROFILE.serves[AUDIO_LM].stream_dialect == "chat-chunk"
    assert not caps.native_formats
    assert C.SEGMENT_TIMESTAMPS not in caps.capabilities
    assert C.TRANSLATIONS not in caps.capabilities


def test_only_transformers_serves_audio_language_models() -> None:
    assert capability_set(Engine.VLLM, CB, AUDIO_LM) is None
    assert capability_set(Engine.FASTER_WHISPER, SEQ, AUDIO_LM) is None
    assert family_engines(AUDIO_LM) == [Engine.TRANSFORMERS]
    # No engine chats with a Whisper model.
    assert not any(C.CHAT in c.capabilities for c in capability_sets(WHISPER).values())


def test_route_table_names_the_model_transformers_workers_accept() -> None:
    td = make_td({"model": {"name": "openai/whisper-small", "aliases": ["whisper-1"],
                            "revision": "v2"}, "engine": "transformers",
                  "traffic": {"endpoints": ["transcriptions", "translations"]}})  # fmt: skip
    table = route_table(td, plan(td.spec))
    assert [(p.name, p.engine, p.family, p.worker_model) for p in table.pools] == [
        ("default", Engine.TRANSFORMERS, WHISPER, "openai/whisper-small@v2"),
        ("auto-faster-whisper", Engine.FASTER_WHISPER, WHISPER, None),
    ]
    # Weights in the image or on a claim: the path the worker loaded.
    for model, expected in [
        ({"source": "image", "path": "/models/whisper-small"}, "/models/whisper-small"),
        ({"source": "pvc", "claimName": "w", "path": "whisper/small"}, "/weights/whisper/small"),
    ]:
        td = make_td({"model": {"name": "whisper-small", **model}, "engine": "transformers"})
        assert route_table(td, plan(td.spec)).pools[0].worker_model == expected
    # The frontend reads what the operator wrote.
    again = RouteTable.model_validate_json(table.dumps())
    assert again == table and again.pools[0].capabilities == {C.TRANSCRIPTIONS, C.STREAM}


def test_route_table_family_decides_the_pool_capabilities() -> None:
    pool = PoolRoute(name="chat", engine=Engine.TRANSFORMERS, mode=CB, service="s",
                     family=AUDIO_LM, worker_model="/models/qwen2-audio")  # fmt: skip
    assert pool.capabilities == {C.CHAT, C.TRANSCRIPTIONS, C.STREAM}
    bad = PoolRoute(name="x", engine=Engine.VLLM, mode=CB, service="s", family=AUDIO_LM)
    with pytest.raises(ValueError, match=r"vllm/continuous \(audio-lm\) is not a valid pool"):
        _ = bad.capabilities
