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


# The speaker stage's model (CAM++ exported to ONNX, `SPEAKER_MODEL_FILE` in it), an OCI
# image mounted read-only by the pools that run the stage (traffic feature diarization).
SPEAKER_MODEL_IMAGE = f"{REGISTRY}/speaker-campplus:{VERSION}"
SPEAKER_MODEL_FILE = "campplus.onnx"


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
    # The API server as pods reach it once the `kubernetes` Service is translated: (address,
    # port) pairs, which the frontends' egress policies admit. From API_SERVER_ENDPOINTS
    # (`ip:port,...`: the chart's networkPolicy.apiServerEndpoints), else read from that
    # Service's EndpointSlices at start; none known: any address on 443 and 6443.
    api_server: tuple[tuple[str, int], ...] = ()
    # The speaker model's image (SPEAKER_MODEL_IMAGE: the chart's defaultImages.speakerModel).
    speaker_model: str = SPEAKER_MODEL_IMAGE

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
            api_server=tuple(
                endpoint(e) for e in e.get("API_SERVER_ENDPOINTS", "").split(",") if e.strip()
            ),
            speaker_model=e.get("SPEAKER_MODEL_IMAGE") or base.speaker_model,
        )


def endpoint(text: str) -> tuple[str, int]:
    """`10.0.0.1:6443` or `[fd00::1]:6443` as (address, port)."""
    address, _, port = text.strip().rpartition(":")
    return address.strip("[]"), int(port)
