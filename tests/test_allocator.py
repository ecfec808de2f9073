"""The faster-whisper worker keeps the large blocks a decode frees
(transcription_worker/allocator.py): a block freed and allocated again costs no page
faults, unless the deployment set glibc's allocator itself, whose settings then stay."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from testkit import host, processes
from testkit.audio import SENTENCES, speak
from transcription_worker import allocator


@pytest.mark.parametrize(
    ("env", "chosen"),
    [
        ({}, False),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, True),
        ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, False),  # not the allocator's
        ({"MALLOC_ARENA_MAX": "2"}, True),
        ({"MALLOC_MMAP_THRESHOLD_": "131072"}, True),
        ({"LD_PRELOAD": "libjemalloc.so.2"}, False),  # glibc's settings then do nothing
    ],
    ids=["nothing", "tunable", "another tunable", "arena max", "mmap threshold", "preload"],
)
def test_the_environment_says_whether_the_allocator_was_chosen(
    env: dict[str, str], chosen: bool
) -> None:
    assert allocator.set_by_user(env) is chosen


def test_settings_from_the_environment_stay_and_libc_is_not_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("libc loaded although the environment chose")

    monkeypatch.setattr(ctypes, "CDLL", refuse)
    assert allocator.keep_large_blocks({"MALLOC_ARENA_MAX": "2"}) is False


def test_a_missing_c_library_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*_: object) -> None:
        raise OSError("no C library")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert allocator.keep_large_blocks({}) is False


# 48 MiB, allocated, written and freed 20 times: a size between glibc's 32 MiB maximum
# threshold and LIMIT, as a decode's are.
CYCLES = """
import resource, sys
from transcription_worker import allocator
print(allocator.keep_large_blocks(), file=sys.stderr)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    block = bytearray(48 * 2**20)
    del block
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(env: dict[str, str]) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-c", CYCLES], capture_output=True, text=True,
                         env=env, check=True)  # fmt: skip
    return int(out.stdout), out.stderr.strip()


def test_a_large_block_freed_is_reused_without_page_faults() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    kept, applied = faults(env)
    glibc, left = faults({**env, "MALLOC_PERTURB_": "0"})  # glibc's default, named
    assert (applied, left) == ("True", "False")
    # Kept: the first block's pages, once. glibc's: every block's, every time.
    assert kept * 5 < glibc, (kept, glibc)


def test_the_worker_process_decodes_without_mapping_its_blocks_again(tmp_path: Path) -> None:
    """The real worker, as its pod starts it: after its first request, a request costs a
    few hundred page faults (64,000 with glibc's defaults, `python -m bench allocator`)."""
    port = host.free_port()
    url = f"http://127.0.0.1:{port}"
    proc = processes.start(
        [str(processes.BIN / "transcription-worker"), "--host", "127.0.0.1", "--port", str(port),
         "--threads", "1", "--log-level", "warning"],
        tmp_path / "worker.log", f"{url}/health",
    )  # fmt: skip
    try:
        audio = speak(SENTENCES[0], tmp_path).read_bytes()

        def transcribe() -> None:
            r = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                           files={"file": ("a.wav", audio)}, timeout=120)  # fmt: skip
            assert r.status_code == 200, r.text

        transcribe()  # the first: the model's and the heap's first pages
        before = host.page_faults(proc.pid)
        for _ in range(3):
            transcribe()
        per_request = (host.page_faults(proc.pid) - before) / 3
    finally:
        processes.stop(proc)
    assert per_request < 10_000, per_request
