"""``SlideEnsemble``: K independently seeded ``SlideClassifier`` members whose predicted label
probabilities are averaged (the label trees do the same: Omikuji averages 3 trees by default).

Each member is a clone of ``estimator`` with its own seed, so it differs in its initial
weights, batch order, hash functions and sampled negatives; the members' errors are partly
independent and their averaged probabilities rank better than any one of them
(``bench/results/accuracy.md``). Members train one after another, each on all the cores.
Inference scores every label (the exact path): per block of rows, each member's probabilities
(``SlideClassifier.predict_proba``: softmax, or sigmoid for ``loss="sigmoid"``, blended with the
member's own neighbour vote) are averaged.

One file holds the whole ensemble (``save`` / ``slide.load``): the members' checkpoints side
by side in one archive (``slide.checkpoint``, format tag ``slide-ensemble``).
"""
import numpy as np

try:  # scikit-learn is a dependency; BaseEstimator gives get_params/set_params/clone/repr
    from sklearn.base import BaseEstimator, ClassifierMixin, clone
except ImportError:  # pragma: no cover
    BaseEstimator = object
    ClassifierMixin = object
    clone = None

from slide.params import check_k, is_int

# rows scored at once: the block's dense probabilities stay near 64 MB at any label count
_BLOCK_ENTRIES = 1 << 24


def member_seed(seed, k):
    """Seed of member ``k`` of an ensemble seeded ``seed``: independent streams for every
    (seed, k), the same on every machine."""
    return int(np.random.SeedSequence([int(seed), int(k)]).generate_state(1)[0] & 0x7FFFFFFF)


