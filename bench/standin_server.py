"""A stand-in vLLM worker (recorded answers) as its own process, for the benchmarks."""

from __future__ import annotations

import argparse

import uvicorn

from tests.standins import Behaviour, vllm_app

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay", type=float, default=0.0, help="seconds of 'compute' per request")
    args = p.parse_args()
    app = vllm_app(["whisper-large-v3", "whisper-1"], Behaviour(delay=args.delay))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
