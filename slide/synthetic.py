"""Realistic synthetic extreme-classification (XC) data sets.

No download is possible where this engine is developed and tested, so this module produces data
with the *structure* of the public XC benchmarks (Amazon-670K, Delicious-200K, ...) at their exact
shapes. What it models, and why (see ``datasets/README.md`` for the measured learnability):

* **Long-tailed labels.** Label popularity follows a shifted Zipf law ``p(r) ~ (r + b)^-a`` over a
  random ranking of the label ids. Most labels get a handful of training points, a few get
  thousands and some get none -- the regime in which LSH-sampled output layers matter.
* **Topics.** Labels are grouped into clusters. A point draws its first label by popularity and
  each further label from the same cluster with probability ``p_same_cluster`` (else by global
  popularity), so labels co-occur the way "related products" do. Each cluster owns a pool of
  topic features shared by all its labels, so siblings are confusable: the task is not a lookup.
* **Label signatures.** Every label owns ``sig_size`` random features with Zipf-decaying weights
  (its "keywords"); a point's signal tokens are drawn from the signatures of its labels.
* **Background noise.** The rest of a point's tokens come from a Zipfian vocabulary over all
  features (stop words and frequent terms at the head, rare words in the tail).
* **tf-idf.** Tokens are counted per point (tf), weighted ``(1 + ln tf) * idf`` with the smoothed
  idf of the *training* split (applied unchanged to the test split), and each row is L2-normalised,
  the usual preprocessing of the XC repository's bag-of-words features.

Train and test come from the same distribution but from independent random streams, so
overriding ``n_train`` leaves the test split unchanged. Everything is vectorised NumPy over chunks
of points of a fixed size (so the output depends only on the seed and the shape, never on memory),
with no Python loop over points.
"""
from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from slide.data import write_xc

__all__ = ["PRESETS", "generate", "write_dataset", "preset_params"]

# Generator knobs shared by every preset unless it overrides them. They are tuned so that a
# per-label centroid classifier reaches a P@1 in the range of real XC data sets (see
# datasets/README.md): well above the most-frequent-label baseline, far below 1.
_DEFAULTS = dict(
    label_alpha=0.8,        # Zipf exponent of label popularity (Amazon-670K shape: median label
                            # count 2, mean ~4, top 1% of labels ~30% of the label occurrences)
    label_offset=20.0,      # shift b of the Zipf law: flattens the head (top label ~1% of points)
    labels_per_cluster=40,  # mean labels per topic cluster
    cluster_pool=60,        # topic features owned by each cluster
    sig_size=24,            # signature features owned by each label
    sig_alpha=0.7,          # Zipf exponent over a signature's positions (and over a topic pool)
    p_same_cluster=0.6,     # probability that a further label comes from the first label's cluster
    frac_signal=0.07,       # share of a point's tokens drawn from its labels' signatures
    frac_topic=0.10,        # share drawn from its labels' topic pools; the rest is noise
    noise_alpha=1.05,       # Zipf exponent of the background vocabulary
    # Zipf exponent by which signature / topic features are drawn from the noise vocabulary's
    # ranking (0: uniform; > 0: keywords overlap common words, so they are not all rare)
    vocab_alpha=0.5,
    label_dispersion=2.0,   # gamma shape of the per-point label count (smaller: more spread)
    nnz_dispersion=4.0,     # gamma shape of the per-point feature count
)

