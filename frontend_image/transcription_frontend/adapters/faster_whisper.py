"""Our faster-whisper worker's adapter: the worker was written to the same HTTP contract as
vLLM's server, and speaks OpenAI's API as it is documented, so the base adapter serves as
it is.
"""

from __future__ import annotations

from .base import Adapter


class FasterWhisperAdapter(Adapter):
    pass
