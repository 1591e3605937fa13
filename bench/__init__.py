"""Benchmarks of slide against dense TensorFlow-CPU and PyTorch-CPU (see bench/README.md)."""