# Public shapes of the XC repository sets (n_train / n_test / mean labels and nonzeros per point)
# plus the engine benchmark's shape and a tiny set for tests.
PRESETS = {
    "amazon670k": dict(n_features=135_909, n_labels=670_091, n_train=490_449, n_test=153_025,
                       avg_labels=5.45, avg_nnz=75.0, frac_signal=0.09),
    "delicious200k": dict(n_features=782_585, n_labels=205_443, n_train=196_606, n_test=100_095,
                          avg_labels=75.54, avg_nnz=301.2, labels_per_cluster=200),
    "wiki10-31k": dict(n_features=101_938, n_labels=30_938, n_train=14_146, n_test=6_616,
                       avg_labels=18.64, avg_nnz=673.0, labels_per_cluster=60,
                       frac_signal=0.04, frac_topic=0.05),
    "eurlex-4k": dict(n_features=5_000, n_labels=3_993, n_train=15_539, n_test=3_809,
                      avg_labels=5.31, avg_nnz=236.7, frac_signal=0.03, frac_topic=0.04,
                      label_alpha=1.0),
    # the engine benchmark's shape; a steeper head (Zipf 1.0, offset 5: the top label on ~4% of
    # the points) and stronger keywords than amazon670k, calibrated so that the dense
    # TensorFlow network of the SLIDE paper reaches P@1 ~0.26 after one epoch at Adam lr 1e-3,
    # about what it reaches on the real 200k-label set of issue 4 (0.276)
    "xc200k": dict(n_features=100_000, n_labels=200_000, n_train=100_000, n_test=20_000,
                   avg_labels=4.0, avg_nnz=90.0, label_alpha=1.0, label_offset=5.0,
                   frac_signal=0.2, frac_topic=0.15),
    "tiny": dict(n_features=1_500, n_labels=200, n_train=600, n_test=200,
                 avg_labels=2.0, avg_nnz=40.0, labels_per_cluster=10,
                 frac_signal=0.15, frac_topic=0.15),
}
for _p in PRESETS.values():
    for _k, _v in _DEFAULTS.items():
        _p.setdefault(_k, _v)
del _p, _k, _v

_SHAPE_KEYS = ("n_features", "n_labels", "n_train", "n_test")
# about this many tokens per generation chunk (bounds peak memory); the chunk size depends only
# on the parameters, never on the machine
_CHUNK_TOKENS = 1 << 20
_PILOT = 2_048           # points of the calibration pilot
_MAX_LABELS_PER_POINT = 2_000


def preset_params(preset, scale=1.0, **overrides):
    """The full parameter dict for ``preset`` after ``scale`` and ``overrides`` (validated)."""
    if isinstance(preset, dict):
        params = {**_DEFAULTS, **preset}
    elif preset in PRESETS:
        params = dict(PRESETS[preset])
    else:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    scale = float(scale)
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    for key in _SHAPE_KEYS:
        params[key] = max(1, int(round(params[key] * scale)))
    unknown = set(overrides) - set(params)
    if unknown:
        raise ValueError(f"unknown generator parameter(s) {sorted(unknown)}; "
                         f"known: {sorted(params)}")
    params.update(overrides)
    _validate(params)
    return params


def _validate(p):
    for key in _SHAPE_KEYS:
        if int(p[key]) != p[key] or p[key] < (0 if key == "n_test" else 1):
            raise ValueError(f"{key} must be a positive integer, got {p[key]!r}")
        p[key] = int(p[key])
    if p["n_features"] > np.iinfo(np.int32).max or p["n_labels"] > np.iinfo(np.int32).max:
        raise ValueError("n_features and n_labels must fit in int32")
    if not 1.0 <= p["avg_labels"] <= min(p["n_labels"], _MAX_LABELS_PER_POINT):
        raise ValueError(f"avg_labels must lie in [1, min(n_labels, {_MAX_LABELS_PER_POINT})], "
                         f"got {p['avg_labels']!r}")
    if not 1.0 <= p["avg_nnz"] <= p["n_features"] / 2:
        raise ValueError(f"avg_nnz must lie in [1, n_features / 2], got {p['avg_nnz']!r}")
    for key in ("p_same_cluster", "frac_signal", "frac_topic"):
        if not 0.0 <= p[key] <= 1.0:
            raise ValueError(f"{key} must lie in [0, 1], got {p[key]!r}")
    if p["frac_signal"] + p["frac_topic"] > 1.0:
        raise ValueError("frac_signal + frac_topic must not exceed 1")
    for key in ("label_alpha", "sig_alpha", "noise_alpha", "vocab_alpha", "label_offset"):
        if not p[key] >= 0:
            raise ValueError(f"{key} must be >= 0, got {p[key]!r}")
    for key in ("labels_per_cluster", "cluster_pool", "sig_size"):
        if int(p[key]) != p[key] or p[key] < 1:
            raise ValueError(f"{key} must be a positive integer, got {p[key]!r}")
        p[key] = int(p[key])
    for key in ("label_dispersion", "nnz_dispersion"):
        if not p[key] > 0:
            raise ValueError(f"{key} must be > 0, got {p[key]!r}")


