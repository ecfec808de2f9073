"""The e2e suite's module order.

`make test` builds KEDA, Flux and the checkers beside the e2e suite rather than before it
(their Go builds are the longest after Kubernetes'), so the modules that need them run after
those that do not, and the two that run on the torch images (the largest, about 10 GB of disk
each) run last: `make test` builds those images beside the suite once the Go builds are over
and their 17 GB of caches gone (a module that finds the build under way waits for it; run
alone, it builds them itself). The other modules keep pytest's order (by name).
"""

from __future__ import annotations

# In this order, after every module not named here.
LAST = (
    "test_scaling.py",  # KEDA
    "test_gitops_flux.py",  # Flux, the last Go build beside the suite
    "test_transformers_node.py",  # the torch layer and the transformers image
    "test_vllm_node.py",  # KEDA, and vLLM's CPU image on the torch layer
)


def rank(module: str) -> int:
    """Where a module (its file name) goes: 0 for any not in LAST, else after them."""
    return LAST.index(module) + 1 if module in LAST else 0
