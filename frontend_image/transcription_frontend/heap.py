"""glibc's heap held steady: large blocks mapped and unmapped, never left in the heap.

glibc serves a block of 128 KiB or more with its own mmap, and after freeing one raises that
threshold to the block's size (up to 32 MiB), so that later blocks of that size come from the
heap instead. The gateway's audio work (decoding, Silero over an hour of PCM, FLAC chunks)
frees and allocates such blocks many times a second; served from the heap, they can
fragment it. Seen here in one run of about ten, over an hour of MP3: the process grew by
230-320 MB during the VAD pass and kept it, against 5-15 MB in the others. A fixed threshold
(what `MALLOC_MMAP_THRESHOLD_` sets) turns the adjustment off: 25 runs out of 25 stayed
within 10 MB.
"""

from __future__ import annotations

from transcription_api.mallopt import M_MMAP_THRESHOLD, mallopt

MMAP_THRESHOLD = 128 * 1024  # glibc's default, kept: only its adjustment is turned off


def hold_steady() -> bool:
    """Fix glibc's mmap threshold for this process; False where the C library has no
    `mallopt` (not glibc) or refuses it."""
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