def _zipf_cdf(n, alpha, offset=0.0):
    """Normalised cumulative distribution of ``(r + 1 + offset)^-alpha`` for ranks r < n."""
    w = (np.arange(n, dtype=np.float64) + 1.0 + offset) ** -alpha
    c = np.cumsum(w)
    return c / c[-1]


def _zipf_continuous(n, alpha, u):
    """Ranks in [0, n) with density ~ (x + 1)^-alpha by closed-form inverse CDF.

    The continuous approximation of a Zipf law, used where millions of draws come from a large
    vocabulary at once (a binary search per draw would dominate the model's build time).
    """
    if abs(alpha - 1.0) < 1e-9:
        x = np.exp(u * np.log(n + 1.0)) - 1.0
    else:
        e = 1.0 - alpha
        x = (1.0 + u * ((n + 1.0) ** e - 1.0)) ** (1.0 / e) - 1.0
    return np.minimum(x.astype(np.int64), n - 1)


def _draw(cdf, u):
    """Inverse-CDF sampling: indices into ``cdf`` for uniforms ``u`` (vectorised)."""
    return np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)


class _Model:
    """The latent structure shared by train and test: popularity, clusters, signatures."""

    def __init__(self, p, seed):
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED, 0]))
        L, F = p["n_labels"], p["n_features"]
        self.p = p
        # label popularity: Zipf over a random ranking of the label ids
        rank = rng.permutation(L)
        pop = (rank + 1.0 + p["label_offset"]) ** -p["label_alpha"]
        self.label_cdf = np.cumsum(pop)
        self.label_cdf /= self.label_cdf[-1]
        # clusters: labels sorted by cluster, with the cumulative popularity in that order, so a
        # draw within cluster c is a search in the segment [cstart[c], cstart[c+1])
        n_clusters = max(1, int(round(L / p["labels_per_cluster"])))
        self.cluster = rng.integers(0, n_clusters, size=L).astype(np.int32)
        self.by_cluster = np.argsort(self.cluster, kind="stable").astype(np.int32)
        cum = np.concatenate([[0.0], np.cumsum(pop[self.by_cluster])])
        self.cum_by_cluster = cum
        bounds = np.searchsorted(self.cluster[self.by_cluster], np.arange(n_clusters + 1))
        self.cstart = bounds.astype(np.int64)
        # features: topic pools, label signatures, and the noise vocabulary's ranking
        self.noise_feature = rng.permutation(F).astype(np.int32)
        self.noise_cdf = _zipf_cdf(F, p["noise_alpha"])
        a = p["vocab_alpha"]
        u_pool = rng.random((n_clusters, p["cluster_pool"]))
        self.pool = self.noise_feature[_zipf_continuous(F, a, u_pool)]
        self.sig = self.noise_feature[_zipf_continuous(F, a, rng.random((L, p["sig_size"])))]
        self.sig_cdf = _zipf_cdf(p["sig_size"], p["sig_alpha"])
        self.pool_cdf = _zipf_cdf(p["cluster_pool"], p["sig_alpha"])

    def labels(self, rng, n, mean_extra):
        """Label sets of ``n`` points: (indptr int64[n+1], labels int32), sorted, deduplicated."""
        p = self.p
        r = p["label_dispersion"]
        if mean_extra > 0:
            extra = rng.poisson(rng.gamma(r, mean_extra / r, size=n))
        else:
            extra = np.zeros(n, np.int64)
        k = 1 + np.minimum(extra, min(p["n_labels"], _MAX_LABELS_PER_POINT) - 1)
        total = int(k.sum())
        row = np.repeat(np.arange(n, dtype=np.int64), k)
        first_pos = np.concatenate([[0], np.cumsum(k)[:-1]])
        is_first = np.zeros(total, dtype=bool)
        is_first[first_pos] = True
        lab = _draw(self.label_cdf, rng.random(total)).astype(np.int32)
        # further labels: from the first label's cluster with probability p_same_cluster
        c = self.cluster[lab[first_pos]][row]
        same = (~is_first) & (rng.random(total) < p["p_same_cluster"])
        lo = self.cum_by_cluster[self.cstart[c[same]]]
        hi = self.cum_by_cluster[self.cstart[c[same] + 1]]
        target = lo + rng.random(int(same.sum())) * (hi - lo)
        pos = np.searchsorted(self.cum_by_cluster, target, side="right") - 1
        pos = np.clip(pos, self.cstart[c[same]], self.cstart[c[same] + 1] - 1)
        lab[same] = self.by_cluster[pos]
        keys = np.unique(row * p["n_labels"] + lab)      # sorts and drops repeated labels
        rows, labs = np.divmod(keys, p["n_labels"])
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
        return indptr, labs.astype(np.int32)

    def tokens(self, rng, y_indptr, y_labels, token_factor):
        """Bag of feature tokens of each point: (indptr, feature ids int32, tf counts float32)."""
        p = self.p
        n = len(y_indptr) - 1
        F = p["n_features"]
        r = p["nnz_dispersion"]
        target = rng.gamma(r, p["avg_nnz"] * token_factor / r, size=n)
        t = np.maximum(1, np.minimum(rng.poisson(target), 4 * F)).astype(np.int64)
        total = int(t.sum())
        row = np.repeat(np.arange(n, dtype=np.int64), t)
        u = rng.random(total)
        kind = np.where(u < p["frac_signal"], 0,
                        np.where(u < p["frac_signal"] + p["frac_topic"], 1, 2))
        # the first token of every point is a signal token so every point carries some evidence
        starts = np.concatenate([[0], np.cumsum(t)[:-1]])
        kind[starts] = 0
        feat = np.empty(total, dtype=np.int32)
        lab_tok = kind < 2
        # which of the point's labels a signal / topic token speaks for: uniform over its labels
        nl = np.diff(y_indptr)[row[lab_tok]]
        pick = (rng.random(int(lab_tok.sum())) * nl).astype(np.int64)
        li = y_labels[y_indptr[row[lab_tok]] + pick]
        kinds = kind[lab_tok]
        f_lab = np.empty(len(li), dtype=np.int32)
        s = kinds == 0
        f_lab[s] = self.sig[li[s], _draw(self.sig_cdf, rng.random(int(s.sum())))]
        s = ~s
        f_lab[s] = self.pool[self.cluster[li[s]], _draw(self.pool_cdf, rng.random(int(s.sum())))]
        feat[lab_tok] = f_lab
        noise = ~lab_tok
        feat[noise] = self.noise_feature[_draw(self.noise_cdf, rng.random(int(noise.sum())))]
        keys, tf = np.unique(row * F + feat, return_counts=True)   # sorted by (row, feature)
        rows, feats = np.divmod(keys, F)
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
        return indptr, feats.astype(np.int32), tf.astype(np.float32)


