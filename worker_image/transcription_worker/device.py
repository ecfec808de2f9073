"""Where the model runs: the CPUs the pod may use, or the GPUs it was given.

A worker given GPUs decodes on them or not at all: when it cannot use them it says why,
and never falls back to the CPU (which would hold the GPUs and serve many times slower).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CUDA_IMAGE_HINT = (
    "the CUDA worker image (worker_image/Dockerfile.cuda) has them; the operator gives it to "
    "pools with resources.gpus > 0 unless spec.images.fasterWhisperCuda names another image"
)


class DeviceError(RuntimeError):
    """The worker was given a GPU it cannot use."""


def cpu_count(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may use: its affinity, capped by a cgroup v2 CPU limit (a pod's
    `resources.limits.cpu`), so that the engine starts no more threads than it can run."""
    count = len(os.sched_getaffinity(0))
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return count
    if quota == "max":
        return count
    return max(1, min(count, math.ceil(int(quota) / int(period))))


def check_gpus(gpus: int) -> None:
    """Refuse to start when CTranslate2 sees fewer CUDA devices than the pod was given."""
    import ctranslate2

    seen = ctranslate2.get_cuda_device_count()
    if seen >= gpus:
        return
    visible = os.environ.get("NVIDIA_VISIBLE_DEVICES", "unset")
    raise DeviceError(
        f"this worker was given {gpus} GPU(s) but CTranslate2 sees {seen} CUDA device(s) "
        f"(NVIDIA_VISIBLE_DEVICES={visible}); it will not decode on the CPU instead. Check "
        "that the pod runs on a GPU node with the NVIDIA container runtime and that its "
        "limits request the GPUs (nvidia.com/gpu)."
    )


def unusable(gpus: int, error: BaseException) -> str:
    """The message for a GPU that is there but cannot decode (a missing CUDA library, no
    float16 support, out of memory, ...)."""
    text = str(error).strip() or type(error).__name__
    hint = ""
    if any(lib in text for lib in ("libcublas", "libcudart", "cannot be loaded", "CUDA driver")):
        hint = f" The CUDA libraries are missing or do not match the driver: {CUDA_IMAGE_HINT}."
    return (
        f"this worker was given {gpus} GPU(s) but cannot decode on them: {text}.{hint} "
        "It will not decode on the CPU instead."
    )
