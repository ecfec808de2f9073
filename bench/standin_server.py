"""A stand-in vLLM worker (recorded answers) as its own process, for the benchmarks."""

from __future__ import annotations

import argparse

import uvicorn

from testkit.standins import Behaviour, vllm_app

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay", type=float, default=0.0, help="seconds of 'compute' per request")
    p.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between stream events")
    p.add_argument("--per-audio-second", type=float, default=0.0,
                   help="seconds of 'compute' per second of audio (WAV), reported as its length")  # fmt: skip
    args = p.parse_args()
    # verbose_json with segments (as multilingual Whisper answers), for srt/vtt rendering.
    b = Behaviour(delay=args.delay, chunk_delay=args.chunk_delay, segments=True,
                  per_audio_second=args.per_audio_second)  # fmt: skip
    app = vllm_app(["whisper-large-v3", "whisper-1"], b)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
