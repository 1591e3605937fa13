"""The batched engine's vectorised softmax row (``block._softmax_row``, with ``expsum``'s exp)
against the per-sample path's loss over active positions (``block._loss_by_positions``, i.e.
``sample.output_loss``): the same loss and deltas for every kind of correction, labels in and
outside the shared block, LSH-like ids in C, a random fill (weighted or dropped), no labels,
and an overflowed logit; the same for loss="softmax_each" (``losses.each_row``)."""
import math

import numpy as np
import pytest

from slide.kernels.arrays import Params
from slide.kernels.expsum import EXP_FLOOR, exp_shifted_inplace, max_and_finite, max_or_nan
from slide.kernels.losses import EACH, each_row
from slide.kernels.negatives import CORR_MIX, CORR_NONE, CORR_PLAIN
from slide.network import block as BK
from slide.network import extras as EX

N_OUT, N_H = 60, 8


def _case(seed, kind, n_fill, drop_fill, n_labels, n_lsh):
    """One sample's active set over a shared block S: arrays for both paths."""
    rng = np.random.default_rng(seed)
    W = rng.normal(0, 1, N_OUT * N_H).astype(np.float32)
    B = rng.normal(0, 0.5, N_OUT).astype(np.float32)
    h = np.abs(rng.normal(0, 1, N_H)).astype(np.float32)
    perm = rng.permutation(N_OUT)
    shared = np.sort(perm[:20]).astype(np.int32)
    # labels: some in S, some outside; C = labels then LSH-like ids (in S or not)
    labels = np.sort(rng.choice(perm[10:40], n_labels, replace=False)).astype(np.int32)
    lsh = rng.choice(np.setdiff1d(perm[5:45], labels), n_lsh, replace=False).astype(np.int32)
    C = np.concatenate([labels, lsh]).astype(np.int32)
    rest = np.array([j for j in shared if j not in C], np.int32)
    fill = rng.choice(np.setdiff1d(perm, np.concatenate([C, shared])), n_fill,
                      replace=False).astype(np.int32)
    out = np.concatenate([C, rest, fill]).astype(np.int32)
    col = np.array([np.searchsorted(shared, j) if j in shared else -1 for j in out], np.int32)
    n_c, n_s, n = C.shape[0], C.shape[0] + rest.shape[0], out.shape[0]
    corr = rng.normal(1.0, 0.5, N_OUT).astype(np.float32)
    corr_mix = rng.normal(0.5, 0.3, N_OUT).astype(np.float32)
    log_w1 = 0.7 if kind == CORR_NONE else 0.0
    log_w2 = -math.inf if drop_fill else 1.3
    arr = {CORR_NONE: corr[:0], CORR_PLAIN: corr, CORR_MIX: corr_mix}[kind]
    ranges = (n_c, n_s, n_s, n, log_w1, log_w2)
    ws = W.reshape(N_OUT, N_H)[shared]
    zs = (ws @ h).astype(np.float32)
    bS = B[shared]
    offs = np.stack([bS, bS + corr[shared], bS + corr_mix[shared]]).astype(np.float32)
    return dict(W=W, B=B, h=h, zs=zs, bS=bS, offs=offs, out=out, col=col, n=n, n_c=n_c,
                n_s=n_s, labels=labels, ranges=ranges, arr=arr, kind=kind)


def _both(c, scale=0.25, each=None):
    """(loss, S's deltas, the extras' deltas) by positions and by the row pass; ``each``:
    ``EACH`` for loss="softmax_each" (``losses.each_row``), None for the softmax."""
    n_x = int((c["col"] < 0).sum())
    z_ref, d_ref = c["zs"].copy(), np.zeros(64, np.float32)
    empty = np.zeros(0, np.float32)
    loss_ref = BK._loss_by_positions(Params(c["W"], c["B"], empty, empty), 0, 0, c["h"], z_ref,
                                     c["offs"][0], c["out"], c["col"], c["labels"], 0,
                                     np.float32(scale), (c["ranges"], c["arr"]),
                                     np.zeros(64, np.float32), d_ref, each)
    z_got, d_got = c["zs"].copy(), np.zeros(64, np.float32)
    extra = c["out"][c["col"] < 0]          # in position order, as block_forward lists them
    EX.extras_logits(c["W"], c["B"], 0, 0, c["h"], extra, c["n"] - c["n_s"], c["ranges"][5],
                     d_got)
    args = (z_got, c["offs"][c["kind"]], c["offs"][0], c["ranges"][4], c["col"], c["out"],
            c["n_c"], d_got[:n_x], c["labels"], np.float32(scale), np.zeros(64, np.float32))
    if each is None:
        loss_got = BK._softmax_row(*args, np.full(64, -7, np.int32))
    else:
        loss_got = each_row(*args)
    return (loss_ref, z_ref, d_ref[:n_x]), (loss_got, z_got, d_got[:n_x])


