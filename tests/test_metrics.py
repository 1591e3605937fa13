"""Tests of slide.metrics: hand-computed cases, input validation, and agreement with a slow
per-point reference (and with napkinxc where it is installed) on random data."""
import math

import numpy as np
import pytest
import scipy.sparse as sp

from slide import metrics as M


def csr(rows, n_labels):
    """CSR 0/1 label matrix from a list of label lists."""
    indptr = np.cumsum([0] + [len(r) for r in rows])
    ind = np.array([lab for r in rows for lab in r], dtype=np.int32)
    return sp.csr_matrix((np.ones(len(ind), np.float32), ind, indptr), shape=(len(rows), n_labels))


# ------------------------------------------------------------------ slow reference (per point)

def ref_metrics(rows, topk, k, q=None):
    """Obviously-correct loop over points, straight from the textbook definitions."""
    n = len(rows)
    p = nd = r = 0.0
    ps_num = ps_den = psn_num = psn_den = 0.0
    for y, pred in zip(rows, topk):
        y = set(y)
        pred = [int(lab) for lab in pred[:k]]
        hits = [1.0 if (lab >= 0 and lab in y) else 0.0 for lab in pred]
        p += sum(hits) / k
        if y:
            dcg = sum(h / math.log2(j + 2) for j, h in enumerate(hits))
            idcg = sum(1 / math.log2(j + 2) for j in range(min(k, len(y))))
            nd += dcg / idcg
            r += sum(hits) / len(y)
        if q is not None:
            ideal = sorted((q[lab] for lab in y), reverse=True)[:k]
            ps_num += sum(q[lab] * h for lab, h in zip(pred, hits)) / k
            ps_den += sum(ideal) / k
            if y:
                idcg = sum(1 / math.log2(j + 2) for j in range(min(k, len(y))))
                psdcg = sum(q[lab] * h / math.log2(j + 2)
                            for j, (lab, h) in enumerate(zip(pred, hits)))
                psn_num += psdcg / idcg
                psn_den += sum(w / math.log2(j + 2) for j, w in enumerate(ideal)) / idcg
    out = {"P": p / n, "nDCG": nd / n, "R": r / n}
    if q is not None:
        out["PSP"] = ps_num / ps_den if ps_den else 0.0
        out["PSnDCG"] = psn_num / psn_den if psn_den else 0.0
    return out


def random_case(seed, n=300, n_labels=50, m=6):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        c = rng.integers(0, 8) if i % 17 else 0          # some points have no label at all
        rows.append(sorted(rng.choice(n_labels, size=c, replace=False).tolist()))
    # predictions: a mix of true labels (so there are hits) and random ones, unique per row
    topk = np.full((n, m), -1, dtype=np.int64)
    for i, y in enumerate(rows):
        cand = list(rng.permutation(n_labels))
        if y and rng.random() < 0.7:
            first = int(rng.choice(y))
            cand.remove(first)
            cand.insert(int(rng.integers(0, m)), first)
        width = m if i % 13 else int(rng.integers(0, m))   # some rows end in -1 (no prediction)
        topk[i, :width] = cand[:width]
    q = rng.uniform(1.0, 5.0, size=n_labels)
    return rows, topk, q


# ------------------------------------------------------------------ hand-computed cases

