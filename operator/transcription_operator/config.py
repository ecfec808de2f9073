"""Operator settings, from environment variables (the Helm chart sets them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from transcription_api.capabilities import Engine

FIELD_MANAGER = "transcription-operator"
# The image key of faster-whisper pools with GPUs (CTranslate2 with the CUDA libraries).
FASTER_WHISPER_CUDA = "faster-whisper-cuda"
VERSION = "0.1.0"


@dataclass(frozen=True)
class OperatorConfig:
    images: dict[Engine | str, str] = field(
        default_factory=lambda: {
            "frontend": f"ghcr.io/transcription-dev/frontend:{VERSION}",
            Engine.VLLM: f"ghcr.io/transcription-dev/worker-vllm:{VERSION}",
            Engine.FASTER_WHISPER: f"ghcr.io/transcription-dev/worker-cpu:{VERSION}",
            FASTER_WHISPER_CUDA: f"ghcr.io/transcription-dev/worker-cuda:{VERSION}",
            Engine.TRANSFORMERS: f"ghcr.io/transcription-dev/worker-transformers:{VERSION}",
        }
    )
    pull_policy: str = "IfNotPresent"
    cluster_domain: str = "cluster.local"
    # Namespaces to watch; empty means all namespaces.
    namespaces: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorConfig:
        e = dict(os.environ if env is None else env)
        base = cls()
        images = dict(base.images)
        for key, var in (
            ("frontend", "FRONTEND_IMAGE"),
            (Engine.VLLM, "VLLM_IMAGE"),
            (Engine.FASTER_WHISPER, "FASTER_WHISPER_IMAGE"),
            (FASTER_WHISPER_CUDA, "FASTER_WHISPER_CUDA_IMAGE"),
            (Engine.TRANSFORMERS, "TRANSFORMERS_IMAGE"),
        ):
            if e.get(var):
                images[key] = e[var]
        namespaces = tuple(n.strip() for n in e.get("WATCH_NAMESPACES", "").split(",") if n.strip())
        return cls(
            images=images,
            pull_policy=e.get("IMAGE_PULL_POLICY", base.pull_policy),
            cluster_domain=e.get("CLUSTER_DOMAIN", base.cluster_domain),
            namespaces=namespaces,
        )
