"""vLLM's adapter: its server speaks OpenAI's API (with vLLM's `stream_include_usage` for
usage in streams), so the base adapter serves as it is. Its one quirk, a 400 for an upload
over its cap where OpenAI answers 413, is its profile's error dialect (`ErrorDialect.VLLM`).
"""

from __future__ import annotations

from .base import Adapter


class VllmAdapter(Adapter):
    pass
