"""glibc's allocator, told to keep the large blocks one decode frees for the next.

By default glibc gives every block over 32 MiB (its dynamic threshold's maximum) straight
back to the kernel when it is freed, and trims a heap whose top is free. A decode allocates
and frees blocks between 40 and 64 MiB for every request, so the kernel maps and zeroes them
again each time: 64,000 page faults a request, a fifth of the worker's CPU time. Keeping
blocks up to `LIMIT` in the heap, and the heap's free top up to it too, removes them.
`python -m bench allocator` runs the worker both ways on the same clips: 1,400 faults a
request instead of 64,000, 0.79 times the CPU time per request, 1.13 times the peak memory
(Whisper tiny.en, 2 CPUs; 40 MiB left 55,000 faults, 128 MiB gave 1.25 times the memory).

A deployment that sets glibc's own settings (`GLIBC_TUNABLES` with a `glibc.malloc.` one, or
a `MALLOC_*` variable, in the pool's environment) keeps them: this module changes nothing
then.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from transcription_api.mallopt import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, mallopt

LIMIT = 64 * 2**20  # bytes: blocks up to this size stay in the process once freed


def set_by_user(env: Mapping[str, str]) -> bool:
    """Whether the environment already tells glibc's allocator what to do."""
    return "glibc.malloc." in env.get("GLIBC_TUNABLES", "") or any(
        k.startswith("MALLOC_") for k in env
    )


def keep_large_blocks(env: Mapping[str, str] = os.environ) -> bool:
    """Keep freed blocks up to `LIMIT` for reuse; False where the environment already
    chose, or where the C library is not glibc (no `mallopt`)."""
    if set_by_user(env):
        return False
    return mallopt(M_MMAP_THRESHOLD, LIMIT) and mallopt(M_TRIM_THRESHOLD, LIMIT)
