"""One-sample loss and gradients of the engine against a dense NumPy reference and finite
differences, for dense layers and for sparse layers (LSH / random active sets)."""
import numpy as np
import pytest

from slide.kernels.layers import Layout, init_params
from slide.network import Network


def _reference(layout, W, B, x_idx, x_val, labels, loss, active=None, offset=None):
    """Dense float64 forward/backward. ``active[l]``: ids of layer l's computed neurons (None =
    all); ``offset``: per-output-neuron logit offsets (the sampled softmax correction).
    Returns (loss, gW flat, gB flat)."""
    W = W.astype(np.float64)
    B = B.astype(np.float64)
    n_layers = layout.n_layers
    Ws = [layout.weight_view(W, l) for l in range(n_layers)]
    Bs = [layout.bias_view(B, l) for l in range(n_layers)]
    x = np.zeros(layout.sizes[0])
    x[x_idx] = x_val
    masks = []
    for l in range(n_layers):
        m = np.zeros(layout.sizes[l + 1], bool)
        m[active[l] if active is not None and active[l] is not None else slice(None)] = True
        masks.append(m)
    hs = [x]
    zs = []
    for l in range(n_layers):
        Wl = Ws[l].T if l == 0 else Ws[l]          # [n_out, n_in]
        z = Wl @ hs[-1] + Bs[l]
        z = np.where(masks[l], z, 0.0)
        zs.append(z)
        if l < n_layers - 1:
            hs.append(np.maximum(z, 0.0))
    z = zs[-1] if offset is None else zs[-1] + offset
    m = masks[-1]
    y = np.zeros_like(z)
    y[labels] = 1.0
    if loss == "softmax":
        zm = np.where(m, z, -np.inf)
        p = np.exp(zm - zm.max())
        p /= p.sum()
        t = y / y.sum()
        on = m & (t > 0)        # only the targets contribute (a left-out neuron has p = 0)
        L = -(t[on] * np.log(p[on])).sum()
        d = np.where(m, p - t, 0.0)
    elif loss == "softmax_each":
        # one softmax per label over it and the active non-labels, summed as vectors
        L = 0.0
        d = np.zeros_like(z)
        neg = m & (y == 0)
        for j in np.flatnonzero(m & (y > 0)):
            on = neg.copy()
            on[j] = True
            zj = np.where(on, z, -np.inf)
            q = np.exp(zj - zj.max())
            q /= q.sum()
            L -= np.log(q[j]) / len(labels)
            q[j] -= 1.0
            d += q / len(labels)
    else:
        p = 1 / (1 + np.exp(-z))
        L = (np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z))))[m].sum()
        d = np.where(m, p - y, 0.0)
    gW = [None] * n_layers
    gB = [None] * n_layers
    for l in range(n_layers - 1, -1, -1):
        g = np.outer(d, hs[l])                      # [n_out, n_in]
        gW[l] = g.T if l == 0 else g
        gB[l] = d
        if l > 0:
            Wl = Ws[l]
            d = (Wl.T @ d) * (zs[l - 1] > 0) * masks[l - 1]
    return L, np.concatenate([g.ravel() for g in gW]), np.concatenate(gB)


def _sample(rng, n_features, n_labels, nnz=6, ny=2):
    idx = np.sort(rng.choice(n_features, nnz, replace=False)).astype(np.int32)
    val = rng.uniform(0.2, 1.0, nnz).astype(np.float32)
    lab = np.sort(rng.choice(n_labels, ny, replace=False)).astype(np.int32)
    return idx, val, lab


def _net(sizes, sparse=(), min_active=0, loss="softmax", lsh=None, seed=3, correct=False,
         shared=0):
    n_layers = len(sizes) - 1
    flags = [l in sparse for l in range(n_layers)]
    mins = [min_active if f else 0 for f in flags]
    net = Network(sizes, flags, mins, loss=loss, seed=seed, lsh=lsh, correct=correct,
                  shared_negatives=shared)
    # larger weights than the init, so the ReLUs and the loss are far from trivial
    net.W *= 8.0
    net.B[:] = np.random.default_rng(seed).normal(0, 0.3, net.B.shape)
    net.build_indices()
    return net


