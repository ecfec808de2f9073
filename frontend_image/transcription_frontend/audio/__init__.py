"""Audio: what the gateway reads, decodes, resamples, detects speech in and writes.

- `headers`: an upload's container and its length, read from its header bytes, and whether
  that length is exact (standard library only: cheap enough for every request);
- `decode`: any container and codec libav reads, decoded as a stream into a spooled file of
  16 kHz mono 16-bit PCM;
- `pcm`: raw PCM in and out: G.711 decoding, the streaming resampler, the denoiser;
- `vad`: Silero VAD (speech probabilities) and OpenAI's `server_vad` turn detection;
- `encode`: 16-bit PCM written as a WAV file (the one WAV writer of the repository, test
  support included) or a FLAC file.

Nothing is imported here: PyAV, numpy and onnxruntime (57 MB of a gateway's memory) load
with the first request that decodes, not with the gateway.
"""
