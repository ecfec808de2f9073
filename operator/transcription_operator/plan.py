"""Which pools a resource runs: the declared ones plus the automatic sequential split.

Pure functions of the spec. The traffic a resource declares becomes a list of *needs*
(an endpoint alone, and the endpoint with each declared feature). A need that no pool's
capability set covers gets a sequential pool added for it: the default engine in
sequential mode when that covers it, else the first fallback engine that does. A need
nothing can cover is reported, and ends in the `Degraded` condition.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transcription_api.capabilities import (
    Capability,
    CapabilitySet,
    Engine,
    Mode,
    ModelFamily,
    covered,
    traffic_needs,
    with_speakers,
)
from transcription_api.engines import SPLIT_FALLBACK_ENGINES, EnginePool, capability_set, profile
from transcription_api.v1alpha1 import (
    PoolSpec,
    ResourcesSpec,
    TranscriptionDeploymentSpec,
    default_mode,
)

DEFAULT_POOL = "default"


@dataclass(frozen=True)
class PlannedPool(EnginePool):
    """A pool as it will run: engine and mode resolved."""

    spec: PoolSpec
    engine: Engine
    mode: Mode
    automatic: bool = False
    covers: frozenset[Capability] = frozenset()  # for automatic pools: the need it serves
    family: ModelFamily = ModelFamily.WHISPER
    speakers: bool = False  # its workers run the speaker stage (capability diarization)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def capabilities(self) -> CapabilitySet:  # plan() only yields pools their engines serve
        return with_speakers(self.capability_set, self.speakers)

    @property
    def max_in_flight_per_replica(self) -> int:
        """Requests the frontend sends one replica at once: the pool's own bound, else its
        engine's; a faster-whisper continuous pool's is twice its batch size (one batch
        decoding, the next waiting at the worker)."""
        if self.spec.max_in_flight_per_replica is not None:
            return self.spec.max_in_flight_per_replica
        if self.profile.decoding_settings and self.mode == Mode.CONTINUOUS:
            return 2 * self.spec.max_batch_size
        return self.capabilities.max_in_flight_per_replica

    @property
    def reason(self) -> str | None:
        if not self.automatic:
            return None
        return "added for traffic needing " + ", ".join(sorted(self.covers))


@dataclass(frozen=True)
class Plan:
    pools: list[PlannedPool]
    uncovered: list[frozenset[Capability]] = field(default_factory=list)

    @property
    def automatic(self) -> list[PlannedPool]:
        return [p for p in self.pools if p.automatic]

    def serves(self, needs: frozenset[Capability]) -> bool:
        """Whether some pool of the plan covers a request with these needs."""
        return covered((p.capabilities for p in self.pools), needs)


def diarized(spec: TranscriptionDeploymentSpec) -> bool:
    """Whether the traffic asks who spoke when: then every pool whose engine can run the
    speaker stage does."""
    return Capability.DIARIZATION.value in spec.traffic.features


def declared_pools(spec: TranscriptionDeploymentSpec) -> list[PlannedPool]:
    pools = spec.pools or [PoolSpec(name=DEFAULT_POOL)]
    out = []
    for p in pools:
        engine = spec.pool_engine(p)
        mode = p.mode or default_mode(engine)
        speakers = diarized(spec) and profile(engine).speaker_stage
        out.append(PlannedPool(spec=p, engine=engine, mode=mode, family=spec.model.family,
                               speakers=speakers))  # fmt: skip
    return out


def describe(need: frozenset[Capability]) -> str:
    """'transcriptions with word_timestamps'"""
    endpoints = (Capability.TRANSCRIPTIONS, Capability.TRANSLATIONS, Capability.CHAT)
    endpoint = next(c for c in need if c in endpoints)
    rest = sorted(need - {endpoint})
    return endpoint.value + (" with " + ", ".join(rest) if rest else "")


def plan(spec: TranscriptionDeploymentSpec) -> Plan:
    declared = declared_pools(spec)
    pools = list(declared)
    uncovered: list[frozenset[Capability]] = []
    split_needs: list[frozenset[Capability]] = []
    taken = {p.name for p in pools}
    for need in traffic_needs(spec.traffic.endpoints, spec.traffic.features):
        if any(p.capabilities.covers(need) for p in declared):
            continue
        split_needs.append(need)
        if any(p.capabilities.covers(need) for p in pools):
            continue  # an automatic pool added for an earlier need covers this one too
        family = spec.model.family
        engine = (
            _split_engine(spec.engine, need, family, diarized(spec))
            if spec.auto_split.enabled
            else None
        )
        if engine is None:
            uncovered.append(need)
            continue
        name = f"auto-{engine.value}"
        while name in taken:
            name += "-x"
        taken.add(name)
        pools.append(
            PlannedPool(
                spec=_split_pool_spec(spec, name, engine, declared[0].spec.resources),
                engine=engine,
                mode=Mode.SEQUENTIAL,
                automatic=True,
                family=family,
                speakers=diarized(spec) and profile(engine).speaker_stage,
            )
        )
    # Say what each automatic pool is there for: the needs no declared pool covers.
    pools = [
        p
        if not p.automatic
        else PlannedPool(
            spec=p.spec,
            engine=p.engine,
            mode=p.mode,
            automatic=True,
            covers=frozenset().union(*(n for n in split_needs if p.capabilities.covers(n))),
            family=p.family,
            speakers=p.speakers,
        )
        for p in pools
    ]
    return Plan(pools=pools, uncovered=uncovered)


def _split_engine(
    default: Engine, need: frozenset[Capability], family: ModelFamily, diarized: bool
) -> Engine | None:
    for engine in (default, *SPLIT_FALLBACK_ENGINES):
        caps = capability_set(engine, Mode.SEQUENTIAL, family)
        speakers = diarized and profile(engine).speaker_stage
        if caps is not None and with_speakers(caps, speakers).covers(need):
            return engine
    return None


def split_resources(source: ResourcesSpec, engine: Engine) -> ResourcesSpec:
    """What an added pool requests by default: the resources of the pool it splits from, with
    no more GPUs than its engine can use (a faster-whisper replica uses one, not the four a
    tensor-parallel vLLM replica needs)."""
    usable = profile(engine).usable_gpus
    if usable is None or source.gpus <= usable:
        return source
    return source.model_copy(update={"gpus": usable})


def _split_pool_spec(
    spec: TranscriptionDeploymentSpec, name: str, engine: Engine, resources: ResourcesSpec
) -> PoolSpec:
    return PoolSpec(
        name=name,
        engine=engine,
        mode=Mode.SEQUENTIAL,
        replicas=spec.auto_split.replicas,
        resources=spec.auto_split.resources or split_resources(resources, engine),
    )
