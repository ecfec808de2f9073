"""Telemetry off: the environment that keeps the libraries in the project's images from
reporting to their vendors. One list, set in every image (`ENV`) and in every container the
operator builds (the frontend, each engine) and the chart's operator Deployment; a test
checks each Dockerfile and the chart against it.

- onnxruntime (Silero VAD: the frontend's realtime and long audio, the faster-whisper
  worker's VAD filter) sends 1DS events to mobile.events.data.microsoft.com about 5 s
  after its first session, and retries, unless `ORT_DISABLE_TELEMETRY` is set.
- huggingface_hub (and transformers through it) reports downloads unless
  `HF_HUB_DISABLE_TELEMETRY` (or `DO_NOT_TRACK`) is set.
- vLLM reports usage statistics to stats.vllm.ai unless `VLLM_NO_USAGE_STATS` or
  `DO_NOT_TRACK` is set.
- `DO_NOT_TRACK` is the cross-vendor switch (https://donottrack.sh) others honour too.

OpenTelemetry sends nothing unless an exporter's endpoint is configured (`spec.tracing`);
CTranslate2, PyTorch, uvicorn, kopf and the Kubernetes client have no telemetry; gradio
(which has) is in no image.

`HF_HUB_OFFLINE` goes further: no request to the hub at all. It is set only where weights
never come from the hub (the frontend; workers whose `spec.model.source` is `pvc` or
`image`): a `source: hub` pool downloads its weights.
"""

from __future__ import annotations

import os

TELEMETRY_OFF: dict[str, str] = {
    "ORT_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
HUB_OFFLINE: dict[str, str] = {"HF_HUB_OFFLINE": "1"}


def telemetry_env(offline: bool) -> list[dict[str, str]]:
    """A container's `env` entries for TELEMETRY_OFF, and HUB_OFFLINE when `offline`."""
    env = {**TELEMETRY_OFF, **(HUB_OFFLINE if offline else {})}
    return [{"name": k, "value": v} for k, v in env.items()]


def quiet_this_process() -> None:
    """TELEMETRY_OFF in this process's environment, and so its children's, where not set:
    the test suites and the benchmarks run the gateway and workers outside their images."""
    for name, value in TELEMETRY_OFF.items():
        os.environ.setdefault(name, value)
