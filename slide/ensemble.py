"""``SlideEnsemble``: K independently seeded ``SlideClassifier`` members whose predictions are
combined (the label trees do the same: Omikuji averages 3 trees by default).

Each member is a clone of ``estimator`` with its own seed, so it differs in its initial
weights, hash functions and sampled negatives; the members' errors are partly independent and
their combination ranks better than any one of them.

Sequential (``fused=False``, the default): the members train one after another, each on all
the cores, each in its own order, on its own held-out split and with its own re-ranker when the
estimator has one, and are combined as below. Fused (``fused=True``; ``slide.fused``): the
members train in one pass over the same batches (member 0's order of rows and held-out
split), side by side on the threads, and the ensemble fits one set of ranking stages (vote,
re-ranker, linear classifiers) on their stacked network, whose logits are the mean of the
members'; its predictions come from there (``rank_``). Why sequential is the default: on
the real sets four fused members ranked within noise of one ``SlideClassifier`` (P@1), while
two members one after another ranked 0.4-0.5 points above it, in two thirds of the fused
four's training time (``bench/results/accuracy_defaults_amd.md``, "Ensembles at equal training
time"; ``docs/design.md``, "Fused members").

Sequential ``predict_topk``: members with a re-ranker (the default) each rank their
``FUSE_DEPTH`` best labels (``SlideClassifier.predict_topk_scored``), and a label's score is
the sum over the members of its log-probability, ``FUSE_FLOOR`` where a member did not list
it: averaging the members' blends without their re-rankers ranked below one re-ranked model on
debcontents
(``bench/results/accuracy_debcontents_ensemble_2855027.md``). Members without a re-ranker: the
mean of their probabilities.
Sequential ``predict_proba``: always the mean of the members' probabilities (``SlideClassifier.
predict_proba``: softmax, or sigmoid for ``loss="sigmoid"``, blended with the member's own
neighbour vote), every label scored.

One file holds the whole ensemble (``save`` / ``slide.load``): the members' checkpoints side
by side in one archive (``slide.persist.checkpoint``, format tag ``slide-ensemble``).
"""
import time

import numpy as np

try:  # scikit-learn is a dependency; BaseEstimator gives get_params/set_params/clone/repr
    from sklearn.base import BaseEstimator, ClassifierMixin, clone
except ImportError:  # pragma: no cover
    BaseEstimator = object
    ClassifierMixin = object
    clone = None

from sklearn.exceptions import NotFittedError

from slide import fused as fused_mod
from slide import labels as labels_mod
from slide.data import as_feature_matrix, cap_row_labels
from slide.estimator import SlideClassifier
from slide.kernels.topk import fold_topk, probabilities
from slide.labels import encode, encode_known
from slide.params import check_k, is_int
from slide.network.trainer import blas_single_thread
from slide.persist.checkpoint import save_ensemble
from slide.rank.stack import RankStack


# rows scored at once: the block's dense probabilities stay near 64 MB at any label count
_BLOCK_ENTRIES = 1 << 24
# the re-ranked members' fusion: each member's labels read a row, the probability of a label a
# member did not list, and rows fused at once
FUSE_DEPTH = 50
FUSE_FLOOR = 1e-6
_FUSE_ROWS = 16384


def fuse_ranked(lists, k, n_labels, with_scores=False):
    """(n, k) int64: the k best labels of each row by the sum over the members' ranked lists
    ``lists`` ([(ids [n, d], probabilities [n, d])], -1 for no label) of log(max(p,
    FUSE_FLOOR)), log(FUSE_FLOOR) for a member that did not list the label; ties to the lower
    label. A row with fewer than k labels listed is padded with -1. ``with_scores``: also
    their scores [n, k] float64, the geometric mean of the members' (floored) probabilities,
    which orders them as the sum does (0.0 where padded)."""
    first_ids, _ = lists[0]
    n = first_ids.shape[0]
    ids = np.concatenate([np.asarray(i, np.int64) for i, _ in lists], axis=1)
    # each listing's gain over the floor (>= 0): the absent members' floors are then a
    # constant of the row, which the ranking ignores
    gain = np.concatenate([np.log(np.maximum(np.asarray(p, np.float64), FUSE_FLOOR))
                           for _, p in lists], axis=1) - np.log(FUSE_FLOOR)
    valid = ids.ravel() >= 0
    keys = (np.repeat(np.arange(n, dtype=np.int64), ids.shape[1]) * int(n_labels)
            + ids.ravel())[valid]
    uniq, inverse = np.unique(keys, return_inverse=True)
    score = np.bincount(inverse, weights=gain.ravel()[valid], minlength=uniq.shape[0])
    row, label = uniq // int(n_labels), uniq % int(n_labels)
    order = np.lexsort((label, -score, row))
    row, label = row[order], label[order]
    first = np.searchsorted(row, np.arange(n))
    rank = np.arange(row.shape[0]) - first[row]
    out = np.full((n, k), -1, np.int64)
    keep = rank < k
    out[row[keep], rank[keep]] = label[keep]
    if not with_scores:
        return out
    scores = np.zeros((n, k), np.float64)
    scores[row[keep], rank[keep]] = np.exp(score[order][keep] / len(lists)
                                           + np.log(FUSE_FLOOR))
    return out, scores


