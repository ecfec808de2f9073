"""English-only Whisper checkpoints (`*.en`) made to work on vLLM.

vLLM (0.32) prompts every Whisper model with `<|startoftranscript|><|lang|><|task|>
<|notimestamps|>` and applies no `begin_suppress_tokens`. An English-only model was trained
on `<|startoftranscript|><|notimestamps|>` alone, and answers the longer prompt with
`<|endoftext|>`: a 200 with empty text. The fix needs no change to vLLM: a copy of the
checkpoint whose tokenizer deletes the language and task tokens before it encodes, so the
prompt vLLM writes becomes the one the model knows.

- the tokenizer's normalizer removes `<|en|>`, `<|transcribe|>` and `<|translate|>`;
- those added tokens are marked `normalized: true`, so they are matched after the
  normalizer ran (never, since it removed them), not split off before it;
- `tokenizer_config.json` names `PreTrainedTokenizerFast`: transformers 5 rebuilds a
  `WhisperTokenizer` from the vocabulary and would drop the normalizer.

The same normalizer mends vLLM's prompt: it writes a request's `prompt` after `<|prev|>`, a
token no Whisper tokenizer has (vllm-project/vllm#53206, open), which then reaches the model
as six text tokens and sends decoding into loops (`python -m bench keywords`). The copy
turns `<|prev|>` into `<|startofprev|>`, Whisper's own, matched after the normalizer ran.

The copy is a directory of links to the checkpoint's files, with the two tokenizer files
rewritten; the weights are not copied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The prompt tokens an English-only model never saw. Language detection is no concern here:
# the frontend names English for these models (an English-only model detects nothing).
PROMPT_TOKENS = ("<|en|>", "<|transcribe|>", "<|translate|>")
VLLM_PREV, PREV = "<|prev|>", "<|startofprev|>"  # what vLLM writes, what Whisper knows
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
ENGLISH_ONLY_VOCAB = 51864  # multilingual Whisper: 51865 (51866 from large-v3 on)


def is_english_only(checkpoint: Path) -> bool:
    """What the checkpoint says of itself: `is_multilingual` in its generation config, else
    the English-only vocabulary size."""
    gen = _read(checkpoint / "generation_config.json")
    if isinstance(gen.get("is_multilingual"), bool):
        return not gen["is_multilingual"]
    cfg = _read(checkpoint / "config.json")
    return cfg.get("model_type") == "whisper" and cfg.get("vocab_size") == ENGLISH_ONLY_VOCAB


def patched_tokenizer(tokenizer: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer.json that drops the prompt tokens before it encodes."""
    out = dict(tokenizer)
    removals: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": t}, "content": ""} for t in PROMPT_TOKENS
    ]
    removals.append({"type": "Replace", "pattern": {"String": VLLM_PREV}, "content": PREV})
    old = tokenizer.get("normalizer")
    out["normalizer"] = {"type": "Sequence", "normalizers": removals + ([old] if old else [])}
    out["added_tokens"] = [
        dict(t, normalized=True) if t.get("content") in (*PROMPT_TOKENS, PREV) else t
        for t in tokenizer.get("added_tokens", [])
    ]
    return out


def prepare(checkpoint: Path, out: Path) -> Path:
    """Write the English-only copy of `checkpoint` into `out` (replacing what is there);
    return `out`. Raises ValueError when the checkpoint has no fast tokenizer."""
    source = checkpoint / "tokenizer.json"
    if not source.is_file():
        raise ValueError(
            f"{checkpoint} is an English-only Whisper model without tokenizer.json: vLLM "
            "would answer it with empty text; use a checkpoint with a fast tokenizer"
        )
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    for f in checkpoint.iterdir():
        if f.name not in TOKENIZER_FILES:
            (out / f.name).symlink_to(f.resolve())
    tokenizer = json.loads(source.read_text())
    (out / "tokenizer.json").write_text(json.dumps(patched_tokenizer(tokenizer)))
    config = _read(checkpoint / "tokenizer_config.json")
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}
