"""Fixtures for the fast tests (no cluster); their helpers live in ``testkit``."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from testkit.frontend import AUDIO_LM_MODEL, PRIMARY, SERVED, Frontend, pool
from testkit.resources import make_td
from testkit.standins import Behaviour, Running, serve, start, transformers_app, vllm_app
from transcription_api.capabilities import Engine, Mode
from transcription_api.routes import RouteTable
from transcription_api.telemetry import quiet_this_process
from transcription_api.v1alpha1 import TranscriptionDeployment
from transcription_worker.allocator import keep_large_blocks

# The gateways, workers and operators the suites start report to no vendor.
quiet_this_process()
# What the suites decode in their own processes, they decode with the worker's allocator
# settings (transcription_worker/allocator.py).
keep_large_blocks()

# The transformers suite needs torch and transformers: it runs in its own environment
# (`make test-transformers`, its own environment) and is not collected without them.
collect_ignore = [] if importlib.util.find_spec("transformers") else ["transformers_engine"]


@pytest.fixture
def vllm_td() -> TranscriptionDeployment:
    return make_td(
        {
            "model": {"name": "openai/whisper-large-v3-turbo", "aliases": ["whisper-1"]},
            "engine": "vllm",
            "pools": [
                {"name": "batch", "mode": "continuous", "replicas": 2, "resources": {"gpus": 1}}
            ],
            "frontend": {"replicas": 2},
        }
    )


# The stand-in engine a module's `worker` fixture serves: `pytestmark =
# pytest.mark.standin("transformers")` picks one; vLLM's by default.
STANDINS = {
    "vllm": lambda b: vllm_app(SERVED, b),
    "transformers": lambda b: transformers_app(b),  # Whisper, as transformers serve loads it
    "audio-lm": lambda b: transformers_app(b, model=AUDIO_LM_MODEL, family="audio-lm"),
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "standin(engine): the stand-in the worker fixture serves")


@pytest.fixture
def worker(request: pytest.FixtureRequest) -> Iterator[tuple[Running, Behaviour]]:
    """A stand-in worker over real HTTP and the behaviour a test gives it."""
    marker = request.node.get_closest_marker("standin")
    b = Behaviour()
    with serve(STANDINS[marker.args[0] if marker else "vllm"](b)) as running:
        yield running, b


@pytest.fixture
def transformers_worker() -> Iterator[tuple[Running, Behaviour]]:
    """A stand-in `transformers serve` with Whisper, beside a module's vLLM `worker`."""
    b = Behaviour()
    with serve(STANDINS["transformers"](b)) as running:
        yield running, b


@pytest.fixture
def frontend(worker: tuple[Running, Behaviour]) -> Iterator[Frontend]:
    """The gateway in-process, with one continuous pool `batch` on the module's `worker`."""
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe = Frontend(table)
    yield fe
    fe.running.stop()


@pytest.fixture
def with_faster_whisper(worker: tuple[Running, Behaviour]) -> Iterator[tuple[Frontend, Behaviour]]:
    """vLLM first (pool `batch`) and a faster-whisper pool `fw`, both on the module's
    `worker`: for requests only faster-whisper serves."""
    fw = pool("fw", [worker[0].url], engine=Engine.FASTER_WHISPER, mode=Mode.SEQUENTIAL)
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"],
                       pools=[pool("batch", [worker[0].url]), fw])  # fmt: skip
    fe = Frontend(table)
    yield fe, worker[1]
    fe.running.stop()


@pytest.fixture(scope="module")
def cpu_worker() -> Iterator[Running]:
    """The real CPU worker (faster-whisper, Whisper tiny.en) over real HTTP."""
    from transcription_worker.batcher import Lane
    from transcription_worker.main import default_model
    from transcription_worker.server import WorkerConfig
    from transcription_worker.server import create_app as worker_app
    from transcription_worker.transcriber import Transcriber

    lane = Lane(Transcriber(default_model(), threads=2), max_queue=16)
    names = ["whisper-tiny.en", "whisper-1"]
    running = start(worker_app(WorkerConfig(served_names=names, model_path="tiny.en"), lane))
    yield running
    running.stop()
