"""`spec.model`: the model every pool serves and where its weights come from."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field

from ..capabilities import ModelFamily
from ..schema import CrdModel, Rule, validations
from ..units import QUANTITY
from .containers import SecretKeyRef

# Names clients send as `model`: hub ids ("openai/whisper-large-v3") and simple aliases.
MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$"
MAX_ALIASES = 16


class WeightsSource(StrEnum):
    HUB = "hub"
    PVC = "pvc"
    IMAGE = "image"


class CacheSpec(CrdModel):
    """Where downloaded weights are cached on the worker."""

    size_limit: str = Field(
        default="50Gi",
        description="Size limit of the cache volume (an emptyDir unless claimName is set).",
        pattern=QUANTITY,
    )
    claim_name: str | None = Field(
        default=None,
        description="Use this PersistentVolumeClaim as the cache, shared across restarts.",
        max_length=253,
    )


MODEL_RULES: list[Rule[ModelSpec]] = [
    Rule(
        "self.source != 'pvc' || (has(self.claimName) && has(self.path))",
        "model.source 'pvc' needs model.claimName and model.path",
        lambda m: m.source != WeightsSource.PVC or bool(m.claim_name and m.path),
    ),
    Rule(
        "self.source != 'image' || has(self.path)",
        "model.source 'image' needs model.path (the weights' directory in the image)",
        lambda m: m.source != WeightsSource.IMAGE or bool(m.path),
    ),
    Rule(
        "!has(self.aliases) || self.aliases.all(a, self.aliases.exists_one(b, b == a))",
        "model.aliases must be unique",
        lambda m: len(set(m.aliases)) == len(m.aliases),
        field_path=".aliases",
    ),
    Rule(
        "!has(self.aliases) || !self.aliases.exists(a, a == self.name)",
        "model.aliases must not repeat model.name",
        lambda m: m.name not in m.aliases,
        field_path=".aliases",
    ),
    Rule(
        "!has(self.transcriptionPrompt) || (has(self.family) && self.family == 'audio-lm')",
        "model.transcriptionPrompt applies to family audio-lm only (a Whisper model "
        "transcribes without one)",
        lambda m: m.transcription_prompt is None or m.family == ModelFamily.AUDIO_LM,
        field_path=".transcriptionPrompt",
    ),
]


class ModelSpec(CrdModel):
    """The model every pool serves, where its weights come from, and its aliases."""

    model_config = ConfigDict(json_schema_extra=validations(MODEL_RULES))

    name: str = Field(
        description="Model name clients send as `model`, and the hub id the weights are "
        "fetched from when source is 'hub' (e.g. openai/whisper-large-v3-turbo).",
        max_length=200,
        pattern=MODEL_NAME,
    )
    revision: str | None = Field(
        default=None,
        description="Hub revision (branch, tag or commit) to fetch; default: the hub's main.",
        max_length=100,
    )
    aliases: list[Annotated[str, Field(max_length=200, pattern=MODEL_NAME)]] = Field(
        default_factory=list,
        description="Other names clients may send as `model` (e.g. whisper-1); they "
        "resolve to `name`.",
        max_length=MAX_ALIASES,
    )
    source: WeightsSource = Field(
        default=WeightsSource.HUB,
        description="Where weights come from: 'hub' (downloaded into the cache volume), "
        "'pvc' (a directory on a PersistentVolumeClaim) or 'image' (baked into the worker "
        "image).",
    )
    path: str | None = Field(
        default=None,
        description="Directory of the weights: within the claim for 'pvc', in the image for "
        "'image'.",
        max_length=1024,
    )
    claim_name: str | None = Field(
        default=None,
        description="PersistentVolumeClaim holding the weights (source 'pvc'); mounted read-only.",
        max_length=253,
    )
    hub_token_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding a hub token for gated or private models (HF_TOKEN).",
    )
    cache: CacheSpec = Field(
        default_factory=CacheSpec, description="The model cache volume of the workers."
    )
    family: ModelFamily = Field(
        default=ModelFamily.WHISPER,
        description="What kind of model it is, which decides what each engine serves with it: "
        "'whisper' (speech-to-text: the audio endpoints) or 'audio-lm' (a chat model that "
        "takes audio input, e.g. Qwen2-Audio or Voxtral: chat completions, and "
        "transcriptions through chat; engine transformers only).",
    )
    transcription_prompt: str | None = Field(
        default=None,
        description="Family audio-lm: the instruction sent with the audio to transcribe it "
        "through chat, e.g. Qwen2-Audio's 'Detect the language and recognize the speech: "
        "<|en|>'. Default: 'Transcribe the speech in this audio verbatim. Answer with the "
        "transcript only.' A request's `language` and `prompt` are added to it.",
        min_length=1,
        max_length=2000,
    )

    @property
    def served_names(self) -> list[str]:
        return [self.name, *self.aliases]