def test_hand_computed_precision_ndcg_recall():
    # point 0: y={1,2,3}, preds [1, 5, 3]   -> hits at ranks 1 and 3
    # point 1: y={4},     preds [0, 4, -1]  -> one true label (fewer than k), hit at rank 2
    # point 2: y={},      preds [1, 2, 3]   -> empty label set: scores 0 everywhere
    Y = csr([[1, 2, 3], [4], []], 6)
    T = np.array([[1, 5, 3], [0, 4, -1], [1, 2, 3]])
    assert M.precision_at_k(Y, T, 1) == pytest.approx((1 + 0 + 0) / 3)
    assert M.precision_at_k(Y, T, 3) == pytest.approx((2 / 3 + 1 / 3 + 0) / 3)
    d2, d3 = 1 / math.log2(3), 1 / math.log2(4)
    nd0 = (1 + d3) / (1 + d2 + d3)
    nd1 = d2 / 1.0                 # ideal DCG of a one-label point is 1 (min(k, |y|) = 1 term)
    assert M.ndcg_at_k(Y, T, 3) == pytest.approx((nd0 + nd1 + 0) / 3)
    assert M.ndcg_at_k(Y, T, 1) == pytest.approx((1 + 0 + 0) / 3)
    assert M.recall_at_k(Y, T, 3) == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert M.recall_at_k(Y, T, 1) == pytest.approx((1 / 3 + 0 + 0) / 3)


def test_hand_computed_propensity_scored():
    Y = csr([[1, 2, 3], [4], []], 6)
    T = np.array([[1, 5, 3], [0, 4, -1], [1, 2, 3]])
    q = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    # PSP@3: gains (2 + 4)/3 and 5/3; ideal: point 0 sorted q of {1,2,3} = 4,3,2 -> 9/3; point 1: 5/3
    assert M.psprecision_at_k(Y, T, 3, q) == pytest.approx((6 / 3 + 5 / 3) / (9 / 3 + 5 / 3))
    # PSP@1: gain 2 (point 0 hits label 1, q=2), ideal 4 + 5
    assert M.psprecision_at_k(Y, T, 1, q) == pytest.approx(2 / 9)
    d2, d3 = 1 / math.log2(3), 1 / math.log2(4)
    i0, i1 = 1 + d2 + d3, 1.0
    num = (2 + 4 * d3) / i0 + (5 * d2) / i1
    den = (4 + 3 * d2 + 2 * d3) / i0 + 5 / i1
    assert M.psndcg_at_k(Y, T, 3, q) == pytest.approx(num / den)


def test_perfect_and_empty_predictions():
    Y = csr([[0, 3], [2], [1, 4, 5]], 6)
    perfect = np.array([[3, 0, -1], [2, -1, -1], [5, 1, 4]])
    q = np.linspace(1, 3, 6)
    r = M.evaluate(Y, perfect, ks=(1, 2, 3), inv_propensity=q)
    assert r["P@1"] == 1.0 and r["nDCG@3"] == pytest.approx(1.0) and r["R@3"] == pytest.approx(1.0)
    assert r["P@3"] == pytest.approx((2 / 3 + 1 / 3 + 1) / 3)   # fewer true labels than k
    # PSP is normalised by the ideal ranking; predicting the labels in the best order is 1
    ideal = np.array([[3, 0, -1], [2, -1, -1], [5, 4, 1]])
    r2 = M.evaluate(Y, ideal, ks=(1, 2, 3), inv_propensity=q)
    assert r2["PSP@1"] == pytest.approx(1.0) and r2["PSnDCG@3"] == pytest.approx(1.0)
    assert r2["PSP@3"] == pytest.approx(1.0)
    none = np.full((3, 3), -1)
    r3 = M.evaluate(Y, none, ks=(1, 3), inv_propensity=q)
    assert all(v == 0.0 for v in r3.values())


def test_inverse_propensity_formula():
    Y = csr([[0], [0, 1], [0, 2], [0], []], 4)      # counts: 4, 1, 1, 0; N = 5
    A, B = 0.6, 2.6
    C = (math.log(5) - 1) * (B + 1) ** A
    expect = [1 + C * (c + B) ** -A for c in (4, 1, 1, 0)]
    np.testing.assert_allclose(M.inverse_propensity(Y, A=A, B=B), expect)
    q = M.inverse_propensity(Y)                      # defaults A=0.55, B=1.5
    assert q[3] > q[1] > q[0] >= 1.0                 # rarer labels weigh more


