"""python -m bench [frontend|gateway|hostile|hostile-slots|hostile-realtime|hostile-bodies|worker|worker-settings|allocator|keywords|realtime|
realtime-node|longaudio|longaudio-node|longaudio-prompt|operator|scale|weights-node|diarization|
diarization-sweep|all] [--quick]"""

from __future__ import annotations

import argparse
import sys

from transcription_api.telemetry import quiet_this_process

# The gateways and workers the benchmarks start report to no vendor.
quiet_this_process()

# Parts of a benchmark that run alone: name -> (module, function).
PARTS = {"hostile-slots": ("hostile", "run_slots"), "hostile-realtime": ("hostile", "run_realtime"),
         "diarization-sweep": ("diarization", "run_sweep")}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument(
        "which",
        nargs="?",
        default="all",
        choices=[
            "frontend",
            "gateway",
            "hostile",
            "hostile-slots",
            "hostile-realtime",
            "hostile-bodies",
            "worker",
            "worker-settings",
            "allocator",
            "keywords",
            "realtime",
            "realtime-node",
            "longaudio",
            "longaudio-node",
            "longaudio-prompt",
            "operator",
            "scale",
            "weights-node",
            "diarization",
            "diarization-sweep",
            "all",
        ],
    )
    p.add_argument("--quick", action="store_true", help="fewer requests/resources (a smoke run)")
    args = p.parse_args()
    names = (
        ["frontend", "hostile", "worker", "operator", "scale"]
        if args.which == "all"
        else [args.which]
    )
    for name in names:
        module_name, function = PARTS.get(name, (name, "run"))
        module = __import__(f"bench.{module_name.replace('-', '_')}", fromlist=[function])
        getattr(module, function)(quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
