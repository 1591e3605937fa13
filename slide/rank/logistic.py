"""The re-ranker's logistic regression: over standardised features and their pairwise products
(``expand``), fitted by Newton steps whose gradient and Hessian are summed row by row in one
parallel pass (``newton_logistic``), so its memory does not grow with the number of
candidates."""
import numba
import numpy as np
from numba import prange

from slide.kernels.jit import njit
from slide.kernels.threads import on_row_slices


def n_terms(n_features):
    """The logistic regression's weights over n features: theirs and their pairs'."""
    return n_features + n_features * (n_features + 1) // 2


def _n_chunks(n_rows):
    """Tasks for a parallel pass over n_rows rows: four per thread, at least one."""
    return max(1, min(n_rows, 4 * numba.get_num_threads()))


def expand(F):
    """The terms of standardised features F [n, d]: the features, then the product of every
    pair (i <= j, squares included) in row-major order: [n, n_terms(d)]."""
    F = np.ascontiguousarray(F, np.float64)
    out = np.empty((F.shape[0], n_terms(F.shape[1])), np.float64)
    if F.shape[0]:
        _expand_into(F, out, _n_chunks(F.shape[0]))
    return out


@njit(cache=True, nogil=True)
def _expand_row(f, out):
    """out[:n_terms(d)] = the terms of one row f [d]: f, then f[i] * f[j] for i <= j."""
    d = f.shape[0]
    for i in range(d):
        out[i] = f[i]
    t = d
    for i in range(d):
        for j in range(i, d):
            out[t] = f[i] * f[j]
            t += 1


