"""Every request field the official OpenAI SDK can send to the audio endpoints, and what
this API does with each: honoured (and by what), or refused with a 400 that names the field
and the capability it needs. None is ignored in silence.

`tests/test_fields.py` reads the installed SDK's `TranscriptionCreateParams` and
`TranslationCreateParams` and fails when the SDK has a field this table does not decide on,
so a new SDK release cannot slip by unnoticed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import APIError


@dataclass(frozen=True)
class Decision:
    """What happens to one field: `honoured_by` says what acts on it; otherwise `needs`
    names the missing capability and the field is refused."""

    honoured_by: str = ""
    needs: str = ""

    @property
    def honoured(self) -> bool:
        return bool(self.honoured_by)


def honoured(by: str) -> Decision:
    return Decision(honoured_by=by)


def refused(needs: str) -> Decision:
    return Decision(needs=needs)


# The SDK's names, as it sends them on the wire (array fields with `[]`).
FIELDS: dict[str, Decision] = {
    "file": honoured("the gateway: sniffed, size-checked, streamed to the worker"),
    "model": honoured("the gateway: resolved through the model's aliases"),
    "language": honoured("the engine (English-only models: en only, checked by the gateway)"),
    "prompt": honoured("the engine"),
    "response_format": honoured("the gateway: rendered from the engine's json/verbose_json"),
    "temperature": honoured("the engine"),
    "timestamp_granularities[]": honoured("routing: word timestamps go to a pool that has them"),
    "stream": honoured("the gateway: OpenAI's transcript.text events"),
    "chunking_strategy": honoured(
        "the gateway: the audio is cut on silence (Silero VAD), its chunks transcribed across "
        "the pool's replicas and stitched into one answer (`auto` or `server_vad`)"
    ),
    "include[]": honoured(
        "logprobs: the tokens' log probabilities from faster-whisper pools (capability "
        "logprobs; vLLM's and transformers' transcription endpoints have none)"
    ),
    "keywords[]": honoured(
        "the engine's prompt: the words after the client's prompt (faster-whisper's hotwords "
        "are the same tokens), on pools with capability keywords (faster-whisper)"
    ),
    "languages[]": honoured(
        "one: as `language`; several: the engine's language detection, restricted to them "
        "(capability restricted_language_detection: faster-whisper); answers list the language"
    ),
    "known_speaker_names[]": honoured(
        "the speaker stage (capability diarization): segments of a voice that matches a "
        "reference are labelled with its name (response_format diarized_json)"
    ),
    "known_speaker_references[]": honoured(
        "the speaker stage: each data URL's 2-10 s of audio, embedded as the speaker's voice"
    ),
}
UNSUPPORTED = "unsupported_capability"  # the code of the gateway's capability refusals


def refusal(fields: Sequence[tuple[str, str]]) -> APIError | None:
    """The 400 for the first field this API cannot honour, or None."""
    for name, _ in fields:
        shown = name if name in FIELDS else name + "[]"  # a bare array name too
        decision = FIELDS.get(shown)
        if decision and not decision.honoured:
            return APIError(
                400,
                f"`{shown}` is not supported: it needs the capability {decision.needs}, which "
                "no engine here provides yet. Leave the field out.",
                param=name,
                code=UNSUPPORTED,
            )
    return None
