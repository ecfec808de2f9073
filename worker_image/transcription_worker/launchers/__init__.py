"""The engine images' entry points: each turns the settings the operator wrote into its
engine's command line and replaces itself with the engine's own server.

- `base`: what they share (`Launcher`: read the settings, build and check the command,
  `--print` or exec);
- `vllm`: `transcription-vllm-launcher`, vLLM's OpenAI server (GPU and CPU images), with
  `english_only` for English-only Whisper checkpoints;
- `transformers`: `transcription-transformers-launcher`, `transformers serve`.

The faster-whisper worker is no launcher: it is this project's own server
(`transcription-worker`, the package's `main`).
"""
