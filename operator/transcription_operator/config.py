"""Operator settings, from environment variables (the Helm chart sets them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from transcription_api.engines import Image, images

FIELD_MANAGER = "transcription-operator"
VERSION = "0.1.0"
REGISTRY = "ghcr.io/transcription-dev"
FRONTEND_IMAGE = Image("frontend", "frontend", "frontend_image/Dockerfile")
# Every image the operator runs: the frontend's, and each engine's (their profiles name them).
IMAGES = (FRONTEND_IMAGE, *images())


def default_images() -> dict[str, str]:
    """Image references by key, as this operator version ships them."""
    return {i.key: f"{REGISTRY}/{i.repository}:{VERSION}" for i in IMAGES}


@dataclass(frozen=True)
class OperatorConfig:
    images: dict[str, str] = field(default_factory=default_images)  # by Image.key
    pull_policy: str = "IfNotPresent"
    cluster_domain: str = "cluster.local"
    # Namespaces to watch; empty means all namespaces.
    namespaces: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorConfig:
        e = dict(os.environ if env is None else env)
        base = cls()
        images = dict(base.images)
        for image in IMAGES:
            if e.get(image.env):
                images[image.key] = e[image.env]
        namespaces = tuple(n.strip() for n in e.get("WATCH_NAMESPACES", "").split(",") if n.strip())
        return cls(
            images=images,
            pull_policy=e.get("IMAGE_PULL_POLICY", base.pull_policy),
            cluster_domain=e.get("CLUSTER_DOMAIN", base.cluster_domain),
            namespaces=namespaces,
        )
