"""One adapter per engine: how the gateway speaks with a pool's engine, both ways -- the
request it sends, and how the engine's answers and errors are read (`base.Adapter`). The
facts they act on are the engine's profile (`transcription_api.engines`).
"""

from __future__ import annotations

from transcription_api.capabilities import Engine
from transcription_api.engines import Asked
from transcription_api.routes import PoolRoute

from .base import CHAT_PATH, Adapter, able
from .faster_whisper import FasterWhisperAdapter
from .transformers import AudioLMAdapter, TransformersAdapter
from .vllm import VllmAdapter

__all__ = ["ADAPTERS", "CHAT_PATH", "Adapter", "able", "adapter"]

# By engine, and how the engine is asked for the pool's model family (its profile says).
ADAPTERS: dict[tuple[Engine, Asked], type[Adapter]] = {
    (Engine.VLLM, Asked.TRANSCRIPTION): VllmAdapter,
    (Engine.FASTER_WHISPER, Asked.TRANSCRIPTION): FasterWhisperAdapter,
    (Engine.TRANSFORMERS, Asked.TRANSCRIPTION): TransformersAdapter,
    (Engine.TRANSFORMERS, Asked.CHAT): AudioLMAdapter,
}


def adapter(pool: PoolRoute) -> Adapter:
    """The adapter of a pool's engine, for one request."""
    return ADAPTERS[pool.engine, pool.serving.asked](pool)
