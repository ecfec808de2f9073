"""One profile per engine: each profile is complete, and every component reads it."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic.alias_generators import to_camel

from transcription_api.capabilities import Engine, ModelFamily
from transcription_api.engines import (
    PROFILES,
    Asked,
    capability_set,
    capability_sets,
    family_engines,
    supported_modes,
)
from transcription_api.v1alpha1 import ImagesSpec
from transcription_operator.config import IMAGES, OperatorConfig

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "transcription-operator"


def test_one_profile_per_engine_in_the_enums_order() -> None:
    assert list(PROFILES) == list(Engine)
    assert all(p.engine == e for e, p in PROFILES.items())
    for p in PROFILES.values():
        assert p.serves, f"{p.engine} serves no model family"
        assert all(s.modes for s in p.serves.values())


def test_the_lookups_are_views_of_the_profiles() -> None:
    for family in ModelFamily:
        pairs = capability_sets(family)
        assert list(dict.fromkeys(e for e, _ in pairs)) == family_engines(family)
        for (engine, mode), caps in pairs.items():
            assert capability_set(engine, mode, family) is caps
            assert mode in supported_modes(engine)


def test_every_image_is_named_where_the_operator_reads_it() -> None:
    """Each profile's image keys: a `spec.images` field overrides it, the chart sets the
    operator's default (the same as the operator's own), a Dockerfile builds it."""
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())["defaultImages"]
    defaults = OperatorConfig().images
    for image in IMAGES:
        assert image.field in ImagesSpec.model_fields, image
        camel = to_camel(image.field)
        assert f"name: {image.env}, value: {{{{ .Values.defaultImages.{camel} |" in deployment
        assert values[camel] == defaults[image.key], image
        assert defaults[image.key].split("/")[-1].startswith(image.repository + ":"), image
        assert (ROOT / image.dockerfile).is_file(), image
    env = {i.env: f"registry.local/{i.key}:1" for i in IMAGES}
    assert OperatorConfig.from_env(env).images == {
        i.key: f"registry.local/{i.key}:1" for i in IMAGES
    }


def test_only_audio_language_models_are_asked_through_chat() -> None:
    for p in PROFILES.values():
        for family, serving in p.serves.items():
            assert (serving.asked == Asked.CHAT) == (family == ModelFamily.AUDIO_LM)
