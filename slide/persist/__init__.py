"""Checkpoint files: ``checkpoint`` (the single-model and ensemble format; it restores the
components and knows no model class) and ``models`` (``load``, the one module that knows the
model classes)."""
