"""What the command lines of the release and chart scripts share: the parser, a refused
input said in one line (``error: ...`` on stderr, exit status 2), and a generated file
written, or with ``--check`` compared (exit status 1 when it is stale).

Only the standard library is used (see ``release``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring, as written."""
    return argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def run(action: Callable[[], int | None], *refused: type[Exception], about: str = "") -> int:
    """`action`'s exit status (None: 0); 2 when it raises one of `refused`, whose message
    (after `about`, what was refused, if given) goes to stderr."""
    try:
        return action() or 0
    except refused as e:
        print(f"error: {about}: {e}" if about else f"error: {e}", file=sys.stderr)
        return 2


def generated(path: Path, text: str, check: bool, command: str) -> int:
    """Write a generated file (`text`) to `path` and say so; with `check`, write nothing and
    exit 1, naming the `command` that regenerates it, when the file is not `text`."""
    if check:
        if path.read_text() != text:
            print(f"{path} is stale: run `{command}`", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}", file=sys.stderr)
    return 0
