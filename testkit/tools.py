"""The pinned checker binaries (helm, actionlint, promtool) for the suites that run them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolchain import Tool


def built(tool: Tool, binary: str) -> Path:
    """A pinned tool's binary; a test without it skips here, and fails in CI, where `make
    test` builds every tool first."""
    path = tool.path(binary)
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{binary} is not built: `python -m testbed build` builds it")
        pytest.skip(f"{binary} is not built (python -m testbed build)")
    return path
