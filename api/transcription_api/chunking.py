"""OpenAI's `chunking_strategy`: how the server cuts long audio before transcribing it.

`"auto"`: loudness normalised, then voice activity detection picks the cuts.
`{"type": "server_vad", "threshold", "prefix_padding_ms", "silence_duration_ms"}`: the same
VAD with these settings. The SDK sends the object as bracketed form fields
(`chunking_strategy[type]=server_vad`, `chunking_strategy[threshold]=0.4`, ...); a JSON object
in `chunking_strategy` is read too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import APIError, bad_request

FIELD = "chunking_strategy"


class ChunkingStrategy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["auto", "server_vad"] = "auto"
    threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    prefix_padding_ms: int = Field(default=300, ge=0, le=10_000)
    silence_duration_ms: int = Field(default=500, ge=32, le=10_000)


def parse_chunking(fields: Sequence[tuple[str, str]]) -> ChunkingStrategy | None:
    """The request's chunking strategy, None without one; 400 naming a bad part."""
    raw: dict[str, object] = {}
    for name, value in fields:
        if name == FIELD:
            value = value.strip()
            if value == "auto":
                raw = {"type": "auto"}
            else:
                try:
                    obj = json.loads(value)
                except ValueError:
                    obj = None
                if not isinstance(obj, dict):
                    raise bad_request(
                        f'{FIELD} must be "auto" or a server_vad object, got {value[:60]!r}', FIELD
                    )
                raw = obj
        elif name.startswith(FIELD + "[") and name.endswith("]"):
            raw[name[len(FIELD) + 1 : -1]] = value
    if not raw:
        return None
    if raw.get("type") not in ("auto", "server_vad"):
        raise bad_request(f'{FIELD}[type] must be "server_vad" (or send {FIELD}=auto)',
                          f"{FIELD}[type]")  # fmt: skip
    try:
        return ChunkingStrategy.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise APIError(400, f"{FIELD}[{where}]: {err['msg']}", param=f"{FIELD}[{where}]") from None
