"""The worker images' code: the faster-whisper worker, and the other engines' launchers.

The faster-whisper worker (`transcription-worker`, `main`) is this project's own server with
vLLM's HTTP contract (`server`): a request's audio is cut into windows (`windows`), the lane
batches the windows of every request in flight (`batcher`), and the transcriber decodes a
batch at a time with faster-whisper's algorithm (`transcriber`; faster-whisper's private API
through `faster_whisper_compat`), on the CPUs or the GPUs it was given (`device`), counted
in vLLM's metric names (`metrics`).

The vLLM and transformers images run their engine's own server, started by a launcher
(`launchers`); `hf_whisper` converts the CTranslate2 Whisper weights those images bake in.
"""