@pytest.mark.parametrize("each", [None, EACH], ids=["softmax", "softmax_each"])
@pytest.mark.parametrize("kind", [CORR_NONE, CORR_PLAIN, CORR_MIX])
@pytest.mark.parametrize("n_fill,drop_fill", [(0, False), (5, False), (5, True)])
@pytest.mark.parametrize("n_labels,n_lsh", [(1, 0), (4, 0), (3, 6)])
def test_row_softmax_equals_positions_softmax(kind, n_fill, drop_fill, n_labels, n_lsh, each):
    """Both losses' row passes (softmax_each's: the labels out of the exp at -inf) against the
    per-sample loss over the same positions."""
    for seed in range(4):
        c = _case(seed, kind, n_fill, drop_fill, n_labels, n_lsh)
        (l_ref, z_ref, d_ref), (l_got, z_got, d_got) = _both(c, each=each)
        assert np.isfinite(l_ref) and l_ref > 0
        np.testing.assert_allclose(l_got, l_ref, rtol=2e-6)
        np.testing.assert_allclose(z_got, z_ref, rtol=0, atol=2e-7)
        np.testing.assert_allclose(d_got, d_ref, rtol=0, atol=2e-7)
        # the deltas of either loss sum to zero (softmax: p and y both sum to 1; softmax_each:
        # each label's softmax moves as much up as down); a dropped fill: 0
        assert abs(z_got.sum() + d_got.sum()) < 1e-6
        if drop_fill and n_fill:
            assert (d_got[-n_fill:] == 0).all()


def test_no_labels_and_overflow():
    c = _case(0, CORR_PLAIN, 3, False, 2, 0)
    c["labels"] = c["labels"][:0]
    (l_ref, z_ref, _), (l_got, z_got, d_got) = _both(c)
    assert l_ref == l_got == 0.0 and not z_got.any() and not d_got.any()
    c = _case(1, CORR_PLAIN, 3, False, 2, 0)
    c["zs"][3] = np.inf
    (l_ref, _, _), (l_got, z_got, d_got) = _both(c)
    assert math.isnan(l_ref) and math.isnan(l_got) and not z_got.any() and not d_got.any()
    c["zs"][3] = np.nan
    assert math.isnan(_both(c)[1][0])


def test_exp_pass_matches_libm():
    rng = np.random.default_rng(0)
    z = np.concatenate([rng.normal(0, 8, 3000), [-500.0, EXP_FLOOR, -1e-9, 0.0]])
    z = z.astype(np.float32)
    m, bad = max_or_nan(z)
    assert not bad and m == z.max()
    want = np.exp(z.astype(np.float64) - m)
    got = z.copy()
    total = exp_shifted_inplace(got, m)
    ok = want > 1e-30
    assert np.abs(got[ok] / want[ok] - 1).max() < 1.2e-7      # float32 rounding
    assert got[~ok].max() < 1e-30
    assert abs(total / want.sum() - 1) < 1e-7
    assert abs(total / got.astype(np.float64).sum() - 1) < 1e-13   # the sum of what it wrote
    assert max_or_nan(np.array([1.0, np.nan, 2.0], np.float32))[1]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 100, 2051])
def test_lane_max_and_finite_check(n):
    """The softmax's eight-lane maximum equals numpy's, and any inf or NaN is reported,
    wherever it sits (lanes and tail)."""
    rng = np.random.default_rng(n)
    z = (rng.standard_normal(n) * 10).astype(np.float32)
    m, finite = max_and_finite(z)
    assert finite and m == (z.max() if n else -np.inf)
    for pos in sorted({0, n // 2, n - 1}) if n else []:
        for bad in (np.nan, np.inf, -np.inf):
            y = z.copy()
            y[pos] = bad
            assert not max_and_finite(y)[1]