def _split(model, seed, stream, n, label_extra, token_factor):
    """Generate ``n`` points of one split chunk by chunk: CSR tf matrix and CSR label matrix."""
    p = model.p
    xs, ys = [], []
    chunk = max(256, int(_CHUNK_TOKENS // p["avg_nnz"]))
    for ci, start in enumerate(range(0, n, chunk)):
        m = min(chunk, n - start)
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED, stream, ci]))
        yi, yl = model.labels(rng, m, label_extra)
        xi, xf, xv = model.tokens(rng, yi, yl, token_factor)
        xs.append(sp.csr_matrix((xv, xf, xi), shape=(m, p["n_features"])))
        ys.append(sp.csr_matrix((np.ones(len(yl), np.float32), yl, yi), shape=(m, p["n_labels"])))
    if not xs:
        return (sp.csr_matrix((0, p["n_features"]), dtype=np.float32),
                sp.csr_matrix((0, p["n_labels"]), dtype=np.float32))
    X = xs[0] if len(xs) == 1 else sp.vstack(xs, format="csr")
    Y = ys[0] if len(ys) == 1 else sp.vstack(ys, format="csr")
    return X, Y


def _calibrate(model, seed, p):
    """Token and label-count scale factors so that the *distinct* means hit the preset's.

    Repeated draws (the same word twice, the same label twice) collapse, so the raw draw means
    must be larger than the targets; a few fixed-point steps on a pilot sample find by how much.
    """
    label_extra = p["avg_labels"] - 1.0
    token_factor = 1.0
    n = _PILOT     # fixed, so that overriding n_train / n_test never changes the other split
    rng_seed = [seed, 0x5EED, 99]
    for it in range(4):
        rng = np.random.default_rng(np.random.SeedSequence(rng_seed + [it]))
        yi, yl = model.labels(rng, n, label_extra)
        got_labels = len(yl) / n
        if label_extra > 0 and got_labels > 1.0:
            label_extra *= (p["avg_labels"] - 1.0) / (got_labels - 1.0)
            label_extra = min(label_extra, 4.0 * p["avg_labels"])
        xi, _, _ = model.tokens(rng, yi, yl, token_factor)
        got_nnz = xi[-1] / n
        token_factor = min(token_factor * p["avg_nnz"] / got_nnz, 20.0)
    return label_extra, token_factor


