"""glibc's `mallopt`, for the processes that tune their allocator: the gateway
(transcription_frontend/heap.py) and the faster-whisper worker
(transcription_worker/allocator.py)."""

from __future__ import annotations

import ctypes

# mallopt's parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def mallopt(param: int, value: int) -> bool:
    """Set one of glibc's allocator parameters for this process; False where the C library
    has no `mallopt` (not glibc) or refuses the value."""
    try:
        call = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_int]
    call.restype = ctypes.c_int
    return bool(call(param, value))
