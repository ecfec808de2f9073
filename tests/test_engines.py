"""One profile per engine, one adapter per engine: each profile is complete, every component
reads it, and the frontend has an adapter for every way an engine is asked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from pydantic.alias_generators import to_camel

from transcription_api.capabilities import Engine, Mode, ModelFamily
from transcription_api.engines import (
    PROFILES,
    Asked,
    ErrorDialect,
    capability_set,
    capability_sets,
    family_engines,
    supported_modes,
)
from transcription_api.routes import PoolRoute
from transcription_api.v1alpha1 import ImagesSpec
from transcription_frontend.adapters import ADAPTERS, adapter
from transcription_frontend.forward import WorkerAnswer
from transcription_frontend.respond import worker_error
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


def test_every_way_an_engine_is_asked_has_an_adapter() -> None:
    asked = {(p.engine, s.asked) for p in PROFILES.values() for s in p.serves.values()}
    assert asked == set(ADAPTERS)
    for p in PROFILES.values():
        for family, serving in p.serves.items():
            for mode in serving.modes:
                pool = PoolRoute(name="p", engine=p.engine, mode=mode, service="s", family=family)
                assert isinstance(adapter(pool), ADAPTERS[p.engine, serving.asked])


def test_only_audio_language_models_are_asked_through_chat() -> None:
    for p in PROFILES.values():
        for family, serving in p.serves.items():
            assert (serving.asked == Asked.CHAT) == (family == ModelFamily.AUDIO_LM)


# --------------------------------------------------------------------------- error dialects


def answer(status: int, body: Any) -> WorkerAnswer:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    pool = PoolRoute(name="p", engine=Engine.VLLM, mode=Mode.CONTINUOUS, service="s")
    response: Any = SimpleNamespace(status=status, headers={})
    return WorkerAnswer(pool, "http://w", response, body=raw)


def read(status: int, body: Any, dialect: ErrorDialect) -> tuple[int, str]:
    e = asyncio.run(worker_error(answer(status, body), dialect))
    return e.status, e.message


VLLM_CAP = {"error": {"message": "Maximum file size exceeded (parameter=audio_filesize_mb)",
                      "type": "BadRequestError", "param": "audio_filesize_mb", "code": 400}}  # fmt: skip


@pytest.mark.parametrize("dialect", list(ErrorDialect))
def test_openai_errors_read_alike_in_every_dialect(dialect: ErrorDialect) -> None:
    body = {"error": {"message": "bad language", "type": "BadRequestError", "param": "language"}}
    assert read(400, body, dialect) == (400, "bad language")
    status, message = read(500, b"Internal Server Error", dialect)
    assert status == 502 and message.endswith("(500: Internal Server Error); check that the "
                                              "file is valid audio, then retry")  # fmt: skip


def test_vllms_upload_cap_is_a_413_in_its_dialect_only() -> None:
    assert read(400, VLLM_CAP, ErrorDialect.VLLM)[0] == 413
    assert read(400, VLLM_CAP, ErrorDialect.OPENAI)[0] == 400


def test_fastapi_details_and_422s_read_as_openais_400s() -> None:
    detail = {"detail": "Unexpected fields in the request: {'foo'}"}
    for dialect in (ErrorDialect.FASTAPI, ErrorDialect.VLLM):
        assert read(422, detail, dialect) == (400, detail["detail"])
    assert read(404, {"detail": "Not Found"}, ErrorDialect.FASTAPI) == (404, "Not Found")
    assert read(422, detail, ErrorDialect.OPENAI)[0] == 502  # not a shape it answers in
