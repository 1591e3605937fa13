"""The training engine below the estimator: ``Network`` and its kernels.

Modules: ``arrays`` (the NamedTuple bundles kernels take, and their allocation), ``sample``
(one sample: active sets, forward, loss, backward), ``negatives`` (shared negatives and the
sampling correction), ``batch`` (one HOGWILD batch and its optimizer step), ``touched``
(touched-row lists), ``dense`` (the full-softmax path), ``infer`` (exact and sparse top-k),
``network`` (the ``Network`` shell), ``state`` (``Network.from_state``), ``diagnostics``
(how well the sampled active set stands in for the full softmax; ``diagnostics.every`` logs it
from a ``fit`` callback).

Two Numba facts the layout depends on: (1) ``cache=True`` invalidates a kernel's cache only
when its own file changes, not when a helper it calls from another module does, so after
editing e.g. ``negatives.py`` delete ``slide/**/__pycache__/*.nbi`` before trusting a result;
(2) inside a ``prange`` body, a store made directly through a bundle attribute
(``bundle.arr[i] = v``) is lost (Numba 0.68): parallel kernels take the arrays out of their
bundles before the loop, or store through a called function.
"""
from slide.network.network import LOSSES, Network


__all__ = ["LOSSES", "Network"]
