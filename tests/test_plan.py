"""The automatic split: which pools a resource runs for the traffic it declares."""

from __future__ import annotations

from transcription_api.capabilities import Capability, Engine, Mode, traffic_needs
from transcription_api.engines import Asked
from transcription_api.v1alpha1 import TranscriptionDeploymentSpec
from transcription_operator.plan import plan


def spec(**kw: object) -> TranscriptionDeploymentSpec:
    return TranscriptionDeploymentSpec.model_validate({"model": {"name": "m"}, **kw})


def summary(s: TranscriptionDeploymentSpec) -> list[tuple[str, str, str, bool]]:
    return [(p.name, p.engine.value, p.mode.value, p.automatic) for p in plan(s).pools]


def test_default_pool_is_continuous_for_vllm_and_faster_whisper() -> None:
    assert summary(spec()) == [("default", "vllm", "continuous", False)]
    assert summary(spec(engine="faster-whisper")) == [
        ("default", "faster-whisper", "continuous", False)
    ]


def test_needs_are_each_endpoint_alone_and_with_each_feature() -> None:
    s = spec(traffic={"endpoints": ["transcriptions", "translations"], "features": ["stream"]})
    T, TR, S = Capability.TRANSCRIPTIONS, Capability.TRANSLATIONS, Capability.STREAM
    assert traffic_needs(s.traffic.endpoints, s.traffic.features) == [
        frozenset({T}), frozenset({T, S}), frozenset({TR}), frozenset({TR, S}),
    ]  # fmt: skip


def test_vllm_covers_plain_traffic_without_a_split() -> None:
    s = spec(
        traffic={
            "endpoints": ["transcriptions", "translations"],
            "features": ["stream", "segment_timestamps"],
        }
    )
    p = plan(s)
    assert not p.automatic
    assert not p.uncovered


def test_transformers_whisper_transcribes_in_continuous_mode_without_a_split() -> None:
    """transformers serve 5.24 runs a Whisper transcription on its sequential generation
    thread even under --continuous-batching (recorded: cb_whisper_json): no split needed."""
    s = spec(
        engine="transformers", pools=[{"name": "chat", "replicas": 3, "resources": {"gpus": 1}}]
    )
    assert summary(s) == [("chat", "transformers", "continuous", False)]
    assert not plan(s).uncovered


def test_chat_and_transcriptions_depend_on_the_model_family() -> None:
    """Whisper cannot chat, in either mode: no sequential pool would help, so nothing is
    added and the need is uncovered. An audio LM serves both from one pool (it transcribes
    through chat), so one deployment takes chat and transcription traffic as declared."""
    traffic = {"endpoints": ["chat", "transcriptions"], "features": ["stream"]}
    CH, S = Capability.CHAT, Capability.STREAM
    whisper = plan(spec(engine="transformers", traffic=traffic))
    assert not whisper.automatic
    assert whisper.uncovered == [frozenset({CH}), frozenset({CH, S})]
    audio_lm = plan(spec(engine="transformers", traffic=traffic,
                         model={"name": "m", "family": "audio-lm"}))  # fmt: skip
    assert not audio_lm.automatic and not audio_lm.uncovered
    assert len(audio_lm.pools) == 1


def test_audio_lm_chat_and_transcription_are_covered_in_both_modes() -> None:
    for mode in ("continuous", "sequential"):
        s = spec(engine="transformers", model={"name": "m", "family": "audio-lm"},
                 pools=[{"name": "chat", "mode": mode}],
                 traffic={"endpoints": ["chat", "transcriptions"], "features": ["stream"]})  # fmt: skip
        p = plan(s)
        assert not p.automatic and not p.uncovered
        caps = p.pools[0].capabilities
        assert caps.capabilities == {Capability.CHAT, Capability.TRANSCRIPTIONS, Capability.STREAM}
        assert p.pools[0].serving.asked == Asked.CHAT


def test_chat_needs_take_only_the_features_chat_can_use() -> None:
    s = spec(traffic={"endpoints": ["chat"], "features": ["stream", "word_timestamps"]})
    CH, S = Capability.CHAT, Capability.STREAM
    assert traffic_needs(s.traffic.endpoints, s.traffic.features) == [
        frozenset({CH}),
        frozenset({CH, S}),
    ]


def test_word_timestamps_on_vllm_split_to_faster_whisper() -> None:
    s = spec(traffic={"features": ["word_timestamps", "stream"]}, autoSplit={"replicas": 2})
    p = plan(s)
    assert [(x.name, x.engine, x.mode) for x in p.automatic] == [
        ("auto-faster-whisper", Engine.FASTER_WHISPER, Mode.SEQUENTIAL)
    ]
    assert p.automatic[0].covers == frozenset(
        {Capability.TRANSCRIPTIONS, Capability.WORD_TIMESTAMPS}
    )
    assert p.automatic[0].spec.replicas == 2


