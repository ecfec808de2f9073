"""Imports between the repository's top-level folders run one way only.

Bottom to top: the deployables (api, operator, frontend, worker) stand alone; `toolchain`
(the pinned Go tools) uses nothing of the project; `testkit` (test helpers) uses the
deployables and `toolchain`, never the test bed; `testbed` sits above them; the suites and
the benchmarks on top. The release scripts (`release`, `charts`) use `toolchain` alone of
the test support. Every import counts, a function's lazy one too (read with `ast`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Top-level import name -> the folder (layer) it lives in.
DEPLOYABLES = {
    "transcription_api": "api",
    "transcription_operator": "operator",
    "transcription_frontend": "frontend_image",
    "transcription_worker": "worker_image",
}
SUPPORT = ("toolchain", "testkit", "testbed", "tests", "e2e", "bench", "release", "charts")
LAYER = {**DEPLOYABLES, **{name: name for name in SUPPORT}}
EVERYTHING = set(LAYER.values())
# Folder -> the folders it may import from (itself always).
ALLOWED: dict[str, set[str]] = {
    "api": set(),
    "operator": {"api"},
    "frontend_image": {"api"},
    "worker_image": {"api"},
    "toolchain": set(),
    "testkit": {*DEPLOYABLES.values(), "toolchain"},
    "testbed": {*DEPLOYABLES.values(), "toolchain", "testkit"},
    "release": {"toolchain"},
    "charts": {"toolchain", "release"},
    "tests": EVERYTHING - {"e2e", "bench"},
    "e2e": EVERYTHING - {"tests", "bench"},
    "bench": EVERYTHING - {"tests", "e2e"},
}
# What runs before the virtual environment exists (`make testbed-*`, the release workflow):
# the standard library alone.
STDLIB_ONLY = ("toolchain", "testkit.host", "testbed.cluster", "testbed.__main__",
               "release.chart", "release.version", "release.images", "charts.render_install")  # fmt: skip


def sources() -> list[tuple[str, Path]]:
    """Every Python file of a top-level folder, with that folder."""
    return [
        (folder, path)
        for folder in ALLOWED
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not {".venv", "node_modules"} & set(path.parts)
    ]


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, top-level name) of every absolute import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def upward() -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{line} imports {name} ({LAYER[name]}/)"
        for folder, path in sources()
        for line, name in imported(path)
        if name in LAYER and LAYER[name] != folder and LAYER[name] not in ALLOWED[folder]
    ]


def test_every_folder_has_its_rule() -> None:
    folders = {
        p.name for p in ROOT.iterdir()
        if p.is_dir() and not p.name.startswith(".") and any(p.rglob("*.py"))
    }  # fmt: skip
    assert folders <= set(ALLOWED), sorted(folders - set(ALLOWED))


def test_no_import_runs_upward() -> None:
    assert upward() == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from testbed.cluster import up\n")
    assert imported(module) == [(1, "os"), (4, "testbed")]


def test_what_runs_before_the_virtual_environment_needs_only_the_standard_library() -> None:
    """Without site-packages (`python -S`), so that a third-party import fails."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); " + "; ".join(
        f"import {m}" for m in STDLIB_ONLY
    )
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
