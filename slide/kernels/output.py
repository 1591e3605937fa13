"""``OutputLayer``: what the ranking stages (``slide.rank``) read of a trained network -- its
output layer's weights and biases and its loss -- so that they never see the ``Network``
(``Network.output_layer()`` makes one; ``slide.distributed.estimator.ShardedOutput`` answers
the same questions from a sharded model's shards)."""
from typing import NamedTuple

import numpy as np

from slide.kernels.topk import dense_logits, topk_lse_of_logits


class OutputLayer(NamedTuple):
    """A dense output layer: ``W`` [n_labels, h], ``b`` [n_labels], ``sigmoid`` (the loss is
    the per-label sigmoid, else the softmax)."""
    W: np.ndarray
    b: np.ndarray
    sigmoid: bool

    @property
    def n_labels(self):
        return self.W.shape[0]

    def topk_lse(self, H, k, chunk=32768):
        """(ids [n, k] int64, logits [n, k] float64, best first; each row's log-sum-exp over
        every label, zeros for the sigmoid) of the hidden rows H."""
        top_z, top_ids, run_max, run_sum = topk_lse_of_logits(H, self.W, self.b, k, chunk)
        lse = np.zeros(H.shape[0]) if self.sigmoid else run_max + np.log(run_sum)
        return top_ids, top_z, lse

    def logits_at(self, H, V):
        """Logit of every (row, label) pair stored in the CSR matrix V: float64 [V.nnz]."""
        rows = np.repeat(np.arange(V.shape[0]), np.diff(V.indptr))
        out = np.empty(V.nnz, np.float64)
        step = 1 << 16
        for a in range(0, V.nnz, step):
            r, j = rows[a:a + step], V.indices[a:a + step]
            out[a:a + step] = np.einsum("ij,ij->i", H[r], self.W[j]) + self.b[j]
        return out

    def logits(self, H):
        """Dense logits [n, n_labels] of the hidden rows H (``topk.dense_logits``: a product
        per thread over the rows where it pays, BLAS held to one thread by the caller)."""
        return dense_logits(H, self.W, self.b)
