"""The training engine below the estimator: ``Network`` and its kernels.

Modules: ``arrays`` (the NamedTuple bundles kernels take, and their allocation), ``sample``
(one sample: active sets, forward, loss, backward), ``negatives`` (shared negatives and the
sampling correction), ``batch`` (one HOGWILD batch and its optimizer step), ``touched``
(touched-row lists), ``dense`` (the full-softmax path), ``infer`` (exact and sparse top-k),
``network`` (the ``Network`` shell), ``state`` (``Network.from_state``).
"""
from slide.engine.network import LOSSES, Network

__all__ = ["LOSSES", "Network"]
