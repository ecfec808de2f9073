"""A stand-in worker (recorded answers) as its own process, for the benchmarks: vLLM's, or
with `--audio-lm` that of `transformers serve` with an audio language model (chat)."""

from __future__ import annotations

import argparse

import uvicorn

from testkit.frontend import AUDIO_LM_MODEL
from testkit.standins import Behaviour, transformers_app, vllm_app

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay", type=float, default=0.0, help="seconds of 'compute' per request")
    p.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between stream events")
    p.add_argument("--per-audio-second", type=float, default=0.0,
                   help="seconds of 'compute' per second of audio (WAV), reported as its length")  # fmt: skip
    p.add_argument("--audio-lm", action="store_true", help="transformers serve, an audio LM")
    args = p.parse_args()
    # verbose_json with segments (as multilingual Whisper answers), for srt/vtt rendering.
    b = Behaviour(delay=args.delay, chunk_delay=args.chunk_delay, segments=True,
                  per_audio_second=args.per_audio_second)  # fmt: skip
    app = (transformers_app(b, model=AUDIO_LM_MODEL, family="audio-lm") if args.audio_lm
           else vllm_app(["whisper-large-v3", "whisper-1"], b))  # fmt: skip
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
