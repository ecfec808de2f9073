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
    OCI = "oci"


# An OCI reference as a container's `image` takes it: [registry/]repository[:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
OCI_REFERENCE = (
    rf"^{_COMPONENT}(?::[0-9]+)?(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)


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
        "self.source != 'oci' || has(self.image)",
        "model.source 'oci' needs model.image (the OCI image or artifact holding the weights)",
        lambda m: m.source != WeightsSource.OCI or bool(m.image),
    ),
    Rule(
        "!has(self.image) || self.source == 'oci'",
        "model.image applies to source 'oci' only (source 'image' bakes the weights into the "
        "worker image: spec.pools[].image)",
        lambda m: m.image is None or m.source == WeightsSource.OCI,
        field_path=".image",
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
        "'pvc' (a directory on a PersistentVolumeClaim), 'image' (baked into the worker "
        "image) or 'oci' (an OCI image or artifact, `image`, mounted read-only in every "
        "pool as an image volume: Kubernetes 1.35+, or 1.33+ with the ImageVolume feature "
        "gate, and containerd 2.1+ or CRI-O 1.31+).",
    )
    path: str | None = Field(
        default=None,
        description="Directory of the weights: within the claim for 'pvc', in the worker "
        "image for 'image', within the OCI image for 'oci' (default: its root).",
        max_length=1024,
    )
    image: str | None = Field(
        default=None,
        description="Source 'oci': the OCI image or artifact holding the weights, as a "
        "container's `image` takes it (registry/repository:tag@sha256:digest). Pin it by "
        "digest: a tag can move under running pools, and a digest makes each rollout "
        "explicit. Pulled with the pool's image pull secrets; pack a model directory into "
        "one with `python -m transcription_api.weights pack`.",
        max_length=512,
        pattern=OCI_REFERENCE,
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
