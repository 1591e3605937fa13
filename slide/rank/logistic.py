"""The re-ranker's logistic regression: over standardised features and their pairwise products
(``expand``), fitted by Newton steps whose gradient and Hessian are summed block by block
(``newton_logistic``), so its memory does not grow with the number of candidates."""
import numba
import numpy as np
from numba import njit, prange


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


@njit(cache=True, parallel=True)
def _expand_into(F, out, n_chunks):
    """out[:, :n_terms(d)] = expand(F), row by row (numpy's pair products through two fancy-
    indexed [n, pairs] copies were most of the re-ranker's Newton passes)."""
    n, d = F.shape
    for c in prange(n_chunks):
        for r in range((c * n) // n_chunks, ((c + 1) * n) // n_chunks):
            for i in range(d):
                out[r, i] = F[r, i]
            t = d
            for i in range(d):
                for j in range(i, d):
                    out[r, t] = F[r, i] * F[r, j]
                    t += 1


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


def _logistic_pass(Z, truth, w, C, block, with_derivatives):
    """C x the log-loss of the rows Z (expanded block by block, a column of ones last) at
    weights w, and with ``with_derivatives`` its gradient and Hessian."""
    d = w.shape[0]
    loss, grad, hess = 0.0, np.zeros(d), np.zeros((d, d))
    for a in range(0, Z.shape[0], block):
        E = np.empty((min(block, Z.shape[0] - a), d))
        _expand_into(Z[a:a + block], E, _n_chunks(E.shape[0]))
        E[:, -1] = 1.0
        z = E @ w
        y = truth[a:a + block]
        # log(1 + exp(-z)) for the true, log(1 + exp(z)) for the others, without overflow
        loss += np.logaddexp(0.0, np.where(y, -z, z)).sum()
        if with_derivatives:
            p = 0.5 * (1.0 + np.tanh(0.5 * z))        # the sigmoid, without overflow
            grad += E.T @ (p - y)
            hess += (E * (p * (1.0 - p))[:, None]).T @ E
    return C * loss, C * grad, C * hess


def newton_logistic(Z, truth, C, block=16384, max_iter=100, tol=1e-4):
    """Weights (the ``expand`` terms of the rows Z, then the intercept) minimising C x the
    log-loss + half the squared norm of the weights, intercept unpenalised: scikit-learn's
    LogisticRegression(C) objective. Newton steps with a halving line search until the mean
    gradient per row is below ``tol`` (where scikit-learn's newton-cholesky stops at its
    default tol: the same weights). The gradient and Hessian are summed block by block, so
    memory stays ``block`` x n_terms floats at any candidate count (scikit-learn's solver held
    three [candidates, n_terms] float64 copies: 0.27 GB at Amazon-670K). One pass over the
    rows a step: the pass that tests a step also gives the derivatives there."""
    d = n_terms(Z.shape[1]) + 1
    penalty = np.ones(d)
    penalty[-1] = 0.0
    truth = truth.astype(np.float64)
    w = np.zeros(d)
    loss, grad, hess = _logistic_pass(Z, truth, w, C, block, True)
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
            loss, grad_c, hess_c = _logistic_pass(Z, truth, candidate, C, block, True)
            f_new = loss + 0.5 * (penalty * candidate) @ candidate
            if f_new <= f or t < 1e-6:
                break
            t *= 0.5
        w, f, grad, hess = candidate, f_new, grad_c, hess_c
    return w