class SlideEnsemble(ClassifierMixin, BaseEstimator):
    """Average of ``n_models`` ``SlideClassifier`` members.

    Parameters
    ----------
    estimator : SlideClassifier or None
        The members' configuration (unfitted; cloned per member). None: ``SlideClassifier()``.
        Its ``time_budget``, if set, is the whole ensemble's: each member gets an equal share.
    n_models : int >= 1
    random_state : int or None
        Member k is seeded ``member_seed(random_state, k)``; None: the estimator's
        ``random_state`` if set, else a fresh seed per fit.

    Fitted attributes: ``members_`` (the fitted members), ``n_features_in_``, ``n_labels_``,
    ``seed_``, ``train_seconds_`` and ``compile_seconds_`` (sums over the members).
    """

    def __init__(self, estimator=None, n_models=3, random_state=None):
        self.estimator = estimator
        self.n_models = n_models
        self.random_state = random_state

    # ------------------------------------------------------------------------------------------
    def _template(self):
        from slide.estimator import SlideClassifier
        if self.estimator is None:
            return SlideClassifier()
        if not isinstance(self.estimator, SlideClassifier):
            raise ValueError(f"estimator must be a SlideClassifier or None, got "
                             f"{type(self.estimator).__name__}")
        return self.estimator

    def _validate(self):
        if not is_int(self.n_models) or self.n_models < 1:
            raise ValueError(f"n_models must be a positive integer, got {self.n_models!r}")
        if self.random_state is not None and (not is_int(self.random_state)
                                              or self.random_state < 0):
            raise ValueError(f"random_state must be None or a non-negative integer, got "
                             f"{self.random_state!r}")
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
        # the members' probabilities are averaged (predict_proba, the fixed blend): a member's
        # re-ranker would go unused and cost it a tenth of its training rows
        extra = {"rerank": False} if "rerank" in template.get_params(deep=False) else {}
        return [clone(template).set_params(random_state=member_seed(seed, k),
                                           time_budget=share, **extra)
                for k in range(int(self.n_models))]

    def fit(self, X, Y, eval_set=None, callback=None, classes=None):
        """Train the members one after another. ``callback(member, info)`` is each member's
        ``fit`` callback, with ``info["member"]`` = its index; a true return value stops that
        member (the next one still trains). Y and ``classes``: as ``SlideClassifier.fit``
        takes them (read once; every member gets the same ``classes_``)."""
        from slide.labels import encode
        members = self._members_to_fit(self._validate())
        Y, names = encode(Y, name="Y", classes=classes)
        fitted = []
        for k, member in enumerate(members):
            cb = None if callback is None else \
                (lambda m, info, k=k: callback(m, dict(info, member=k)))
            fitted.append(member.fit(X, Y, eval_set=eval_set, callback=cb, classes=names))
        self._set_members(fitted)
        return self

    def _set_members(self, members):
        self.members_ = list(members)
        first = self.members_[0]
        self.n_features_in_ = first.n_features_in_
        self.n_labels_ = first.n_labels_
        self.classes_ = first.classes_
        self.named_labels_ = first.named_labels_
        self.train_seconds_ = float(sum(m.train_seconds_ for m in self.members_))
        self.compile_seconds_ = float(sum(getattr(m, "compile_seconds_", 0.0)
                                          for m in self.members_))

    # ------------------------------------------------------------------------------------------
    def _check_fitted(self):
        if not hasattr(self, "members_"):
            from sklearn.exceptions import NotFittedError
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

    def _blocks(self, X):
        from slide.data import as_feature_matrix
        X = as_feature_matrix(X, n_features=self.n_features_in_, name="X")
        if X.shape[0] == 0:
            raise ValueError("X has no rows")
        rows = max(1, _BLOCK_ENTRIES // max(int(self.n_labels_), 1))
        for a in range(0, X.shape[0], rows):
            yield self._block_proba(X[a:a + rows])

    def predict_proba(self, X):
        """Mean member probabilities, dense [n, n_labels] float32 (mind the size at many
        labels: ``predict_topk`` works block by block)."""
        self._check_fitted()
        return np.vstack(list(self._blocks(X)))

    def predict_scores(self, X):
        """The ensemble's scores: its mean probabilities (``predict_proba``)."""
        return self.predict_proba(X)

    def predict_topk(self, X, k=5, exact=True, prior_candidates=256, *, return_names=False):
        """(n, k) int64 label ids by mean member probability, best first (``return_names``:
        their ``classes_`` names). Every label is
        scored (``exact=False``, the members' LSH serving, is not offered for an ensemble);
        ``prior_candidates`` is accepted for ``SlideClassifier``'s signature and unused."""
        self._check_fitted()
        k = check_k(k, self.n_labels_)
        if not exact:
            raise ValueError("SlideEnsemble scores every label: exact=False is not supported "
                             "(serve a member with exact=False instead)")
        out = []
        for p in self._blocks(X):
            if k < p.shape[1]:
                idx = np.argpartition(-p, k - 1, axis=1)[:, :k]
            else:
                idx = np.tile(np.arange(p.shape[1]), (p.shape[0], 1))
            order = np.argsort(-np.take_along_axis(p, idx, axis=1), axis=1, kind="stable")
            out.append(np.take_along_axis(idx, order, axis=1).astype(np.int64))
        ids = np.vstack(out)
        return np.asarray(self.classes_)[ids] if return_names else ids

    def predict(self, X):
        """Top-1 label per row, as ``classes_`` names it."""
        return self.predict_topk(X, k=1, return_names=True)[:, 0]

    def score(self, X, y, exact=True, prior_candidates=256):
        """Precision@1 of the top prediction (y: the true labels, as ``fit`` takes its Y)."""
        from slide.labels import encode_known
        self._check_fitted()
        top = self.predict_topk(X, k=1, exact=exact)[:, 0]
        Y = encode_known(y, self, n_rows=top.shape[0], name="Y")
        return float(np.asarray(Y[np.arange(top.shape[0]), top]).ravel().mean())

    # ------------------------------------------------------------------------------------------
    def save(self, path, extra=None):
        """Write the whole ensemble to one file atomically; ``slide.load`` reads it back."""
        from slide.checkpoint import save_ensemble
        self._check_fitted()
        save_ensemble(self, path, extra)
