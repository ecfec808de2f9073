"""Who spoke when, for real (issue 35): a faster-whisper deployment whose traffic declares
`diarization` on the test bed's real node. The speaker model (CAM++ exported to ONNX) is
packed into an OCI image as a release packs it and imported into the node's containerd; the
chart's `defaultImages.speakerModel` names it, and the pool mounts it as an image volume.
The official OpenAI client asks the frontend's Service for `diarized_json` on a real
two-voice espeak-ng conversation: speakers, known speakers by their references, a stream.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.audio import TranscriptionDiarized

from testbed.kube import SAMPLES
from testbed.kubectl import Kubectl
from testbed.operators import deployed_on_the_real_node
from testbed.weights import speaker_model_on_the_node
from testkit import conversations
from testkit.conversations import Conversation
from testkit.scrape import pods_metric

NAME = "whisper-cpu"


@pytest.fixture(scope="module")
def speaker_image(tmp_path_factory: pytest.TempPathFactory, real_node: str) -> str:
    return speaker_model_on_the_node(tmp_path_factory.mktemp("speakers"))


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Conversation:
    spec = conversations.specs("two", 1)[0]
    return conversations.conversation(spec, tmp_path_factory.mktemp("conversations"))


def resource() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(SAMPLES["cpu-faster-whisper"]))
    doc["spec"]["pools"][0]["resources"]["cpu"] = "500m"
    doc["spec"]["traffic"]["features"].append("diarization")
    return doc


@pytest.fixture(scope="module")
def client(
    kubectl: Kubectl, cluster: Path, speaker_image: str, crd_installed: None
) -> Iterator[tuple[openai.OpenAI, str]]:
    extra = ("--set", f"defaultImages.speakerModel={speaker_image}")
    with deployed_on_the_real_node(kubectl, cluster, resource(), "diar", "diar-operator",
                                   timeout=300, extra=extra) as (ns, _, _):  # fmt: skip
        url = kubectl.service_url(ns, NAME)
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120), ns


def test_the_pool_mounts_the_speaker_model_and_the_route_table_says_so(
    kubectl: Kubectl, client: tuple[openai.OpenAI, str], speaker_image: str
) -> None:
    _, ns = client
    [pod] = kubectl.pods(ns, NAME, "worker")
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "speakers"]
    assert volume["image"]["reference"] == speaker_image
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["SPEAKER_MODEL"] == "/speakers/campplus.onnx"
    routes = kubectl.json("get", "configmap", f"{NAME}-routes", "-n", ns)["data"]["routes.json"]
    assert [p["speakers"] for p in json.loads(routes)["pools"]] == [True]


def test_who_said_what_through_the_service(
    client: tuple[openai.OpenAI, str], two: Conversation
) -> None:
    c, _ = client
    with two.wav.open("rb") as f:
        answer = c.audio.transcriptions.create(
            model="whisper-1", file=f, response_format="diarized_json"
        )
    assert isinstance(answer, TranscriptionDiarized), type(answer)
    first = two.turns[0].speaker
    other = next(t.speaker for t in two.turns if t.speaker != first)
    share = conversations.right_share(two, answer.segments, {"A": first, "B": other})
    print(f"diarized_json on the real node: {len(answer.segments)} segments, "
          f"{share:.0%} with the right speaker")  # fmt: skip
    assert {s.speaker for s in answer.segments} == {"A", "B"}
    assert share >= 0.9, answer.segments


def test_known_speakers_and_a_stream_through_the_service(
    client: tuple[openai.OpenAI, str], two: Conversation
) -> None:
    c, _ = client
    names = {"Ann": "S1", "Bob": "S2"}
    refs = [
        "data:audio/wav;base64," + base64.b64encode(two.references[s].read_bytes()).decode()
        for s in names.values()
    ]
    with two.wav.open("rb") as f:
        stream = c.audio.transcriptions.create(
            model="whisper-1", file=f, response_format="diarized_json", stream=True,
            known_speaker_names=list(names), known_speaker_references=refs,
        )  # fmt: skip
        events = list(stream)
    assert events[-1].type == "transcript.text.done"
    segments = events[:-1]
    assert {e.type for e in segments} == {"transcript.text.segment"}
    assert {e.speaker for e in segments} == {"Ann", "Bob"}  # type: ignore[union-attr]
    assert conversations.right_share(two, segments, names) >= 0.9


def chunked_requests(kubectl: Kubectl, ns: str) -> float:
    """The frontends' count of requests cut into chunks."""
    pods = kubectl.pods(ns, NAME, "frontend")
    return sum(pods_metric(pods, "transcription_frontend_chunked_requests_total").values())


def test_a_long_file_in_chunks_keeps_one_label_per_voice(
    kubectl: Kubectl, client: tuple[openai.OpenAI, str], tmp_path: Path
) -> None:
    """About a minute of two voices with `chunking_strategy`: the transcript is cut into
    chunks, the speakers come from one clustering over the whole file, so a voice keeps its
    label from the first chunk to the last."""
    c, ns = client
    talk = conversations.conversation(conversations.long_two(), tmp_path)
    before = chunked_requests(kubectl, ns)
    with talk.wav.open("rb") as f:
        answer = c.audio.transcriptions.create(
            model="whisper-1", file=f, response_format="diarized_json", chunking_strategy="auto"
        )
    assert isinstance(answer, TranscriptionDiarized), type(answer)
    assert chunked_requests(kubectl, ns) == before + 1
    first = talk.turns[0].speaker
    other = next(t.speaker for t in talk.turns if t.speaker != first)
    share = conversations.right_share(talk, answer.segments, {"A": first, "B": other})
    print(f"diarized in chunks on the real node: {talk.duration:.0f} s, "
          f"{len(answer.segments)} segments, {share:.0%} with the right speaker")  # fmt: skip
    assert {s.speaker for s in answer.segments} == {"A", "B"}, answer.segments
    assert share >= 0.9, answer.segments
    assert answer.segments[-1].end > talk.duration - 10, answer.segments[-1]