# ------------------------------------------------------------------ random agreement

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_per_point_reference(seed):
    rows, topk, q = random_case(seed)
    Y = csr(rows, 50)
    res = M.evaluate(Y, topk, ks=(1, 2, 3, 5), inv_propensity=q)
    for k in (1, 2, 3, 5):
        ref = ref_metrics(rows, topk, k, q)
        assert res[f"P@{k}"] == pytest.approx(ref["P"], abs=1e-12)
        assert res[f"nDCG@{k}"] == pytest.approx(ref["nDCG"], abs=1e-12)
        assert res[f"R@{k}"] == pytest.approx(ref["R"], abs=1e-12)
        assert res[f"PSP@{k}"] == pytest.approx(ref["PSP"], abs=1e-12)
        assert res[f"PSnDCG@{k}"] == pytest.approx(ref["PSnDCG"], abs=1e-12)
        # the single-metric functions agree with evaluate()
        assert M.precision_at_k(Y, topk, k) == pytest.approx(res[f"P@{k}"], abs=1e-12)
        assert M.ndcg_at_k(Y, topk, k) == pytest.approx(res[f"nDCG@{k}"], abs=1e-12)
        assert M.recall_at_k(Y, topk, k) == pytest.approx(res[f"R@{k}"], abs=1e-12)
        assert M.psprecision_at_k(Y, topk, k, q) == pytest.approx(res[f"PSP@{k}"], abs=1e-12)
        assert M.psndcg_at_k(Y, topk, k, q) == pytest.approx(res[f"PSnDCG@{k}"], abs=1e-12)
    assert 0.05 < res["P@1"] < 1.0                  # the random case is not degenerate


def test_accepts_dense_and_other_sparse_formats():
    rows, topk, q = random_case(5, n=60)
    Y = csr(rows, 50)
    a = M.evaluate(Y, topk, inv_propensity=q)
    assert M.evaluate(Y.toarray(), topk, inv_propensity=q) == a
    assert M.evaluate(Y.tocoo(), topk, inv_propensity=q) == a
    assert M.evaluate(Y, topk.astype(np.int32), inv_propensity=q) == a
    assert set(a) == {f"{m}@{k}" for m in ("P", "nDCG", "R", "PSP", "PSnDCG") for k in (1, 3, 5)}
    assert set(M.evaluate(Y, topk)) == {f"{m}@{k}" for m in ("P", "nDCG", "R") for k in (1, 3, 5)}


def test_agrees_with_napkinxc():
    nx = pytest.importorskip("napkinxc.metrics")
    rows, topk, q = random_case(7)
    Y = csr(rows, 50)
    preds = [[int(lab) for lab in r if lab >= 0] for r in topk]
    k = 5
    res = M.evaluate(Y, topk, ks=range(1, k + 1), inv_propensity=q)
    p = nx.precision_at_k(Y, preds, k=k)
    r = nx.recall_at_k(Y, preds, k=k)
    n = nx.ndcg_at_k(Y, preds, k=k)
    psp = nx.psprecision_at_k(Y, preds, q, k=k)
    psn = nx.psndcg_at_k(Y, preds, q, k=k)
    for i in range(k):
        assert res[f"P@{i + 1}"] == pytest.approx(p[i], abs=1e-12)
        assert res[f"R@{i + 1}"] == pytest.approx(r[i], abs=1e-12)
        assert res[f"nDCG@{i + 1}"] == pytest.approx(n[i], abs=1e-12)
        assert res[f"PSP@{i + 1}"] == pytest.approx(psp[i], abs=1e-12)
        assert res[f"PSnDCG@{i + 1}"] == pytest.approx(psn[i], abs=1e-12)
    np.testing.assert_allclose(M.inverse_propensity(Y, 0.6, 2.6),
                               nx.Jain_et_al_inverse_propensity(Y, 0.6, 2.6), rtol=1e-6)


# ------------------------------------------------------------------ validation

