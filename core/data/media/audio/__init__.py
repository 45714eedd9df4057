"""Sounds: a clip decoded at the sampling rate (`clips`), and a video's own sound track interleaved with
its frames for Qwen2.5-Omni (`in_video`)."""
