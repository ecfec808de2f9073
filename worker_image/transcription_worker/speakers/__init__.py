"""Who spoke when: the speaker stage that joins any engine's timed segments.

Only numpy and onnxruntime run here (no torch): Silero VAD from faster-whisper's package
finds speech (`vad`), 80-bin Kaldi fbank features (`fbank`) of 1.5 s windows feed CAM++,
exported to ONNX at build time (`export`) and run by `embedder`; the windows' embeddings are
clustered with an automatic speaker count (`cluster`), made into speaker turns (`turns`),
named after known speakers' reference clips where they match (`known`). `pipeline.diarize`
runs it all on one file's samples; transcription_api.diarization joins the turns to a
transcript (each ASR segment or word gets the speaker that covers most of it).
"""
