"""What the engine images' launchers share: read the settings the operator wrote
(TRANSCRIPTION_WORKER_SETTINGS), turn them into the engine's command line, check what can be
checked before a model is loaded, and replace the process with the engine's server.

    <launcher>            exec the engine's server
    <launcher> --print    print the command instead

A launcher is one `Launcher`: its command line, the engine's own check of it, and how the
server is started: the vLLM and the transformers launchers are the two.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from transcription_api.worker import WorkerSettings

from ..localmodel import in_format


class LaunchError(ValueError):
    """Settings the engine cannot start with; the message says what to change."""


def exec_command(settings: WorkerSettings, args: list[str]) -> NoReturn:
    """Replace this process with the command, found on PATH."""
    os.execvp(args[0], args)


@dataclass(frozen=True)
class Launcher:
    prog: str  # the entry point's name
    doc: str  # its --help
    command: Callable[[WorkerSettings], list[str]]  # the command line; raises LaunchError
    check: Callable[[list[str]], object]  # the engine's own parser, where it is installed
    warnings: Callable[[WorkerSettings], list[str]] = lambda s: []  # settings it ignores
    start: Callable[[WorkerSettings, list[str]], NoReturn] = exec_command
    print_help: str = "print the command, do not run it"
    # The weights format it reads, where the model directory keeps several engines' formats
    # in subdirectories (localmodel): it takes its own. None: the directory as it is
    # (`transformers serve` answers to the path it was given, which the route table names).
    weights: str | None = None

    def main(self, argv: list[str] | None = None) -> int:
        p = argparse.ArgumentParser(prog=self.prog, description=self.doc)
        p.add_argument("--print", action="store_true", help=self.print_help)
        opts = p.parse_args(argv)
        try:
            settings = WorkerSettings.from_env()
            if self.weights:
                settings = settings.model_copy(
                    update={"model": in_format(settings.model, self.weights)}
                )
            args = self.command(settings)
            self.check(args)
        except (LaunchError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for w in self.warnings(settings):
            print(f"warning: {w}", file=sys.stderr)
        if opts.print:
            print(shlex.join(args))
            return 0
        print(f"starting: {shlex.join(args)}", file=sys.stderr, flush=True)
        self.start(settings, args)
