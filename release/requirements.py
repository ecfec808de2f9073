"""Print the project's requirements, its base and the named extras, one per line, from
pyproject.toml: `python requirements.py worker > requirements.txt`; with `--only NAME`, only
that package's (`python requirements.py worker --only faster-whisper`: its pin).

The Dockerfiles install these in a layer of their own before they copy the source, so an
image rebuilt after a change to the source (and not to pyproject.toml) reuses that layer.
Only the standard library: it runs on a bare Python base image, before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(
            f"no extra {', '.join(unknown)} in {pyproject}: one of {', '.join(optional)}"
        )
    out = list(project.get("dependencies", []))
    for extra in extras:
        out += [r for r in optional[extra] if r not in out]
    return out


def main(argv: list[str]) -> str:
    parser = argparse.ArgumentParser(description="The project's requirements, a line each.")
    parser.add_argument("extras", nargs="*", help="the extras, besides the base")
    parser.add_argument("--only", metavar="NAME", help="only this package's requirement")
    args = parser.parse_args(argv)
    found = requirements(Path("pyproject.toml"), args.extras)
    if args.only:
        found = [r for r in found if re.match(rf"{re.escape(args.only)}\b(?![-_.])", r)]
        if not found:
            raise SystemExit(
                f"{args.only} is not a requirement of {' '.join(args.extras) or 'the base'}"
            )
    return "\n".join(found)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
