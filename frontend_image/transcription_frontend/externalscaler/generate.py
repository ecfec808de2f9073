"""Regenerate the Python messages of `externalscaler.proto` (`make protos`).

The output is committed, so the frontend needs no code generator at run time; the pinned
grpcio-tools (dev extra) makes it reproducible, and tests/test_scaler.py regenerates it
into a temporary folder and fails when the committed files differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent.parent  # frontend_image/: the import root, so imports are absolute
PROTO = HERE / "externalscaler.proto"
OUTPUTS = ("externalscaler_pb2.py", "externalscaler_pb2.pyi")


def generate(out: Path) -> list[Path]:
    """Write the generated files under `out` (laid out as under frontend_image/)."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # dev extra only

    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        str(PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    rel = HERE.relative_to(ROOT)
    return [out / rel / name for name in OUTPUTS]


if __name__ == "__main__":
    for path in generate(ROOT):
        print(f"wrote {path}")
    sys.exit(0)
