"""vLLM's adapter: its server speaks OpenAI's API (with vLLM's `stream_include_usage` for
usage in streams), so the base adapter serves as it is. Its quirks: a 400 for an upload over
its cap where OpenAI answers 413 (its profile's error dialect, `ErrorDialect.VLLM`), and no
language detection on English-only models (`AssertionError` in
`parse_language_detection_output`, a 500): the frontend names English for those.
"""

from __future__ import annotations

from .base import Adapter


class VllmAdapter(Adapter):
    names_english = True