def member_seed(seed, k):
    """Seed of member ``k`` of an ensemble seeded ``seed``: independent streams for every
    (seed, k), the same on every machine."""
    return int(np.random.SeedSequence([int(seed), int(k)]).generate_state(1)[0] & 0x7FFFFFFF)


def _unfinished(member, n_rows, fused):
    """Whether a fitted member has training left: stopped by its callback (``stopped_``; a
    member loaded from a file has no such flag), short of its epochs over ``n_rows`` rows with
    time left in its own ``time_budget``, or, in a sequential ensemble, without the neighbour
    memory its ``fit`` ends with."""
    epochs = member.planned_batches(n_rows, member.n_labels_)[0]
    spent = member.time_budget is not None and member.train_seconds_ >= member.time_budget
    return (getattr(member, "stopped_", False) or (member.epoch_ < epochs and not spent)
            or (not fused and member.rank_.missing(member.neighbours)))


class SlideEnsemble(ClassifierMixin, BaseEstimator):
    """``n_models`` ``SlideClassifier`` members, their rankings fused (module docstring).

    Parameters
    ----------
    estimator : SlideClassifier or None
        The members' configuration (unfitted; cloned per member). None: ``SlideClassifier()``.
        Its ``time_budget``, if set, is the whole ensemble's: each member gets an equal share.
    n_models : int >= 1
        Two by default: three ranked level with two on the real sets, for 1.5x the time
        (the same results file).
    random_state : int or None
        Member k is seeded ``member_seed(random_state, k)``; None: the estimator's
        ``random_state`` if set, else a fresh seed per fit.
    fused : bool
        False (the default): the members train one after another, each ranked on its own;
        True: in one pass, ranked as one stacked network (module docstring).

    Fitted attributes: ``members_`` (the fitted members), ``n_features_in_``, ``n_labels_``,
    ``seed_``, ``train_seconds_`` and ``compile_seconds_`` (sequential: sums over the
    members; fused: the pass's and the ranking stages' seconds); fused also ``rank_`` (the
    stacked network's ``RankStack``) and ``order_seed_`` (the seed of its order of rows).
    """

    def __init__(self, estimator=None, n_models=2, random_state=None, fused=False):
        self.estimator = estimator
        self.n_models = n_models
        self.random_state = random_state
        self.fused = fused

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_stacked", None)         # a cache (n_labels x K h floats), rebuilt on use
        return state

    # ------------------------------------------------------------------------------------------
    def _template(self):
        return fused_mod.template_estimator(self.estimator)

    def _validate(self):
        if not is_int(self.n_models) or self.n_models < 1:
            raise ValueError(f"n_models must be a positive integer, got {self.n_models!r}")
        if self.random_state is not None and (not is_int(self.random_state)
                                              or self.random_state < 0):
            raise ValueError(f"random_state must be None or a non-negative integer, got "
                             f"{self.random_state!r}")
        if not isinstance(self.fused, (bool, np.bool_)):
            raise ValueError(f"fused must be True or False, got {self.fused!r}")
        template = self._template()
        template._checked_params()
        return template

    def _members_to_fit(self, template):
        seed = self.random_state
        if seed is None:
            seed = template.random_state
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0] & 0x7FFFFFFF)
        self.seed_ = int(seed)
        budget = template.time_budget
        share = None if budget is None else float(budget) / int(self.n_models)
        return [clone(template).set_params(random_state=member_seed(seed, k), time_budget=share)
                for k in range(int(self.n_models))]

    def fit(self, X, Y, eval_set=None, callback=None, classes=None, resume=False):
        """Train the members: fused (``fused=True``), in one pass side by side, ranked as one
        stacked network (``slide.fused``); else one after another, each with its own ranking
        stages. ``callback(member, info)`` is each member's ``fit`` callback, with
        ``info["member"]`` = its index (fused: once a wave of batches); a true return value
        stops that member (the others still train; a fused ensemble with a stopped member
        fits no ranking stages). Y and ``classes``: as ``SlideClassifier.fit`` takes them
        (read once; every member gets the same ``classes_``).

        resume=True (a fitted ensemble, or one loaded from its file): the members its callback
        stopped train on from where they stopped, on the same data, to the end of their epochs,
        as ``SlideClassifier.fit(resume=True)`` does, and a fused ensemble then fits its
        ranking stages; members that finished are kept as they are. Unfitted: a fresh fit."""
        template = self._validate()
        one_d = labels_mod.one_label_per_row(Y)
        Y, names = encode(Y, name="Y", classes=classes)
        if resume and hasattr(self, "members_"):
            return self._resume(X, Y, names, one_d, eval_set, callback)
        members = self._members_to_fit(template)
        if self.fused:
            return self._fit_fused(members, X, Y, names, one_d, eval_set, callback,
                                   template.time_budget)
        self._drop_fused()
        fitted = []
        for k, member in enumerate(members):
            cb = None if callback is None else \
                (lambda m, info, k=k: callback(m, dict(info, member=k)))
            fitted.append(member.fit(X, Y, eval_set=eval_set, callback=cb, classes=names))
            labels_mod.set_target(member, one_d)    # each member was given Y as a matrix
        self._set_members(fitted)
        return self

    @classmethod
    def from_members(cls, members, random_state):
        """The sequential ensemble of ``members``, fitted ``SlideClassifier``s seeded
        ``member_seed(random_state, k)`` (member k), as ``fit`` would have trained them, e.g.
        one a process (``slide train`` with ``model.n_models``). The members must agree in
        every hyperparameter but their seed and in their inputs, labels and label names."""
        if not is_int(random_state) or random_state < 0:
            raise ValueError(f"random_state must be the non-negative integer the members were "
                             f"seeded from, got {random_state!r}")
        members = list(members)
        if not members or not all(isinstance(m, SlideClassifier) and hasattr(m, "network_")
                                  for m in members):
            raise ValueError("members must be one or more fitted SlideClassifiers")
        first = members[0]
        own = ("random_state", "time_budget")
        shared = {k: v for k, v in first.get_params(deep=False).items() if k not in own}
        for k, m in enumerate(members):
            if m.random_state != member_seed(random_state, k):
                raise ValueError(f"member {k} is seeded {m.random_state}, not "
                                 f"member_seed({random_state}, {k}) = "
                                 f"{member_seed(random_state, k)}")
            theirs = {p: v for p, v in m.get_params(deep=False).items() if p not in own}
            differ = sorted(p for p in shared if theirs.get(p) != shared[p])
            if differ:
                raise ValueError(f"member {k} differs from member 0 in {', '.join(differ)}")
            if ((m.n_features_in_, m.n_labels_) != (first.n_features_in_, first.n_labels_)
                    or not np.array_equal(np.asarray(m.classes_), np.asarray(first.classes_))):
                raise ValueError(f"member {k} was fitted on other inputs or labels than "
                                 f"member 0")
        budget = first.time_budget
        estimator = clone(first).set_params(
            random_state=random_state,
            time_budget=None if budget is None else budget * len(members))
        ensemble = cls(estimator=estimator, n_models=len(members), random_state=random_state)
        ensemble.seed_ = int(random_state)
        ensemble._set_members(members)
        return ensemble

    def _resume(self, X, Y, names, one_d, eval_set, callback):
        """``fit(resume=True)`` of a fitted ensemble (its docstring)."""
        members = self.members_
        if len(members) != int(self.n_models) or bool(self.fused) != self._is_fused():
            raise ValueError(f"resume needs the ensemble as it was fitted: {len(members)} "
                             f"members, fused={self._is_fused()}; it is set to n_models="
                             f"{self.n_models}, fused={self.fused}")
        stopped = [k for k, m in enumerate(members) if _unfinished(m, X.shape[0], self.fused)]
        if self.fused:
            return self._resume_fused(stopped, X, Y, names, one_d, eval_set, callback)
        for k in stopped:
            cb = None if callback is None else \
                (lambda m, info, k=k: callback(m, dict(info, member=k)))
            members[k].fit(X, Y, eval_set=eval_set, callback=cb, classes=names, resume=True)
            labels_mod.set_target(members[k], one_d)
        self._set_members(members)
        return self

    # -- fused members (slide.fused) -------------------------------------------------------------
    def _fit_fused(self, members, X, Y, names, one_d, eval_set, callback, budget):
        """``fit`` with ``fused=True``: the members built on one check of the data, trained
        together (``slide.fused.train_members``, within the template's ``budget``) on the rows
        of member 0's held-out split, in member 0's order of rows, then one ranking stack on
        their stacked network."""
        self._drop_fused()
        for m in members:
            # the ensemble's clock and budget drive the pass; a member runs one batch at a
            # time (the members are what is in flight)
            m.set_params(time_budget=None, batches_in_flight=1)
        first = members[0]
        compile_seconds = fused_mod.warm_up_members(members, X, Y, first._threads())
        hs, sparse = first._checked_params()
        X, Y, names = first._check_training_data(X, Y, False, names)
        for m in members:
            m._build(X.shape[1], Y.shape[1], hs, sparse)
            labels_mod.set_classes(m, names)
        self.order_seed_ = int(first.seed_)
        Y, eval_set, split = self._pass_rows(first, X, Y, eval_set)
        cb = None if callback is None else \
            (lambda k, m, info: callback(m, dict(info, member=k)))
        seconds = fused_mod.train_members(
            members, X, Y, None if split is None else split[0], self.order_seed_,
            first._threads(), time_budget=budget, callback=cb, eval_set=eval_set)
        for m in members:
            labels_mod.set_target(m, one_d)
        self._set_members(members)
        self.rank_ = RankStack()
        seconds += self._rank_when_trained(X, Y, split)
        self.train_seconds_ = float(seconds)
        self.compile_seconds_ = float(compile_seconds)
        return self

    def _resume_fused(self, stopped, X, Y, names, one_d, eval_set, callback):
        """``fit(resume=True)`` of a fused ensemble: each stopped member trained on alone from
        its position, over the same rows in the same order (a member's training does not
        depend on the others: ``tests/test_fused.py``), then the ranking stages."""
        members = self.members_
        first = members[0]
        seconds = float(self.train_seconds_)
        budget = self._template().time_budget       # the pass's, as in ``_fit_fused``
        if budget and seconds >= budget:
            stopped = []                            # spent: no more training, as alone
        compile_seconds = (fused_mod.warm_up_members([members[k] for k in stopped], X, Y,
                                                     first._threads()) if stopped else 0.0)
        X, Y, _ = first._check_training_data(X, Y, True, names)
        Y, eval_set, split = self._pass_rows(first, X, Y, eval_set)
        for k in stopped:
            cb = None if callback is None else \
                (lambda _, m, info, k=k: callback(m, dict(info, member=k)))
            clock = fused_mod.train_members(
                [members[k]], X, Y, None if split is None else split[0], self.order_seed_,
                first._threads(), time_budget=budget, callback=cb, eval_set=eval_set)
            seconds = max(seconds, clock)
            labels_mod.set_target(members[k], one_d)
        self.train_seconds_ = float(seconds + self._rank_when_trained(X, Y, split))
        self.compile_seconds_ = float(compile_seconds)
        return self

    def _pass_rows(self, first, X, Y, eval_set):
        """(Y as the pass trains on it: capped by the order's seed, ``eval_set`` checked, the
        re-ranker's held-out split) of checked (X, Y), as ``first`` (member 0) splits them."""
        Y = cap_row_labels(Y, first.max_row_labels, self.order_seed_)
        if eval_set is not None:
            eval_set = first._check_eval_set(eval_set, X, Y)
        return Y, eval_set, first._rerank_split(X.shape[0], Y.shape[1])

    def _rank_when_trained(self, X, Y, split):
        """Fit the stacked ranking where the members have a vote, none is stopped and it is
        not fitted yet; returns its seconds (0.0 where not fitted)."""
        members = self.members_
        if (members[0].neighbours <= 0 or self.rank_.fitted
                or any(getattr(m, "stopped_", False) for m in members)):
            return 0.0
        t0 = time.perf_counter()
        self._stacked = None            # the stacked output of the members as trained now
        self._fit_ranking(X, Y, split)
        return time.perf_counter() - t0

    def _fit_ranking(self, X, Y, split):
        """The stacked network's ranking stages (``RankStack``: with ``split``, the re-ranker
        on its held-out rows, then the neighbour memory of every row)."""
        first = self.members_[0]
        first._threads()
        for m in self.members_:
            m.network_.release_scratch()
        with blas_single_thread():
            H = fused_mod.stacked_hidden(self.members_, X)
            self.rank_.fit(H, self._stacked_output(), X, Y, int(first.neighbours), split,
                           self.order_seed_, max_ovr_work=first._max_ovr_work)

    def _drop_fused(self):
        for name in ("rank_", "order_seed_", "_stacked"):
            self.__dict__.pop(name, None)

    def _is_fused(self):
        return hasattr(self, "rank_")

    def _stacked_output(self):
        if getattr(self, "_stacked", None) is None:
            self._stacked = fused_mod.stacked_output(self.members_)
        return self._stacked

    def _stacked_rows(self, X):
        """(X checked as the members read it, the stacked hidden layer of its rows)."""
        first = self.members_[0]
        X = first._check_data(self._rows(X), fitted=True)
        first._threads()
        return X, fused_mod.stacked_hidden(self.members_, X)

    def _vote(self):
        """The fused ranking's vote (k, weight), or None without its memory."""
        first = self.members_[0]
        if self.rank_.memory is None or first.neighbours_ <= 0:
            return None
        return int(first.neighbours_), float(first.neighbour_weight_)

    def _fused_stacked_topk(self, X, k, with_scores=False):
        """The stacked network's exact top-k: ids, or (ids, scores [n, k] float64) with
        ``with_scores``: the re-ranker's probabilities, the blend with the vote, or the
        logits, as ``SlideClassifier.predict_topk_scored``'s."""
        X, H = self._stacked_rows(X)
        out, vote = self._stacked_output(), self._vote()
        with blas_single_thread():
            if vote is None:
                ids, logits = out.topk_lse(H, k)[:2]
                ranked = ids, np.asarray(logits, np.float64)
            elif self.rank_.reranker is not None:
                ranked = self.rank_.topk_reranked(H, out, X, k)
            else:
                ranked = self.rank_.topk_blended(H, out, k, *vote)
        return ranked if with_scores else ranked[0]

    def _fused_proba(self, X):
        X, H = self._stacked_rows(X)
        out, vote = self._stacked_output(), self._vote()
        with blas_single_thread():
            if vote is None:
                return probabilities(out.logits(H), out.sigmoid)
            return self.rank_.proba(H, out, *vote)

    def _set_members(self, members):
        self.members_ = list(members)
        first = self.members_[0]
        self.n_features_in_ = first.n_features_in_
        self.n_labels_ = first.n_labels_
        self.classes_ = first.classes_
        self.named_labels_ = first.named_labels_
        labels_mod.set_target(self, labels_mod.fitted_on_1d(first))
        self.train_seconds_ = float(sum(m.train_seconds_ for m in self.members_))
        self.compile_seconds_ = float(sum(getattr(m, "compile_seconds_", 0.0)
                                          for m in self.members_))

    # ------------------------------------------------------------------------------------------
    def _check_fitted(self):
        if not hasattr(self, "members_"):
            raise NotFittedError("this SlideEnsemble is not fitted yet; call fit first")

    def _block_proba(self, X):
        """Mean member probabilities [rows, n_labels] of a block of rows (float32; each
        member's own blend with its neighbour vote, ``SlideClassifier.predict_proba``)."""
        total = None
        for m in self.members_:
            p = m.predict_proba(X)
            total = p if total is None else total + p
        total /= len(self.members_)
        return total

    def _rows(self, X):
        """X as a feature matrix of the fitted width, with at least one row (ValueError)."""
        X = as_feature_matrix(X, n_features=self.n_features_in_, name="X")
        if X.shape[0] == 0:
            raise ValueError("X has no rows")
        return X

    def _blocks(self, X):
        X = self._rows(X)
        rows = max(1, _BLOCK_ENTRIES // max(int(self.n_labels_), 1))
        for a in range(0, X.shape[0], rows):
            yield self._block_proba(X[a:a + rows])

    def predict_proba(self, X):
        """Mean member probabilities, dense [n, n_labels] float32 (mind the size at many
        labels: ``predict_topk`` works block by block)."""
        self._check_fitted()
        if self._is_fused():
            return self._fused_proba(X)
        return np.vstack(list(self._blocks(X)))

    def predict_scores(self, X):
        """The ensemble's scores: its mean probabilities (``predict_proba``)."""
        return self.predict_proba(X)

    def _reranked(self):
        """Whether every member ranks by its re-ranker (then ``predict_topk`` fuses them)."""
        return all(m._reranks() for m in self.members_)

    def predict_topk(self, X, k=5, exact=True, prior_candidates=256, *, return_names=False):
        """(n, k) int64 label ids, best first (``return_names``: their ``classes_`` names):
        the members' re-ranked lists fused (``fuse_ranked``) when every member has a
        re-ranker, else by mean member probability over every label (ties: the lower label).
        ``exact=False``, the members' LSH serving, is not offered for an ensemble;
        ``prior_candidates`` is accepted for ``SlideClassifier``'s signature and unused."""
        self._check_fitted()
        k = check_k(k, self.n_labels_)
        if not exact:
            raise ValueError("SlideEnsemble scores every label: exact=False is not supported "
                             "(serve a member with exact=False instead)")
        ids = self._topk(X, k, False)
        return np.asarray(self.classes_)[ids] if return_names else ids

    def predict_topk_scored(self, X, k=5):
        """``predict_topk``'s labels with the score that ranked each: (ids [n, k] int64,
        scores [n, k] float64): fused, the stacked network's (as ``SlideClassifier.
        predict_topk_scored``'s); re-ranked members, the geometric mean of their re-ranked
        probabilities (``fuse_ranked``); else the mean member probability."""
        self._check_fitted()
        return self._topk(X, check_k(k, self.n_labels_), True)

    def _topk(self, X, k, with_scores):
        """ids, or (ids, scores) with ``with_scores``, of the exact top-k (``predict_topk``)."""
        if self._is_fused():
            return self._fused_stacked_topk(X, k, with_scores)
        if self._reranked():
            return self._fused_topk(X, k, with_scores)
        ids_out, score_out = [], []
        for p in self._blocks(X):
            # one parallel pass (ties: the lower label), not numpy's partition and sort
            ids = np.full((p.shape[0], k), -1, np.int64)
            fold_topk(p, 0, k, ids, np.full((p.shape[0], k), -np.inf, np.float32))
            short = (ids < 0).any(axis=1)        # NaN or -inf entries: numpy's order there
            if short.any():
                ids[short] = np.argsort(-p[short], axis=1, kind="stable")[:, :k]
            ids_out.append(ids)
            score_out.append(np.take_along_axis(p, ids, axis=1).astype(np.float64))
        ids = np.vstack(ids_out)
        return (ids, np.vstack(score_out)) if with_scores else ids

    def _fused_topk(self, X, k, with_scores):
        X = self._rows(X)
        depth = min(max(k, FUSE_DEPTH), self.n_labels_)
        out = []
        for a in range(0, X.shape[0], _FUSE_ROWS):
            block = X[a:a + _FUSE_ROWS]
            out.append(fuse_ranked([m.predict_topk_scored(block, k=depth)
                                    for m in self.members_], k, self.n_labels_, with_scores))
        if with_scores:
            return np.vstack([i for i, _ in out]), np.vstack([s for _, s in out])
        return np.vstack(out)

    def predict(self, X, k=1):
        """As ``SlideClassifier.predict``: a ``scipy.sparse.csr_matrix`` (n_samples, n_labels)
        of int8 with a 1 at each row's ``k`` best labels of ``predict_topk``, columns ordered
        as ``classes_``; for an ensemble fitted on a 1-D ``y``, the 1-D array of each row's
        best label (``k`` must be 1). The top-1 names ``predict`` returned before:
        ``predict_topk(X, k=1, return_names=True)[:, 0]``."""
        self._check_fitted()
        return labels_mod.predict(self, X, k)

    def score(self, X, y, exact=True, prior_candidates=256):
        """Precision@1 of the top prediction (y: the true labels, as ``fit`` takes its Y)."""
        self._check_fitted()
        top = self.predict_topk(X, k=1, exact=exact)[:, 0]
        Y = encode_known(y, self, n_rows=top.shape[0], name="Y")
        return float(np.asarray(Y[np.arange(top.shape[0]), top]).ravel().mean())

    # ------------------------------------------------------------------------------------------
    def save(self, path, extra=None, optimizer_state=True):
        """Write the whole ensemble to one file atomically; ``slide.load`` reads it back.
        ``optimizer_state=False``: its members as ``SlideClassifier.save`` writes them so."""
        self._check_fitted()
        save_ensemble(self, path, extra, optimizer_state=optimizer_state)