def test_validation_errors():
    Y = csr([[0, 1], [2]], 4)
    T = np.array([[0, 1, 2], [2, 3, -1]])
    with pytest.raises(ValueError, match="rows"):
        M.precision_at_k(Y, T[:1], 1)                        # shape mismatch
    with pytest.raises(ValueError, match="larger than topk"):
        M.precision_at_k(Y, T, 4)                            # k > columns
    with pytest.raises(ValueError, match="outside"):
        M.precision_at_k(Y, np.array([[0, 4, 1], [2, 3, -1]]), 3)   # id >= n_labels
    with pytest.raises(ValueError, match="outside"):
        M.ndcg_at_k(Y, np.array([[0, -2, 1], [2, 3, -1]]), 3)       # negative id other than -1
    with pytest.raises(ValueError, match="repeats"):
        M.precision_at_k(Y, np.array([[0, 0, 1], [2, 3, -1]]), 3)
    with pytest.raises(ValueError, match="positive integer"):
        M.precision_at_k(Y, T, 0)
    with pytest.raises(ValueError, match="2-D"):
        M.recall_at_k(Y, np.array([0, 1]), 1)
    with pytest.raises(ValueError, match="integer"):
        M.precision_at_k(Y, np.array([[0.5, 1], [2, 3]]), 1)
    with pytest.raises(ValueError, match="inv_propensity"):
        M.psprecision_at_k(Y, T, 1, np.ones(3))               # wrong length
    with pytest.raises(ValueError, match="inv_propensity"):
        M.evaluate(Y, T, ks=(1, 3), inv_propensity=np.array([1, np.nan, 1, 1]))
    with pytest.raises(ValueError, match="larger than topk"):
        M.evaluate(Y, T, ks=(1, 5))
    with pytest.raises(ValueError, match="B"):
        M.inverse_propensity(csr([[0], [1], [2]], 4), B=-1)
    with pytest.raises(ValueError, match="at least 3 rows"):
        M.inverse_propensity(Y)


def test_duplicates_of_minus_one_are_allowed():
    Y = csr([[0], [1]], 3)
    T = np.array([[0, -1, -1], [-1, -1, -1]])
    assert M.precision_at_k(Y, T, 3) == pytest.approx(1 / 6)


def test_large_vectorised_input_is_fast_and_right():
    # 200k points in one call: a Python loop over points would take seconds; this takes ~0.1 s
    import time
    rng = np.random.default_rng(0)
    n, L = 200_000, 100_000
    Y = sp.csr_matrix((np.ones(n * 4), rng.integers(0, L, size=n * 4), np.arange(0, 4 * n + 1, 4)),
                      shape=(n, L))
    first = Y.indices[Y.indptr[:-1]]                               # a true label of every row
    step = rng.integers(1, L // 5, size=n)                         # distinct ids within a row
    T = (first[:, None] + np.arange(5)[None, :] * step[:, None]) % L
    r = M.evaluate(Y, T, inv_propensity=M.inverse_propensity(Y))
    t0 = time.perf_counter()
    p5 = M.precision_at_k(Y, T, 5)
    vectorised_per_row = (time.perf_counter() - t0) / n
    assert p5 == r["P@5"]
    assert r["P@1"] == 1.0                     # column 0 is always a true label
    # P@5 against a plain per-row count (timed too: the vectorised path must be far cheaper
    # per row than the loop it replaces: measured 4-8x; a ratio, so a slow machine passes too)
    t0 = time.perf_counter()
    hits = 0
    for i in range(n // 20):
        true = set(Y.indices[Y.indptr[i]:Y.indptr[i + 1]].tolist())
        hits += sum(int(t) in true for t in T[i])
    loop_per_row = (time.perf_counter() - t0) / (n // 20)
    sub = M.evaluate(Y[: n // 20], T[: n // 20], ks=(5,))
    assert sub["P@5"] == pytest.approx(hits / (5 * (n // 20)), abs=1e-12)
    assert 0.2 < r["P@5"] < 0.21              # 1 sure hit of 5, plus rare chance hits
    assert vectorised_per_row * 2 < loop_per_row, (vectorised_per_row, loop_per_row)
