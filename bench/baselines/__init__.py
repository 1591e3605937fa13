"""Dense baselines: the same network as slide's default (sparse input -> 128 ReLU -> softmax over
all labels, softmax cross-entropy with 1/|y| targets, Adam) in TensorFlow-CPU (full and sampled
softmax) and PyTorch-CPU. Each module exposes ``run(...)``-style entry points called by
``bench.worker`` inside that system's own subprocess."""