@njit(cache=True, parallel=True)
def _expand_into(F, out, n_chunks):
    """out[:, :n_terms(d)] = expand(F), row by row (numpy's pair products through two fancy-
    indexed [n, pairs] copies were most of the re-ranker's Newton passes)."""
    n = F.shape[0]
    for c in prange(n_chunks):
        for r in range((c * n) // n_chunks, ((c + 1) * n) // n_chunks):
            _expand_row(F[r], out[r])


@njit(cache=True, parallel=True)
def _expanded_scores(F, mean, scale, coef, intercept, n_chunks, out):
    """out[r] = expand((F[r] - mean) / scale) @ coef + intercept, the terms formed one at a
    time (no [n, n_terms] matrix); a chunk of rows per task."""
    n, d = F.shape
    for c in prange(n_chunks):
        z = np.empty(d)
        for r in range((c * n) // n_chunks, ((c + 1) * n) // n_chunks):
            s = 0.0
            for i in range(d):
                z[i] = (F[r, i] - mean[i]) / scale[i]
                s += coef[i] * z[i]
            t = d
            for i in range(d):
                for j in range(i, d):
                    s += coef[t] * (z[i] * z[j])
                    t += 1
            out[r] = s + intercept


def expanded_scores(F, mean, scale, coef, intercept):
    """The decision values ``expand((F - mean) / scale) @ coef + intercept`` of the rows of F
    [n, d] (float64 [n]) in one parallel pass: materialising the expanded terms (n x 77
    float64 for 11 features) cost 7 of the 19 s of predicting debcontents' test rows."""
    F = np.ascontiguousarray(F, np.float64)
    out = np.empty(F.shape[0], np.float64)
    if F.shape[0]:
        _expanded_scores(F, np.ascontiguousarray(mean, np.float64),
                         np.ascontiguousarray(scale, np.float64),
                         np.ascontiguousarray(coef, np.float64), float(intercept),
                         _n_chunks(F.shape[0]), out)
    return out


_PASS_BLOCK = 512      # rows whose terms a task expands at once for its Hessian product


@njit(cache=True, nogil=True, error_model="numpy")
def _pass_rows(Z, truth, w, lo, hi, grad, hess):
    """The log-loss of the rows lo..hi-1 of Z at weights w over the ``expand`` terms of a row
    and a 1 last; their gradient and Hessian added into ``grad`` and ``hess``. The rows are
    expanded ``_PASS_BLOCK`` at a time into a buffer whose Hessian is added as one product
    (a row at a time, the accumulator's 88 kB went through the cache for every row)."""
    m = w.shape[0]
    E = np.empty((_PASS_BLOCK, m))
    S = np.empty((_PASS_BLOCK, m))
    q = np.empty(_PASS_BLOCK)
    total = 0.0
    for b0 in range(lo, hi, _PASS_BLOCK):
        nb = min(_PASS_BLOCK, hi - b0)
        for b in range(nb):
            r = b0 + b
            _expand_row(Z[r], E[b])
            E[b, m - 1] = 1.0
            z = 0.0
            for i in range(m):
                z += E[b, i] * w[i]
            # log(1 + exp(-z)) for the true, log(1 + exp(z)) for the others, without overflow
            u = -z if truth[r] else z
            total += max(u, 0.0) + np.log1p(np.exp(-abs(u)))
            p = 0.5 * (1.0 + np.tanh(0.5 * z))      # the sigmoid, without overflow
            q[b] = p - truth[r]
            s = p * (1.0 - p)
            for i in range(m):
                S[b, i] = s * E[b, i]
        grad += np.dot(q[:nb], E[:nb])
        hess += np.dot(S[:nb].T, E[:nb])
    return total


def _logistic_pass(Z, truth, w, C):
    """C x the log-loss of the rows Z (their ``expand`` terms, a column of ones last) at
    weights w, its gradient and Hessian: one slice of the rows per thread
    (``threads.on_row_slices``; a ``prange`` kernel took 7.8 s to compile, this 2 s). The
    numpy form, [16384, terms] expansions and their products block by block, took 0.41 s a
    pass over 400k candidates of 13 features on 2 cores; this 0.15 s."""
    d = w.shape[0]
    Z = np.ascontiguousarray(Z, np.float64)

    def run(lo, hi):
        grad, hess = np.zeros(d), np.zeros((d, d))
        return _pass_rows(Z, truth, w, lo, hi, grad, hess), grad, hess
    # each slice's (loss, gradient, Hessian), summed in slice order (the same bits every run)
    parts = on_row_slices(Z.shape[0], run, _PASS_BLOCK)
    H = sum(p[2] for p in parts)
    return C * sum(p[0] for p in parts), C * sum(p[1] for p in parts), C * 0.5 * (H + H.T)


def newton_logistic(Z, truth, C, max_iter=100, tol=1e-4):
    """Weights (the ``expand`` terms of the rows Z, then the intercept) minimising C x the
    log-loss + half the squared norm of the weights, intercept unpenalised: scikit-learn's
    LogisticRegression(C) objective. Newton steps with a halving line search until the mean
    gradient per row is below ``tol`` (where scikit-learn's newton-cholesky stops at its
    default tol: the same weights). The gradient and Hessian are summed row by row in each
    task, so memory stays a task's n_terms x n_terms floats at any candidate count
    (scikit-learn's solver held three [candidates, n_terms] float64 copies: 0.27 GB at
    Amazon-670K). One pass over the rows a step: the pass that tests a step also gives the
    derivatives there."""
    d = n_terms(Z.shape[1]) + 1
    penalty = np.ones(d)
    penalty[-1] = 0.0
    truth = truth.astype(np.float64)
    w = np.zeros(d)
    loss, grad, hess = _logistic_pass(Z, truth, w, C)
    f = loss
    for _ in range(max_iter):
        g = grad + penalty * w
        if abs(g).max() <= tol * C * Z.shape[0]:
            break
        h = hess.copy()
        h[np.diag_indices(d)] += penalty
        try:
            step = np.linalg.solve(h, g)
        except np.linalg.LinAlgError:       # pragma: no cover - the penalty keeps it definite
            step = np.linalg.lstsq(h, g, rcond=None)[0]
        t = 1.0
        while True:
            candidate = w - t * step
            loss, grad_c, hess_c = _logistic_pass(Z, truth, candidate, C)
            f_new = loss + 0.5 * (penalty * candidate) @ candidate
            if f_new <= f or t < 1e-6:
                break
            t *= 0.5
        w, f, grad, hess = candidate, f_new, grad_c, hess_c
    return w
