"""Every image a release builds: from which Dockerfile, with which build arguments, for which
platforms.

The Dockerfiles and build arguments are the ones the test bed builds (``testbed/images.py``;
only ``BASE_IMAGE`` differs: the test bed gives its own Debian base, a release the Dockerfile's
default public base). ``tests/test_release.py`` holds this table to the test bed's and to the
images the operator runs (``transcription_operator.config.IMAGES``).

    python -m release.images matrix --owner OWNER   the release workflow's build matrix (JSON)
    python -m release.images list                   one line per image, with its platforms
    python -m release.images sbom SBOM.json PLATFORM
        the SPDX document of one platform, from `docker buildx imagetools inspect
        --format '{{ json .SBOM }}'` (what the workflow attests with cosign)
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release import cli

REGISTRY = "ghcr.io"
DEFAULT_OWNER = "transcription-dev"
BOTH = ("linux/amd64", "linux/arm64")
AMD64 = ("linux/amd64",)


@dataclass(frozen=True)
class ReleaseImage:
    name: str  # its repository under ghcr.io/<owner>/ ("worker-cuda")
    dockerfile: str  # from the repository root, which is the build context
    platforms: tuple[str, ...] = BOTH
    build_args: dict[str, str] = field(default_factory=dict)
    # Why a platform is missing; empty when it builds for both.
    amd64_only: str = ""


IMAGES = (
    ReleaseImage("operator", "operator/Dockerfile"),
    ReleaseImage("frontend", "frontend_image/Dockerfile"),
    # samples/cpu-faster-whisper.yaml serves the Whisper tiny.en baked into /models.
    ReleaseImage("worker-cpu", "worker_image/Dockerfile.cpu", build_args={"BAKE_MODEL": "1"}),
    ReleaseImage(
        "worker-cuda",
        "worker_image/Dockerfile.cuda",
        AMD64,
        amd64_only="CTranslate2's aarch64 wheels are built without CUDA: an arm64 image "
        "could not decode on a GPU",
    ),
    ReleaseImage(
        "worker-vllm",
        "worker_image/Dockerfile.vllm",
        AMD64,
        amd64_only="built on vLLM's CUDA image (vllm/vllm-openai), used here on x86_64 only "
        "(the vLLM recordings and the real-vLLM checks are all x86_64)",
    ),
    ReleaseImage(
        "worker-vllm-cpu",
        "worker_image/Dockerfile.vllm-cpu",
        AMD64,
        {"BAKE_MODEL": "1"},
        amd64_only="its base, vLLM's CPU image, is tagged per architecture "
        "(vllm/vllm-openai-cpu:v<version>-x86_64)",
    ),
    ReleaseImage(
        "worker-transformers",
        "worker_image/Dockerfile.transformers",
        build_args={"BAKE_MODEL": "1"},
    ),
)
NAMES = tuple(i.name for i in IMAGES)
# Images the release packs from files, not from a Dockerfile (`python -m
# transcription_api.weights pack`, the workflow's `speakers` job) and that the chart names.
PACKED = ("speaker-campplus",)
RELEASED = NAMES + PACKED  # every image a release publishes that install.yaml names


def by_name(name: str) -> ReleaseImage:
    for image in IMAGES:
        if image.name == name:
            return image
    raise ValueError(f"no release image is named {name!r} (the images: {', '.join(NAMES)})")


def registry(owner: str = DEFAULT_OWNER) -> str:
    """Where a repository owner's images go: GHCR names are lowercase."""
    owner = owner.strip().lower()
    if not owner or "/" in owner:
        raise ValueError(f"{owner!r} is not a GitHub owner (a user or organisation name)")
    return f"{REGISTRY}/{owner}"


def matrix(owner: str = DEFAULT_OWNER) -> dict[str, list[dict[str, str]]]:
    """The release workflow's build matrix: one entry per image (strings only, as
    docker/build-push-action takes them)."""
    prefix = registry(owner)
    return {
        "include": [
            {
                "name": i.name,
                "image": f"{prefix}/{i.name}",
                "dockerfile": i.dockerfile,
                "platforms": ",".join(i.platforms),
                "build-args": "\n".join(f"{k}={v}" for k, v in i.build_args.items()),
            }
            for i in IMAGES
        ]
    }


def spdx(sbom: object, platform: str) -> dict[str, Any]:
    """The SPDX document of ``platform`` in what ``imagetools inspect --format '{{ json .SBOM
    }}'`` prints: ``{"SPDX": ...}`` for one platform, ``{"<platform>": {"SPDX": ...}}`` for
    several."""
    if isinstance(sbom, dict) and isinstance(sbom.get(platform), dict):
        sbom = sbom[platform]
    doc = sbom.get("SPDX") if isinstance(sbom, dict) else None
    if not isinstance(doc, dict):
        keys = ", ".join(sorted(sbom)) if isinstance(sbom, dict) else type(sbom).__name__
        raise ValueError(
            f"no SPDX document for {platform} in the SBOM (it holds: {keys or 'nothing'})"
        )
    if not str(doc.get("spdxVersion", "")).startswith("SPDX-"):
        raise ValueError(f"the SBOM of {platform} is not an SPDX document (no spdxVersion)")
    return doc


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("python -m release.images", __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("matrix", help="the build matrix as one line of JSON")
    m.add_argument("--owner", default=DEFAULT_OWNER, help="the GitHub owner (GHCR namespace)")
    sub.add_parser("list", help="one line per image")
    sb = sub.add_parser("sbom", help="one platform's SPDX document from imagetools' SBOM")
    sb.add_argument("sbom", type=Path)
    sb.add_argument("platform", help="linux/amd64")
    args = p.parse_args(argv)

    def sbom() -> None:
        print(json.dumps(spdx(json.loads(args.sbom.read_text()), args.platform)))

    def build_matrix() -> None:
        print(json.dumps(matrix(args.owner), separators=(",", ":")))

    if args.command == "sbom":
        return cli.run(sbom, OSError, ValueError, about=str(args.sbom))
    if args.command == "matrix":
        return cli.run(build_matrix, ValueError)
    for i in IMAGES:
        why = f" ({i.amd64_only})" if i.amd64_only else ""
        print(f"{i.name:20} {i.dockerfile:36} {','.join(i.platforms)}{why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