def test_translations_on_transformers_split_to_faster_whisper() -> None:
    s = spec(engine="transformers", traffic={"endpoints": ["transcriptions", "translations"]})
    p = plan(s)
    # transformers serve has no translations route (recorded: 404).
    assert [x.name for x in p.automatic] == ["auto-faster-whisper"]
    assert p.automatic[0].covers == frozenset({Capability.TRANSLATIONS})


def test_one_automatic_pool_serves_several_needs() -> None:
    s = spec(traffic={"endpoints": ["transcriptions", "translations"],
                      "features": ["word_timestamps"]})  # fmt: skip
    p = plan(s)
    assert [x.name for x in p.automatic] == ["auto-faster-whisper"]
    assert p.automatic[0].covers == frozenset(
        {Capability.TRANSCRIPTIONS, Capability.TRANSLATIONS, Capability.WORD_TIMESTAMPS}
    )


def test_declared_pool_that_covers_the_traffic_prevents_the_split() -> None:
    s = spec(
        traffic={"features": ["word_timestamps"]},
        pools=[
            {"name": "batch"},
            {"name": "words", "engine": "faster-whisper", "mode": "sequential"},
        ],
    )
    assert not plan(s).automatic


def test_split_disabled_leaves_the_need_uncovered() -> None:
    s = spec(traffic={"features": ["word_timestamps"]}, autoSplit={"enabled": False})
    p = plan(s)
    assert not p.automatic
    assert p.uncovered == [frozenset({Capability.TRANSCRIPTIONS, Capability.WORD_TIMESTAMPS})]


def test_automatic_pool_name_avoids_declared_names() -> None:
    s = spec(traffic={"features": ["word_timestamps"]}, pools=[{"name": "auto-faster-whisper"}])
    assert [x.name for x in plan(s).automatic] == ["auto-faster-whisper-x"]


def test_the_added_pool_requests_no_more_gpus_than_its_engine_uses() -> None:
    """faster-whisper runs on one device: a 4-GPU tensor-parallel vLLM pool does not make
    its word-timestamp pool hold four."""
    big = {"gpus": 4, "cpu": "16", "memory": "64Gi", "gpuResourceName": "nvidia.com/mig-3g.40gb"}
    s = spec(traffic={"features": ["word_timestamps"]}, pools=[{"name": "tp", "resources": big}])
    auto = plan(s).automatic[0]
    assert auto.engine == Engine.FASTER_WHISPER
    r = auto.spec.resources
    assert (r.gpus, r.cpu, r.memory, r.gpu_resource_name) == (
        1,
        "16",
        "64Gi",
        "nvidia.com/mig-3g.40gb",
    )
    # A CPU pool stays on CPUs, and autoSplit.resources wins over the default.
    assert (
        plan(spec(traffic={"features": ["word_timestamps"]})).automatic[0].spec.resources.gpus == 0
    )
    s = spec(traffic={"features": ["word_timestamps"]}, pools=[{"name": "tp", "resources": big}],
             autoSplit={"resources": {"cpu": "2"}})  # fmt: skip
    assert plan(s).automatic[0].spec.resources.model_dump(exclude_defaults=True) == {"cpu": "2"}


def test_diarization_runs_the_speaker_stage_on_faster_whisper_pools_declared_or_added() -> None:
    """vLLM has no speaker stage: the split adds a faster-whisper pool that runs it (and
    transcribes); a faster-whisper deployment's own pools run it; without the feature, no
    pool does."""
    traffic = {"features": ["diarization"]}
    p = plan(spec(traffic=traffic))
    assert summary(spec(traffic=traffic)) == [
        ("default", "vllm", "continuous", False),
        ("auto-faster-whisper", "faster-whisper", "sequential", True),
    ]
    [auto] = p.automatic
    assert auto.speakers and Capability.DIARIZATION in auto.capabilities.capabilities
    assert auto.reason == "added for traffic needing diarization, transcriptions"
    assert not p.pools[0].speakers and not p.uncovered
    own = plan(spec(engine="faster-whisper", traffic=traffic))
    assert [(x.name, x.speakers, x.automatic) for x in own.pools] == [("default", True, False)]
    assert not any(x.speakers for x in plan(spec(engine="faster-whisper")).pools)
    # Without the split, nothing covers it: said, not guessed.
    off = plan(spec(traffic=traffic, autoSplit={"enabled": False}))
    assert off.uncovered == [frozenset({Capability.TRANSCRIPTIONS, Capability.DIARIZATION})]
