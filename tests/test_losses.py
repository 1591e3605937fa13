"""The ``softmax_each`` loss's kernels at their edges: both forms (per sample over an active
set, batched over a row of S and its extras) agree, stay finite where logits span hundreds of
nats, and give nothing to learn where there is no non-label."""
import os
import subprocess
import sys

import numpy as np
import pytest

from slide.kernels.losses import each_loss, each_row

NO_CORR = ((0, 0, 0, 0, 0.0, 0.0), np.zeros(0, np.float32))


def _per_sample(z, labels):
    """each_loss over the dense row z (every position active, ids = positions)."""
    z = np.asarray(z, np.float32).copy()
    d = np.zeros_like(z)
    ranges, corr = NO_CORR
    ids = np.arange(len(z), dtype=np.int32)
    loss = each_loss(z, len(z), True, ids, np.asarray(labels, np.int32), 1.0, d, ranges, corr)
    return loss, d


def _reference(z, labels):
    """float64, one softmax vector per label over it and the non-labels."""
    z = np.asarray(z, np.float64)
    neg = np.ones(len(z), bool)
    neg[labels] = False
    loss, d = 0.0, np.zeros_like(z)
    for j in labels:
        on = neg.copy()
        on[j] = True
        q = np.where(on, np.exp(z - z[on].max()), 0.0)
        q /= q.sum()
        loss -= np.log(q[j])
        q[j] -= 1.0
        d += q
    return loss / len(labels), d / len(labels)


def test_each_loss_matches_reference_and_its_deltas_sum_to_zero():
    rng = np.random.default_rng(0)
    for _ in range(5):
        z = rng.normal(0, 3, 40)
        labels = np.sort(rng.choice(40, 6, replace=False))
        loss, d = _per_sample(z, labels)
        ref_loss, ref_d = _reference(z.astype(np.float32), labels)
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        np.testing.assert_allclose(d, ref_d, rtol=1e-4, atol=1e-7)
        # each label's softmax moves as much mass up as it moves down
        assert abs(float(d.astype(np.float64).sum())) < 1e-6
        assert (d[labels] < 0).all()


@pytest.mark.parametrize("gap", [1000.0, -1000.0])
def test_each_loss_is_finite_when_labels_and_non_labels_are_far_apart(gap):
    z = np.zeros(20, np.float32)
    labels = np.array([3, 11], np.int32)
    z[labels] = gap
    loss, d = _per_sample(z, labels)
    assert np.isfinite(loss) and np.isfinite(d).all()
    if gap > 0:                       # labels far above: nothing left to learn
        assert loss < 1e-30 and np.abs(d).max() < 1e-30
    else:                             # far below: loss ~ the gap, full push
        assert loss == pytest.approx(1000.0 + np.log(18), rel=1e-6)
        np.testing.assert_allclose(d[labels], -0.5, rtol=1e-6)
        np.testing.assert_allclose(d[np.setdiff1d(np.arange(20), labels)], 1 / 18, rtol=1e-5)


def test_each_loss_without_non_labels_learns_nothing():
    loss, d = _per_sample([1.0, 2.0, 3.0], [0, 1, 2])
    assert loss == 0.0 and not d.any()
    z = np.array([1.0, np.inf, 0.0], np.float32)
    loss, d = _per_sample(z, [0])
    assert np.isnan(loss) and not d.any()


def test_each_row_equals_each_loss():
    """The batched form over S's columns (labels among them and among the extras), with
    offsets on S's columns, against the per-sample form over the same corrected logits."""
    rng = np.random.default_rng(1)
    ns, n_x = 30, 3
    zs0 = rng.normal(0, 2, ns).astype(np.float32)
    off = rng.normal(0, 1, ns).astype(np.float32)
    bS = rng.normal(0, 1, ns).astype(np.float32)
    shared = np.arange(100, 100 + ns, dtype=np.int32)
    # C: label 104 (S column 4), label 7 and id 9 (extras, exact); then S minus C
    out = np.concatenate([[104, 7, 9], np.delete(shared, 4)]).astype(np.int32)
    col = np.concatenate([[4, -1, -1], np.delete(np.arange(ns), 4)]).astype(np.int64)
    dx0 = rng.normal(0, 2, n_x).astype(np.float32)[:2]           # the extras 7 and 9
    labels = np.array([7, 104], np.int32)
    log_w1 = 0.7
    zs, dx = zs0.copy(), dx0.copy()
    saved = np.zeros(8, np.float32)
    loss = each_row(zs, off, bS, log_w1, col, out, 3, dx, labels, 0.5, saved)
    # the same logits as an active set: C exact (S column + bias, or the extra's), S corrected
    flat = {104: zs0[4] + bS[4], 7: dx0[0], 9: dx0[1]}
    for c in np.delete(np.arange(ns), 4):
        flat[int(shared[c])] = zs0[c] + off[c] + np.float32(log_w1)
    ids = np.array(sorted(flat), np.int32)
    z = np.array([flat[int(j)] for j in ids], np.float32)
    d = np.zeros_like(z)
    ranges, corr = NO_CORR
    ref = each_loss(z, len(z), False, ids, labels, 0.5, d, ranges, corr)
    assert loss == pytest.approx(ref, rel=1e-6)
    pos = {int(j): k for k, j in enumerate(ids)}
    got = {int(shared[c]): zs[c] for c in range(ns)}
    got.update({7: dx[0], 9: dx[1]})
    for j, k in pos.items():
        assert got[j] == pytest.approx(d[k], rel=1e-5, abs=1e-9)


def test_a_softmax_network_never_compiles_these_kernels(tmp_path):
    """The loss is a type in the kernels (``losses.EACH`` or None), so Numba prunes the call:
    with an empty cache, the dense loss kernel of a softmax network compiles no ``each_loss``,
    that of a softmax_each network does. (A whole fit in a fresh process, measured once with an
    empty cache: softmax compiled neither ``each_loss`` nor ``each_row``, softmax_each both.)"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import numpy as np, scipy.sparse as sp\n"
        "from slide.kernels import losses\n"
        "from slide.kernels.arrays import csr\n"
        "from slide.network.dense import dense_loss_kernel\n"
        "Y = csr(sp.csr_matrix(np.eye(4, 6, dtype=np.float32)))\n"
        "rows = np.arange(4, dtype=np.int64)\n"
        "for each in (None, losses.EACH):\n"
        "    Z = np.ones((4, 6), np.float32)\n"
        "    dense_loss_kernel(Z, Y, rows, 0, 0.25, np.zeros(4), each)\n"
        "    print(len(losses.each_loss.signatures))\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path),
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=root, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "1"]
