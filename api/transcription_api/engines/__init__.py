"""The engine profiles: each engine's facts in one place (`engines/<engine>.py`), and the
lookups every component makes through them.

Adding an engine means one profile here, one frontend adapter
(frontend_image/transcription_frontend/adapters/), one launcher and one Dockerfile
(worker_image/): docs/development/adding-an-engine.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..capabilities import CapabilitySet, Engine, Mode, ModelFamily
from . import faster_whisper, transformers, vllm
from .profile import Asked, EngineProfile, ErrorDialect, Image, Serving, StreamDialect

__all__ = [
    "PROFILES",
    "SPLIT_FALLBACK_ENGINES",
    "Asked",
    "EnginePool",
    "EngineProfile",
    "ErrorDialect",
    "Image",
    "Serving",
    "StreamDialect",
    "capability_set",
    "capability_sets",
    "family_engines",
    "images",
    "profile",
    "serving",
    "supported_modes",
]

PROFILES: dict[Engine, EngineProfile] = {
    p.engine: p for p in (vllm.PROFILE, faster_whisper.PROFILE, transformers.PROFILE)
}

# Engines the automatic split may add, in order of preference, after the pool's own engine.
SPLIT_FALLBACK_ENGINES = (Engine.FASTER_WHISPER,)


def profile(engine: Engine) -> EngineProfile:
    return PROFILES[engine]


def serving(engine: Engine, mode: Mode, family: ModelFamily) -> Serving:
    """How an engine serves a model family; ValueError when it cannot serve the family in
    that mode (the operator never writes such a pool)."""
    found = PROFILES[engine].serving(family)
    if found is None or mode not in found.modes:
        raise ValueError(f"{engine}/{mode} ({family}) is not a valid pool")
    return found


def capability_set(
    engine: Engine, mode: Mode, family: ModelFamily = ModelFamily.WHISPER
) -> CapabilitySet | None:
    """The capability set of a pair for a model family, or None when the engine cannot run
    in that mode or cannot serve that family at all."""
    return PROFILES[engine].capability_set(mode, family)


def capability_sets(family: ModelFamily) -> dict[tuple[Engine, Mode], CapabilitySet]:
    """Every (engine, mode) pair that serves a model family, with its capability set."""
    return {
        (p.engine, mode): caps
        for p in PROFILES.values()
        if (serving := p.serving(family)) is not None
        for mode, caps in serving.modes.items()
    }


def family_engines(family: ModelFamily) -> list[Engine]:
    """Engines that can serve a model family at all."""
    return [p.engine for p in PROFILES.values() if p.serving(family) is not None]


def supported_modes(engine: Engine) -> list[Mode]:
    return PROFILES[engine].modes


def images() -> list[Image]:
    """Every worker image, once each."""
    return list(dict.fromkeys(i for p in PROFILES.values() for i in (p.cpu_image, p.gpu_image)))


class EnginePool:
    """A pool's facts from its engine's profile, for a class that has the pool's `engine`,
    `mode` and `family` (the route table's pools, the operator's planned ones)."""

    if TYPE_CHECKING:
        engine: Engine
        mode: Mode
        family: ModelFamily

    @property
    def profile(self) -> EngineProfile:
        return PROFILES[self.engine]

    @property
    def serving(self) -> Serving:
        """How the pool's engine serves its model family."""
        return serving(self.engine, self.mode, self.family)

    @property
    def capability_set(self) -> CapabilitySet:
        return self.serving.modes[self.mode]
