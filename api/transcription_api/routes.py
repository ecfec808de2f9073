"""The route table: what the operator tells the frontend, in one model for writer and reader.

The operator writes it as `routes.json` in a ConfigMap mounted into the frontend; for local
runs the same file lists static endpoints per pool. A deployment's own frontend reads one
deployment's `RouteTable`; a TranscriptionGateway's frontend reads `Routes`, the tables of
every deployment it routes to (the frontend accepts either file).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .capabilities import Capability, CapabilitySet, Engine, Mode, ModelFamily, with_speakers
from .engines import EnginePool

ROUTES_KEY = "routes.json"
# What an audio language model is asked with the audio, when it transcribes through chat.
DEFAULT_TRANSCRIPTION_PROMPT = (
    "Transcribe the speech in this audio verbatim. Answer with the transcript only."
)


class PoolRoute(BaseModel, EnginePool):
    """One pool as the frontend sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Pool name.")
    engine: Engine = Field(description="Engine of the pool.")
    mode: Mode = Field(description="Batching mode.")
    service: str = Field(description="Service name; its EndpointSlices list the workers.")
    port: int = Field(default=8000, description="Worker HTTP port.")
    automatic: bool = Field(default=False, description="Added by the automatic split.")
    family: ModelFamily = Field(
        default=ModelFamily.WHISPER,
        description="Kind of model the pool runs; with engine and mode, decides its capabilities.",
    )
    worker_model: str | None = Field(
        default=None,
        description="The `model` value this pool's workers accept. Set for engines without "
        "aliases (transformers serve answers to the name it loaded, nothing else): the "
        "frontend replaces the request's `model` with it. None: the workers answer to every "
        "served name.",
    )
    transcription_prompt: str | None = Field(
        default=None,
        description="The instruction sent with the audio where the pool transcribes through "
        "chat (an audio language model); None: DEFAULT_TRANSCRIPTION_PROMPT.",
    )
    english_only: bool = Field(
        default=False,
        description="Its model is an English-only Whisper checkpoint (`*.en`): the frontend "
        "refuses another `language`, and names English to engines that cannot detect it.",
    )
    max_in_flight_per_replica: int | None = Field(
        default=None,
        description="Requests the frontend sends one endpoint at once; more wait in the "
        "frontend's queue, in fair order (hold.py). None: no bound (local runs).",
    )
    endpoints: list[str] = Field(
        default_factory=list,
        description="Static worker base URLs (local runs); empty in a cluster, where "
        "EndpointSlices of `service` are watched instead.",
    )

    speakers: bool = Field(
        default=False,
        description="Its workers run the speaker stage too (capability diarization: POST "
        "/v1/audio/diarization), for response_format diarized_json.",
    )

    @property
    def capability_set(self) -> CapabilitySet:
        return with_speakers(self.serving.modes[self.mode], self.speakers)

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.capability_set.capabilities


class RouteTable(BaseModel):
    """Models, aliases and pools of one TranscriptionDeployment."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Primary model name.")
    aliases: list[str] = Field(default_factory=list, description="Names resolving to `model`.")
    namespace: str = Field(default="default", description="Namespace of the pool Services.")
    pools: list[PoolRoute] = Field(default_factory=list, description="Pools in routing order.")
    max_upload_bytes: int = Field(default=26_214_400, description="Upload limit of the frontend.")
    deployment: str | None = Field(
        default=None,
        description="`<namespace>/<name>` of the TranscriptionDeployment the table is of "
        "(`owned_by` in /v1/models); None in a deployment's own frontend.",
    )

    @property
    def served_names(self) -> list[str]:
        return [self.model, *self.aliases]

    def resolve(self, name: str | None) -> str | None:
        """Primary model for a requested name (None/empty: the primary); None if unknown."""
        if not name or name in self.served_names:
            return self.model
        return None

    def dumps(self) -> str:
        # `deployment` only where a gateway's table sets it: a deployment's own table is
        # written as it always was.
        unset = {"deployment"} if self.deployment is None else None
        return self.model_dump_json(indent=2, exclude=unset)


class RefusedDeployment(BaseModel):
    """A deployment a gateway selected but does not route to, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deployment: str = Field(description="`<namespace>/<name>` of the TranscriptionDeployment.")
    names: list[str] = Field(default_factory=list, description="The names it claims.")
    reason: str = Field(description="CamelCase reason: NameConflict, NotPermitted, InvalidSpec.")
    message: str = Field(description="Why, naming the other resource where there is one.")


class Routes(BaseModel):
    """What a TranscriptionGateway's frontend serves: the route tables of every deployment it
    routes to, each model name (primary or alias) claimed by one of them only. Pool names are
    unique across the tables (the operator qualifies them with their deployment)."""

    model_config = ConfigDict(extra="forbid")

    deployments: list[RouteTable] = Field(
        default_factory=list, description="One table per routed deployment."
    )
    refused: list[RefusedDeployment] = Field(
        default_factory=list,
        description="Deployments selected but not routed, so that a request for one of their "
        "names can say why.",
    )
    max_upload_bytes: int = Field(default=26_214_400, description="Upload limit of the frontend.")

    @model_validator(mode="after")
    def _unique(self) -> Routes:
        pools = [p.name for t in self.deployments for p in t.pools]
        if len(pools) != len(set(pools)):
            raise ValueError(f"pool names must be unique across deployments: {sorted(pools)}")
        names = [n for t in self.deployments for n in t.served_names]
        if len(names) != len(set(names)):
            raise ValueError(f"a model name is claimed twice: {sorted(names)}")
        return self

    def dumps(self) -> str:
        return self.model_dump_json(indent=2)


def is_english_only(*names: str | None) -> bool:
    """Whisper's convention: the English-only checkpoints are named `*.en`
    (openai/whisper-tiny.en, distil-whisper/distil-small.en), by hub id or directory."""
    return any(n and n.rstrip("/").lower().endswith(".en") for n in names)
