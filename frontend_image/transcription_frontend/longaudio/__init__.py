"""Long audio: cut on silence, fanned out, stitched.

A long upload is decoded as a stream into a spooled 16 kHz mono PCM file (never held whole
in memory), Silero VAD finds its silences, and it is cut there into contiguous chunks that
each fit what an engine takes whole (`cut`). The chunks, encoded as small FLAC files, go
concurrently to a pool's workers, and their answers are stitched into one, with global
timestamps.
"""
