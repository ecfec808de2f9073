"""OpenAI Realtime transcription sessions: audio formats, voice activity, turns."""
