"""Checkpoint files: ``checkpoint`` (the single-model and ensemble format)."""