@pytest.mark.parametrize("loss", ["softmax", "sigmoid", "softmax_each"])
@pytest.mark.parametrize("hidden", [(7,), (9, 5)])
def test_dense_matches_numpy_reference(loss, hidden):
    sizes = (40,) + hidden + (13,)
    net = _net(sizes, loss=loss)
    rng = np.random.default_rng(0)
    for _ in range(3):
        idx, val, lab = _sample(rng, 40, 13)
        L, gW, gB = net.sample_loss_and_grads(idx, val, lab)
        Lr, gWr, gBr = _reference(net.layout, net.W, net.B, idx, val, lab, loss)
        assert L == pytest.approx(Lr, rel=1e-5, abs=1e-6)
        np.testing.assert_allclose(gW, gWr, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(gB, gBr, rtol=1e-4, atol=1e-6)
        # the reference is not trivially zero: the check can fail
        assert np.abs(gWr).max() > 1e-3


@pytest.mark.parametrize("sparse", [(1,), (0, 1), (1, 2)])
def test_sparse_layers_all_active_match_dense(sparse):
    """With min_active >= layer width every neuron is active: the sparse code path must give
    exactly the dense network's loss and gradients."""
    sizes = (30, 8, 6, 11) if 2 in sparse else (30, 8, 11)
    n_layers = len(sizes) - 1
    sparse = tuple(l for l in sparse if l < n_layers)
    net = _net(sizes, sparse=sparse, min_active=max(sizes[1:]))
    rng = np.random.default_rng(1)
    idx, val, lab = _sample(rng, 30, 11)
    L, gW, gB, act = net.sample_loss_and_grads(idx, val, lab, return_active=True)
    for l in sparse:
        assert sorted(act[l].tolist()) == list(range(sizes[l + 1]))
    Lr, gWr, gBr = _reference(net.layout, net.W, net.B, idx, val, lab, "softmax")
    assert L == pytest.approx(Lr, rel=1e-5)
    np.testing.assert_allclose(gW, gWr, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gB, gBr, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("loss", ["softmax", "softmax_each"])
@pytest.mark.parametrize("sampler", ["vanilla", "topk", "random"])
def test_sampled_softmax_matches_reference_on_its_active_set(sampler, loss):
    """LSH-selected (or random) active sets: loss/gradients equal the dense reference restricted
    to the active neurons, labels are always active, nothing outside gets a gradient."""
    sizes = (50, 16, 300)
    lsh = dict(sampler=sampler, family="dwta", K=2, L=4, range_pow=6, bucket_size=8,
               policy="fifo", budget=20, threshold=1)
    net = _net(sizes, sparse=(1,), min_active=25, lsh=lsh, loss=loss)
    rng = np.random.default_rng(2)
    for serial in (1, 2):
        idx, val, lab = _sample(rng, 50, 300, ny=3)
        L, gW, gB, act = net.sample_loss_and_grads(idx, val, lab, serial=serial,
                                                   return_active=True)
        a = act[1]
        assert set(lab.tolist()) <= set(a.tolist())
        assert len(set(a.tolist())) == len(a) and 25 <= len(a) < 300
        Lr, gWr, gBr = _reference(net.layout, net.W, net.B, idx, val, lab, loss,
                                  active=[None, a])
        assert L == pytest.approx(Lr, rel=1e-5)
        np.testing.assert_allclose(gW, gWr, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(gB, gBr, rtol=1e-4, atol=1e-6)
        inactive = np.setdiff1d(np.arange(300), a)
        G1 = net.layout.weight_view(gW, 1)
        assert not G1[inactive].any()


@pytest.mark.parametrize("loss", ["softmax", "softmax_each"])
@pytest.mark.parametrize("shared", [0, 40])
def test_sampling_correction_offsets_random_negatives(shared, loss):
    """With the correction, every uniform random negative's logit gets + log(U / |R|): U =
    neurons not computed exactly (here: all but the labels), |R| = random negatives."""
    sizes = (50, 16, 300)
    net = _net(sizes, sparse=(1,), min_active=60, lsh=dict(sampler="random"), correct=True,
               shared=shared, loss=loss)
    rng = np.random.default_rng(7)
    idx, val, lab = _sample(rng, 50, 300, ny=3)
    L, gW, gB, act = net.sample_loss_and_grads(idx, val, lab, return_active=True)
    a = act[1]
    assert len(a) >= 60 and list(a[:3]) == list(lab)
    offset = np.zeros(300)
    offset[a[3:]] = np.log((300 - 3) / (len(a) - 3))
    Lr, gWr, gBr = _reference(net.layout, net.W, net.B, idx, val, lab, loss,
                              active=[None, a], offset=offset)
    assert L == pytest.approx(Lr, rel=1e-5)
    np.testing.assert_allclose(gW, gWr, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gB, gBr, rtol=1e-4, atol=1e-6)
    L0 = _reference(net.layout, net.W, net.B, idx, val, lab, loss, active=[None, a])[0]
    assert abs(L - L0) > 0.1          # the correction does change the loss


def test_gradients_agree_with_finite_differences():
    sizes = (25, 6, 5, 9)
    net = _net(sizes)
    rng = np.random.default_rng(4)
    idx, val, lab = _sample(rng, 25, 9)
    L, gW, gB = net.sample_loss_and_grads(idx, val, lab)
    gW, gB = gW.copy(), gB.copy()
    W0 = net.W.copy()
    eps = 1e-2
    # every weight that can have a gradient: layer-0 rows of x's features, all later weights
    lay = net.layout
    cand = [int(lay.w_off[0]) + f * sizes[1] + i for f in idx for i in range(sizes[1])]
    cand += list(range(int(lay.w_off[1]), lay.n_weights))
    checked = 0
    for e in rng.choice(cand, 40, replace=False):
        net.W[e] = W0[e] + eps
        lp = net.sample_loss_and_grads(idx, val, lab)[0]
        net.W[e] = W0[e] - eps
        lm = net.sample_loss_and_grads(idx, val, lab)[0]
        net.W[e] = W0[e]
        fd = (lp - lm) / (2 * eps)
        assert fd == pytest.approx(gW[e], rel=3e-2, abs=2e-3), f"weight {e}"
        checked += abs(fd) > 1e-2
    assert checked >= 5            # enough nonzero gradients were compared
    for e in range(lay.n_biases):
        B0 = net.B[e]
        net.B[e] = B0 + eps
        lp = net.sample_loss_and_grads(idx, val, lab)[0]
        net.B[e] = B0 - eps
        lm = net.sample_loss_and_grads(idx, val, lab)[0]
        net.B[e] = B0
        assert (lp - lm) / (2 * eps) == pytest.approx(gB[e], rel=3e-2, abs=2e-3)


def test_layout_offsets_and_views():
    lay = Layout((10, 4, 3, 7))
    assert lay.n_weights == 10 * 4 + 4 * 3 + 3 * 7
    assert lay.n_biases == 4 + 3 + 7
    assert list(lay.w_off) == [0, 40, 52, 73] and list(lay.b_off) == [0, 4, 7, 14]
    assert list(lay.row_off) == [0, 10, 13, 20]
    # the offsets are computed once; what a caller gets is a copy it cannot spoil them with
    lay.w_off[1] = -1
    lay.row_off[:] = 0
    assert lay.w_off[1] == 40 and lay.row_off[1] == 10
    W = np.arange(lay.n_weights, dtype=np.float32)
    assert lay.weight_view(W, 0).shape == (10, 4)     # transposed first layer
    assert lay.weight_view(W, 2).shape == (7, 3)      # row per neuron
    assert lay.weight_view(W, 2)[0, 0] == 40 + 12
    W1, B1 = init_params(lay, 5)
    W2, B2 = init_params(lay, 5)
    assert np.array_equal(W1, W2) and not B1.any()
    assert not np.array_equal(W1, init_params(lay, 6)[0])
    # Glorot-normal scale of every layer, std = sqrt(2 / (fan_in + fan_out)): on layers large
    # enough that the sample std is within ~1% of the true one (a swapped or wrong fan fails)
    big = Layout((300, 200, 100, 50))
    Wb = init_params(big, 7)[0]
    for l in range(big.n_layers):
        w = big.weight_view(Wb, l)
        want = np.sqrt(2.0 / (big.sizes[l] + big.sizes[l + 1]))
        assert w.std() == pytest.approx(want, rel=0.03), f"layer {l}"
        assert abs(w.mean()) < 0.05 * want


def test_zeros_touched_is_zeros():
    from slide.kernels.layers import zeros_touched
    for n in (0, 1, 70_000, 200_001):
        a = zeros_touched(n, np.float32)
        assert a.dtype == np.float32 and a.shape == (n,) and not a.any()
    assert zeros_touched(5, np.int32).dtype == np.int32
