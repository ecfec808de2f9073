"""Keywords benchmark (`keywords[]`, issue 22): how much more often Whisper tiny.en gets the
words right when a request names them, on the engines that honour them.

The clips are espeak-ng's voice reading the hard sentences (names, rare words, spellings
tiny.en gets wrong) and the easy ones. Each hard sentence has its keywords: the words in it
a user would name (`KEYWORDS`). Three ways, one after another on the same clip:

- none: no keywords (the baseline);
- own: the sentence's keywords;
- others: the keywords of another sentence (what a wrong or stale list costs): on the easy
  sentences too, whose WER must not get worse.

Engines: the faster-whisper worker over HTTP (`keywords[]` as a client sends it: the worker
parses it as the gateway does), and vLLM's CPU build (the prompt the gateway would build,
`keyword_prompt`; measured to show why vLLM pools are not given keywords) when
`make vllm-env` has installed it. Reports keyword recall (the share
of keywords found in the transcript, spelt as given, case and punctuation aside) and WER.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from testkit.audio import SENTENCES, words
from testkit.audio import wer as word_error_rate
from testkit.vllm_reality import real_vllm, vllm_python
from transcription_api.params import keyword_prompt

from .common import PY, Proc, say, table, write
from .worker import BEAM_SIZE, Clip, clips, transcribe

PORT = 18760
# The words a user would name for each hard sentence (the others have none worth naming).
KEYWORDS: dict[str, list[str]] = {
    "Their colonel read the rough draft, though he thought it was thorough.": ["colonel", "thorough"],
    "Please configure the PostgreSQL replica with synchronous commit disabled.": ["PostgreSQL", "synchronous"],
    "She sells seashells by the seashore on sunny summer Sundays.": ["seashells", "seashore"],
    "Wojciech and Siobhan flew from Reykjavik to Ouagadougou in February.": ["Wojciech", "Siobhan", "Reykjavik", "Ouagadougou"],
    "The sixth sick sheikh's sixth sheep is sick.": ["sheikh's"],
    "Peter Piper picked a peck of pickled peppers.": ["Piper", "peck", "pickled"],
    "Kubernetes schedules pods onto nodes with enough allocatable resources.": ["Kubernetes", "allocatable"],
    "Anemone, synecdoche and onomatopoeia are rarely used words.": ["Anemone", "synecdoche", "onomatopoeia"],
    "The archaeologist catalogued the Mesopotamian cuneiform tablets meticulously.": ["archaeologist", "catalogued", "Mesopotamian", "cuneiform"],
    "Worcestershire sauce is used in Caesar salad dressing.": ["Worcestershire", "Caesar"],
}  # fmt: skip
WAYS = ("none", "own", "others")


def found(keywords: list[str], text: str) -> int:
    """How many of the keywords the transcript has, spelt as given (case and punctuation
    aside)."""
    said = set(words(text))
    return sum(1 for k in keywords if all(w in said for w in words(k)))


def keywords_for(sentence: str, way: str) -> list[str]:
    named = list(KEYWORDS)
    if way == "none":
        return []
    if way == "own":
        return KEYWORDS.get(sentence, [])
    # Another sentence's list: the next one in the table (an easy sentence gets the first).
    i = named.index(sentence) if sentence in KEYWORDS else -1
    return KEYWORDS[named[(i + 1) % len(named)]]


def measure(engine: str, ask: Any, clip_set: list[Clip]) -> list[dict[str, Any]]:
    rows = []
    for way in WAYS:
        hits = total = 0
        rates: dict[str, list[float]] = {"easy": [], "hard": []}
        for sentence, audio, _ in clip_set:
            keywords = keywords_for(sentence, way)
            status, _, text = ask(audio, keywords)
            if status != 200:
                raise SystemExit(f"{engine} answered {status} with keywords {keywords}")
            own = KEYWORDS.get(sentence, [])
            hits += found(own, text)
            total += len(own)
            rates["easy" if sentence in SENTENCES else "hard"].append(
                word_error_rate(sentence, text)
            )
        rows.append({
            "engine": engine, "keywords": way, "keyword_recall": hits / total,
            "keywords_found": hits, "keywords_total": total,
            "wer_easy": sum(rates["easy"]) / len(rates["easy"]),
            "wer_hard": sum(rates["hard"]) / len(rates["hard"]),
        })  # fmt: skip
        say(f"{engine}, keywords {way}: {hits}/{total} keywords found")
    return rows


def run(quick: bool = False) -> dict[str, Any]:
    clip_set = [c for c in clips() if c[0] in KEYWORDS or c[0] in SENTENCES]
    if quick:
        clip_set = clip_set[:6]
    threads = len(os.sched_getaffinity(0))
    say(f"{len(clip_set)} clips, {sum(len(v) for v in KEYWORDS.values())} keywords, {threads} CPUs")
    say("starting the faster-whisper worker (Whisper tiny.en)")
    w = Proc([PY, "-m", "transcription_worker.main", "--port", str(PORT), "--beam-size",
              str(BEAM_SIZE), "--log-level", "warning"],
             f"http://127.0.0.1:{PORT}/health", "keywords-worker")  # fmt: skip
    url = f"http://127.0.0.1:{PORT}"

    def worker(audio: bytes, keywords: list[str]) -> tuple[int, float, str]:
        return transcribe(url, audio, **({"keywords[]": keywords} if keywords else {}))  # type: ignore[arg-type]

    try:
        rows = measure("faster-whisper worker", worker, clip_set)
    finally:
        w.stop()
    if vllm_python().exists():
        say("starting vLLM's CPU build (tiny.en, Hugging Face format, bfloat16, eager)")
        with real_vllm(Path(tempfile.mkdtemp(prefix="bench-vllm-")), threads=threads) as vllm:

            def v(audio: bytes, keywords: list[str]) -> tuple[int, float, str]:
                prompt = {"prompt": keyword_prompt(None, keywords)} if keywords else {}
                return transcribe(vllm.url, audio, language="en", **prompt)

            rows += measure("vLLM CPU build", v, clip_set)
    else:
        say(f"vLLM's CPU build is not installed ({vllm_python()}): `make vllm-env`; left out")
    table("keywords[]: recall of the hard sentences' keywords, and WER (Whisper tiny.en, espeak-ng)",
          ["engine", "keywords", "found", "recall", "WER easy", "WER hard"],
          [[r["engine"], r["keywords"], f"{r['keywords_found']}/{r['keywords_total']}",
            r["keyword_recall"], r["wer_easy"], r["wer_hard"]] for r in rows])  # fmt: skip
    result = {"model": f"whisper tiny.en (faster-whisper: CTranslate2 int8, beam {BEAM_SIZE}; "
                       "vLLM: Hugging Face format, bfloat16)",
              "clips": len(clip_set), "rows": rows}  # fmt: skip
    write("keywords", result)
    return result
