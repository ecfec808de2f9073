"""transformers: `transformers serve` (5.24), started by the transformers image's launcher
(`transcription-transformers-launcher`, worker_image/Dockerfile.transformers).

What it serves depends on the kind of model as much as on the mode: a Whisper model
transcribes (through its transcription endpoint), an audio language model chats and
transcribes through chat. The evidence for each entry stands beside it: tests in
tests/transformers_engine/ and their recordings in tests/fixtures/transformers-5.24/ (the
names in backquotes). It has no aliases: pinned to one model, it answers only to that
model's name.
"""

from __future__ import annotations

from ..capabilities import Capability as C
from ..capabilities import CapabilitySet, Engine, Mode, ModelFamily
from .profile import Asked, EngineProfile, ErrorDialect, Image, Serving, StreamDialect

# It decodes audio with soundfile (libsndfile) when torchcodec is not installed, as in our
# image: MP4/M4A, WebM, AAC and WMA get a bare 500 (`m4a`; the real suite's test_containers
# checks every one).
_SOUNDFILE_FORMATS = frozenset({"wav", "flac", "mp3", "ogg", "aiff", "au", "caf"})

# The form fields it accepts on /v1/audio/transcriptions (OpenAI's TranscriptionCreateParams,
# read by its own validator; it acts on file, model and stream only). Array fields go without
# the SDK's `[]` (it answers 422 to `include[]`).
TRANSCRIPTION_FIELDS = frozenset({
    "model", "stream", "language", "prompt", "response_format", "temperature",
    "chunking_strategy", "include", "keywords", "known_speaker_names",
    "known_speaker_references", "languages", "timestamp_granularities",
})  # fmt: skip
# The JSON fields it accepts on /v1/chat/completions (OpenAI's CompletionCreateParams plus
# generation_config, seed, chat_template_kwargs): any other gets a 422.
CHAT_FIELDS = frozenset({
    "audio", "chat_template_kwargs", "frequency_penalty", "function_call", "functions",
    "generation_config", "logit_bias", "logprobs", "max_completion_tokens", "max_tokens",
    "messages", "metadata", "modalities", "model", "moderation", "n",
    "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
    "prompt_cache_options", "prompt_cache_retention", "reasoning_effort",
    "response_format", "safety_identifier", "seed", "service_tier", "stop", "store",
    "stream", "stream_options", "temperature", "tool_choice", "tools", "top_logprobs",
    "top_p", "user", "verbosity", "web_search_options",
})  # fmt: skip
# A transcription through chat honours these: `language` and `prompt` go into the
# instruction, `temperature` to generation.
CHAT_TRANSCRIPTION_FIELDS = frozenset(
    {"model", "stream", "language", "prompt", "response_format", "temperature"}
)

# A Whisper model: the same in both modes. Under --continuous-batching a transcription still
# runs on the sequential generation thread (`cb_whisper_json`; the "requires sequential
# generation (not CB)" 400 is unreachable), one at a time. Only `{"text"}` comes back,
# whatever response_format asks (`espeak_verbose_json`, `espeak_srt`): no segments. `stream`
# sends bare text deltas (`espeak_stream`, `cb_whisper_stream`). No translations route
# (`translations`, 404); audio past 30 s is dropped (`long_audio`); `language` is ignored, so
# language detection is not claimed; no chat for Whisper (`whisper_chat`, 500).
_WHISPER = CapabilitySet(
    capabilities=frozenset({C.TRANSCRIPTIONS, C.STREAM}),
    max_concurrency=1,
    audio_seconds_per_replica=2,
    max_in_flight_per_replica=2,
    max_audio_seconds=30,
    audio_formats=_SOUNDFILE_FORMATS,
    native_formats=frozenset({"json"}),
)
# Audio language models: it chats with them, audio input included (`cb_audio_lm_chat_audio`;
# streamed: `cb_audio_lm_chat_stream`, chat.completion.chunk events whose last one has a
# finish_reason, no [DONE]), in both modes. They are never batched (it batches text-only
# models alone and falls back to sequential generation), and its transcription endpoint fails
# on their processors with a bare 500 in both modes (`cb_audio_lm_transcription`,
# `audio_lm_transcription`). So they transcribe the way audio language models are asked to:
# through chat, the audio and an instruction in one user message (the frontend builds it;
# `chat_transcription_json`, `chat_transcription_stream`). Their feature extractor is
# Whisper's: the first 30 s of audio.
_AUDIO_LM = CapabilitySet(
    capabilities=frozenset({C.CHAT, C.TRANSCRIPTIONS, C.STREAM}),
    max_concurrency=1,
    audio_seconds_per_replica=2,
    max_in_flight_per_replica=2,
    max_audio_seconds=30,
    audio_formats=_SOUNDFILE_FORMATS,
    native_formats=frozenset(),
)
IMAGE = Image("transformers", "worker-transformers", "worker_image/Dockerfile.transformers")

PROFILE = EngineProfile(
    engine=Engine.TRANSFORMERS,
    serves={
        ModelFamily.WHISPER: Serving(
            modes={Mode.CONTINUOUS: _WHISPER, Mode.SEQUENTIAL: _WHISPER},
            stream_dialect=StreamDialect.RAW_TEXT,
            transcription_fields=TRANSCRIPTION_FIELDS,
        ),
        ModelFamily.AUDIO_LM: Serving(
            modes={Mode.CONTINUOUS: _AUDIO_LM, Mode.SEQUENTIAL: _AUDIO_LM},
            asked=Asked.CHAT,
            stream_dialect=StreamDialect.CHAT_CHUNK,
            transcription_fields=CHAT_TRANSCRIPTION_FIELDS,
        ),
    },
    cpu_image=IMAGE,
    gpu_image=IMAGE,
    usable_gpus=1,
    error_dialect=ErrorDialect.FASTAPI,
    chat_fields=CHAT_FIELDS,
    aliases=False,
)