def _tfidf_normalise(X, idf):
    """Weight tf counts by ``(1 + ln tf) * idf`` and L2-normalise every row, in place."""
    X.data = (1.0 + np.log(X.data)) * idf[X.indices]
    sq = np.add.reduceat(X.data.astype(np.float64) ** 2, X.indptr[:-1]) if X.nnz else np.zeros(0)
    lengths = np.diff(X.indptr)
    norms = np.ones(X.shape[0])
    norms[lengths > 0] = np.sqrt(sq[lengths > 0])
    X.data = (X.data / np.repeat(norms, lengths)).astype(np.float32)
    return X


def _canonical(M):
    M.indices = M.indices.astype(np.int32, copy=False)
    M.indptr = M.indptr.astype(np.int64 if M.nnz > np.iinfo(np.int32).max else np.int32, copy=False)
    M.data = M.data.astype(np.float32, copy=False)
    M.has_sorted_indices = True
    return M


def generate(preset="tiny", scale=1.0, seed=0, **overrides):
    """Generate a synthetic XC data set.

    Parameters
    ----------
    preset : str or dict
        A name in :data:`PRESETS` or a dict of parameters (missing ones take the defaults).
    scale : float
        Multiplies ``n_features``, ``n_labels``, ``n_train`` and ``n_test`` (never the per-point
        means ``avg_nnz`` / ``avg_labels``).
    seed : int
        The output is a deterministic function of (preset parameters, seed).
    **overrides
        Any parameter of the preset, applied after ``scale`` (e.g. ``n_train=50_000`` keeps all
        labels of the preset but fewer points).

    Returns
    -------
    X_train, Y_train, X_test, Y_test : scipy.sparse.csr_matrix
        Features: float32 tf-idf values, each row L2-normalised, int32 sorted indices. Labels:
        float32 ones, int32 sorted indices; every point has at least one label.
    """
    p = preset_params(preset, scale, **overrides)
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    model = _Model(p, seed)
    label_extra, token_factor = _calibrate(model, seed, p)
    X_tr, Y_tr = _split(model, seed, 1, p["n_train"], label_extra, token_factor)
    X_te, Y_te = _split(model, seed, 2, p["n_test"], label_extra, token_factor)
    del model
    # smoothed idf of the training split (as scikit-learn's TfidfTransformer), used for both
    df = np.bincount(X_tr.indices, minlength=p["n_features"])
    idf = (np.log((1.0 + p["n_train"]) / (1.0 + df)) + 1.0).astype(np.float32)
    X_tr = _tfidf_normalise(X_tr, idf)
    X_te = _tfidf_normalise(X_te, idf)
    return tuple(_canonical(M) for M in (X_tr, Y_tr, X_te, Y_te))


def write_dataset(out_dir, X_train, Y_train, X_test, Y_test):
    """Write ``train.txt`` and ``test.txt`` (XC repository format) into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, X, Y in (("train.txt", X_train, Y_train), ("test.txt", X_test, Y_test)):
        path = os.path.join(out_dir, name)
        write_xc(path, X, Y)
        paths.append(path)
    return tuple(paths)
