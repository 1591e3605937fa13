"""``RankStack``: the post-fit stages of a trained network, in the order ``fit`` runs them.

1. The held-out split (``n_held`` / ``split``): with the re-ranker, the network trains on
   the fitting rows only and the re-ranker learns from the held-out rows, which it sees as a
   test row would (``slide.rank.rerank``).
2. ``fit``: the per-label linear classifiers (``slide.rank.linear``) on the fitting rows,
   the re-ranker on the held-out rows, then the neighbour memory (``slide.rank.vote``) of
   every row; without a split, the memory alone.
3. Prediction from the last hidden layer H of the query rows and the network's output layer
   (an ``OutputLayer`` or anything answering ``topk_lse`` / ``logits_at`` / ``logits``):
   the re-ranker's top-k, the vote-blended top-k, or the vote-blended probabilities.

The stack holds fitted state only (``memory``, ``reranker``); the settings that choose
between its predictions (``neighbours``, ``neighbour_weight``, ``rerank``) stay with the
estimator and are passed in."""
import numpy as np

from slide.data.inputs import slice_rows
from slide.kernels.topk import probabilities
from slide.rank import rerank
from slide.rank.rerank import fit_reranker
from slide.rank.vote import NeighbourMemory, add_vote, blend_block


class RankStack:
    """The fitted ranking stages: ``memory`` (``NeighbourMemory`` or None) and ``reranker``
    (``ReRanker`` over that memory, or None)."""

    def __init__(self, memory=None, reranker=None):
        self.memory = memory
        self.reranker = reranker

    # -- the held-out split --------------------------------------------------------------------
    @staticmethod
    def n_held(n_rows, n_labels, min_rows=None):
        """Rows of n_rows held out for the re-ranker (``rerank.n_holdout``)."""
        return rerank.n_holdout(n_rows, n_labels,
                                rerank.MIN_HOLDOUT_ROWS if min_rows is None else min_rows)

    @staticmethod
    def split(n_rows, n_labels, seed, min_rows=None):
        """(fitting rows, held-out rows), seeded (``rerank.holdout_rows``)."""
        return rerank.holdout_rows(n_rows, seed,
                                   rerank.MIN_HOLDOUT_ROWS if min_rows is None else min_rows,
                                   n_labels)

    # -- fitting -------------------------------------------------------------------------------
    def fit(self, H, output, X, Y, k_nn, split=None, seed=0, max_ovr_work=None):
        """Fit the stages on the labelled rows (X, Y) whose last hidden layer is H (consumed:
        the memory normalises it in place). ``split`` (fitting rows, held-out rows): the
        re-ranker first, then the memory; None: a new memory alone (``fit_neighbours``: a
        re-ranker fitted before stays). ``max_ovr_work``: the one-vs-rest classifiers' cap
        (``linear.MAX_OVR_WORK`` where None). Returns self."""
        if split is None:
            self.memory = NeighbourMemory.build(H, Y, copy=False)
        else:
            self.reranker, self.memory = fit_reranker(output, H, X, Y, split[0], split[1],
                                                      int(k_nn), seed,
                                                      max_ovr_work=max_ovr_work)
        return self

    def clear(self):
        """Forget the fitted stages (training changed the weights they were fitted on)."""
        self.memory = None
        self.reranker = None

    @property
    def fitted(self):
        return self.memory is not None

    def missing(self, neighbours):
        """Whether a model whose ``fit`` ends by building these stages (its ``neighbours`` > 0)
        lacks them: a fit stopped between its network's last batch and this stage resumes
        into it (``slide train --resume``, an ensemble's members)."""
        return neighbours > 0 and not self.fitted

    # -- prediction ----------------------------------------------------------------------------
    def topk_reranked(self, H, output, X, k, block=1024):
        """(ids [n, k] int64, the re-ranker's probabilities [n, k] float64), best first, of
        the candidates of the network and the vote (``ReRanker.topk``), block by block."""
        k_eff, out, out_scores = _topk_outputs(H.shape[0], k, output.n_labels)
        for lo in range(0, H.shape[0], block):
            hi = min(H.shape[0], lo + block)
            out[lo:hi], out_scores[lo:hi] = self.reranker.topk(
                output, slice_rows(X, lo, hi), H[lo:hi], self.memory, k_eff)
        return out, out_scores

    def topk_blended(self, H, output, k, n_neighbours, weight, block=1024):
        """Exact top-k of the network's probabilities blended with the vote of the
        ``n_neighbours`` nearest memory rows: (1 - weight) * p_j + weight * vote_j, p the
        softmax of the logits (the per-label sigmoid for a sigmoid output). The blend's top-k
        lies in the union of the network's top-k and the voted labels. Returns (ids [n, k]
        int64, their blended scores [n, k] float64)."""
        k_eff, out, out_scores = _topk_outputs(H.shape[0], k, output.n_labels)
        for lo in range(0, H.shape[0], block):
            hi = min(H.shape[0], lo + block)
            Hb = H[lo:hi]
            top_ids, top_z, lse = output.topk_lse(Hb, k_eff)
            V = self.memory.vote(Hb, n_neighbours)
            out[lo:hi], out_scores[lo:hi] = blend_block(top_ids, top_z, lse, V,
                                                        output.logits_at(Hb, V), weight,
                                                        output.sigmoid, k_eff)
        return out, out_scores

    def proba(self, H, output, n_neighbours, weight, block=1024):
        """Dense label probabilities [n, n_labels] float32 of the network, blended with the
        vote."""
        out = np.empty((H.shape[0], output.n_labels), np.float32)
        for lo in range(0, H.shape[0], block):
            hi = min(H.shape[0], lo + block)
            p = probabilities(output.logits(H[lo:hi]), output.sigmoid)
            add_vote(p, self.memory.vote(H[lo:hi], n_neighbours), weight)
            out[lo:hi] = p
        return out


def _topk_outputs(n_rows, k, n_labels):
    """k capped at the label count, and the zeroed (ids int64, scores float64) [n_rows, k]
    that a top-k fills block by block."""
    k_eff = min(k, n_labels)
    return k_eff, np.zeros((n_rows, k_eff), np.int64), np.zeros((n_rows, k_eff), np.float64)
