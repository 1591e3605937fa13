"""The trainable network: ``Network`` and what trains and queries it.

Modules: ``network`` (the ``Network`` shell: arrays, LSH indices, ``output_layer()``),
``state`` (``Network.from_state``), ``batch`` (one HOGWILD batch per sample and its optimizer
step), ``block`` (the batched engine: the shared negatives as GEMMs), ``dense`` (the
full-softmax path), ``infer`` (hidden layer, exact / serving / sparse top-k), ``optim``
(``SparseOptimizer``), ``schedule`` (``RehashSchedule``), ``trainer`` (the batch/epoch loop),
``diagnostics`` (how well the sampled active set stands in for the full softmax;
``diagnostics.every`` logs it from a ``fit`` callback). The per-sample kernels and bundles
they call are ``slide.kernels``'.

Three Numba facts the layout depends on: (1) ``cache=True`` alone invalidates a kernel's cache
only when its own file changes, not when a helper it calls from another module does, so slide
keys each kernel by its module's import closure (``slide.kernels.cache``);
(2) inside a ``prange`` body, a store made directly through a bundle attribute
(``bundle.arr[i] = v``) is lost (Numba 0.68): parallel kernels take the arrays out of their
bundles before the loop, or store through a called function; (3) a recursive kernel called
from a cached one crashes the process when the caller is loaded from the cache (Numba 0.68):
``block_step.pairwise_sum`` keeps an explicit stack instead.
"""
from slide.network.network import LOSSES, Network


__all__ = ["LOSSES", "Network"]
