"""faster-whisper: our own worker (worker_image/transcription_worker/server.py), with the
same HTTP contract as vLLM's server and real transcription on CPU (worker_image/Dockerfile.cpu)
or on a GPU (worker_image/Dockerfile.cuda, CTranslate2 with the CUDA libraries).

It serves everything: segments and word timestamps, every response format, any upload the
frontend accepts (it spools uploads to disk and decodes them as a stream).
"""

from __future__ import annotations

from ..capabilities import AUDIO, MAX_UPLOAD, CapabilitySet, Engine, Mode, ModelFamily
from .profile import EngineProfile, ErrorDialect, Image, Serving, one_at_a_time

# The 30 s windows of concurrent requests are decoded together, one CTranslate2 batch at a
# time (in sequential mode too, where a replica runs one request at a time).
_CONTINUOUS = CapabilitySet(
    capabilities=AUDIO,
    max_upload_bytes=MAX_UPLOAD,
    # tiny.en on 2 CPUs decodes 2-3 s of audio a second (docs/benchmarks.md); a GPU, more.
    audio_seconds_per_replica=4,
    # Twice its default batch (pools[].maxBatchSize, 8): a pool with another batch size gets
    # twice that (the operator's plan).
    max_in_flight_per_replica=16,
    native_formats=frozenset({"json", "text", "srt", "vtt", "verbose_json"}),
)

PROFILE = EngineProfile(
    engine=Engine.FASTER_WHISPER,
    serves={
        ModelFamily.WHISPER: Serving(
            modes={Mode.CONTINUOUS: _CONTINUOUS, Mode.SEQUENTIAL: one_at_a_time(_CONTINUOUS)},
        ),
    },
    cpu_image=Image("faster-whisper", "worker-cpu", "worker_image/Dockerfile.cpu"),
    gpu_image=Image("faster-whisper-cuda", "worker-cuda", "worker_image/Dockerfile.cuda"),
    usable_gpus=1,
    error_dialect=ErrorDialect.OPENAI,
    decoding_settings=True,
    speaker_stage=True,
)
