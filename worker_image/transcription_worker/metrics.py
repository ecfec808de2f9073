"""Worker metrics, named as vLLM names them where the meaning is the same, so one dashboard
(and one alert) serves both engines."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RUNNING = Gauge(
    "vllm:num_requests_running", "Number of requests in model execution batches.", ["model_name"]
)
WAITING = Gauge(
    "vllm:num_requests_waiting", "Number of requests waiting to be processed.", ["model_name"]
)
E2E = Histogram(
    "vllm:e2e_request_latency_seconds",
    "Histogram of e2e request latency in seconds.",
    ["model_name"],
    buckets=(
        0.3,
        0.5,
        0.8,
        1.0,
        1.5,
        2.0,
        2.5,
        5.0,
        10.0,
        15.0,
        20.0,
        30.0,
        40.0,
        50.0,
        60.0,
        120.0,
        240.0,
        480.0,
        960.0,
    ),
)
SUCCESS = Counter(
    "vllm:request_success",
    "Count of successfully processed requests.",
    ["model_name", "finished_reason"],
)
AUDIO_SECONDS = Counter(
    "transcription_worker_audio_seconds", "Seconds of audio transcribed (for real-time factor)."
)
BUSY_SECONDS = Counter(
    "transcription_worker_busy_seconds",
    "Seconds the model was decoding (at least one batch running): rate(audio_seconds_total) "
    "/ rate(busy_seconds_total) is the audio seconds this worker decodes per second when busy.",
)
REJECTED = Counter(
    "transcription_worker_rejected", "Requests refused with 503 because the queue was full."
)
CANCELLED = Counter(
    "transcription_worker_cancelled", "Requests dropped because their client disconnected."
)
BATCH_WINDOWS = Histogram(
    "transcription_worker_batch_windows",
    "30 s windows of audio decoded together in one batch.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
