"""Model weights as an OCI image, for `spec.model.source: oci`.

    python -m transcription_api.weights pack DIR IMAGE [--path SUB] (--archive FILE | --push)

packs a model directory into an image built FROM scratch: one layer holding the directory's
files (under SUB, default the root), labelled with what it holds, and nothing to run. Every
pool mounts it read-only through an image volume and reads `spec.model.path` in it. The
image is built with buildah (Debian's `buildah`, the builder podman uses), then written to
an OCI archive (`--archive`: for `ctr images import`, or to copy into a registry with
`skopeo copy oci-archive:FILE docker://IMAGE`) or pushed (`--push`: buildah's registry
login and credentials). It prints the reference pinned by the manifest's digest, the value
for `spec.model.image`.

The same with other tools: `tar -C DIR -cf - . | crane append -f - -t IMAGE` (go-containerregistry's
crane) builds the same one-layer image. `oras push` makes an OCI *artifact* whose layers
are not file systems: CRI-O mounts those too, containerd mounts only images.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from .v1alpha1.model import OCI_REFERENCE

LABEL = "dev.transcription.weights"  # the label naming the files the image holds


class PackError(Exception):
    """What is wrong with the directory, the reference or the builder, and what to do."""


def check_directory(directory: Path) -> list[Path]:
    """The files to pack; PackError when the directory cannot serve as weights."""
    if not directory.is_dir():
        raise PackError(f"{directory} is not a directory: give the model's directory")
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    if not files:
        raise PackError(f"{directory} holds no files: nothing to pack")
    for p in [directory, *directory.rglob("*")]:
        mode = p.stat().st_mode
        others = stat.S_IROTH | (stat.S_IXOTH if p.is_dir() else 0)
        if mode & others != others:
            raise PackError(
                f"{p} is not readable by every user (mode {stat.filemode(mode)}): the pools "
                f"run as a non-root user; run `chmod -R a+rX {directory}` first"
            )
    return files


def check_reference(image: str) -> None:
    if not re.fullmatch(OCI_REFERENCE, image):
        raise PackError(
            f"{image!r} is not an image reference (registry/repository:tag, lower case, no "
            "scheme): e.g. registry.example.com/models/whisper-tiny.en:v1"
        )
    if "@" in image:
        raise PackError(f"{image!r} names a digest: give a tag; the digest is the build's")


def _buildah(*args: str) -> str:
    proc = subprocess.run(["buildah", *args], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise PackError(f"buildah {args[0]} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()


def pack(directory: Path, image: str, *, path: str = "", archive: Path | None = None,
         push: bool = False) -> str:  # fmt: skip
    """Build the image, write or push it; the reference pinned by digest."""
    files = check_directory(directory)
    check_reference(image)
    if (archive is None) == (not push):
        raise PackError("say where the image goes: --archive FILE or --push")
    if shutil.which("buildah") is None:
        raise PackError("buildah is needed to build the image: apt-get install buildah")
    target = "/" + path.strip("/")
    container = _buildah("from", "--quiet", "scratch")
    try:
        _buildah("copy", "--quiet", container, str(directory), target)
        held = [str(Path(target) / f.relative_to(directory)) for f in files]
        _buildah("config", "--label", f"{LABEL}={json.dumps(held[:50])}",
                 "--label", f"org.opencontainers.image.title={image}", container)  # fmt: skip
        _buildah("commit", "--quiet", "--rm", container, image)
    except PackError:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        raise
    with tempfile.TemporaryDirectory() as tmp:
        digestfile = Path(tmp) / "digest"
        dest = f"oci-archive:{archive}:{image}" if archive is not None else f"docker://{image}"
        _buildah("push", "--quiet", "--digestfile", str(digestfile), image, dest)
        digest = digestfile.read_text().strip()
    repository = image.rsplit(":", 1)[0] if ":" in image.split("/")[-1] else image
    return f"{repository}@{digest}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transcription_api.weights", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("pack", help="pack a model directory into an OCI image")
    p.add_argument(
        "directory", type=Path, help="the model's directory (its files, as the engine reads them)"
    )
    p.add_argument("image", help="the image's reference with a tag: registry/repository:tag")
    p.add_argument(
        "--path",
        default="",
        help="where the files go in the image (default: its root); spec.model.path",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--archive", type=Path, help="write an OCI archive (for ctr images import)")
    where.add_argument("--push", action="store_true", help="push it to its registry")
    args = parser.parse_args(argv)
    try:
        pinned = pack(args.directory, args.image, path=args.path, archive=args.archive,
                      push=args.push)  # fmt: skip
    except PackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(pinned)
    print(f"spec.model: {{source: oci, image: {pinned}"
          + (f", path: {args.path.strip('/')}" if args.path.strip("/") else "") + "}",
          file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
