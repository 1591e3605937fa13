"""Fuzz the input boundary of slide (issue 28: bad input never crashes the process).

Every case builds one input -- CSR / CSR array / CSC / COO / LIL / dense / label lists, with
out-of-range, negative, duplicate or unsorted ids, empty rows, NaN / inf, a wrong shape or
dtype, a malformed indptr -- and feeds it to one entry point: ``predict_topk``,
``predict_proba``, ``score``, ``partial_fit``, ``fit``, ``slide.save`` / ``slide.load`` (of a
damaged file), ``read_xc`` / ``write_xc``, or the CLI's config loader ``slide.config``. A case
passes when it either succeeds with the result of the canonical input (the same matrix, ids
sorted and duplicates summed) or raises ``ValueError`` (``DataFormatError``, ``CheckpointError``
and ``ConfigError`` are ValueErrors) -- a valid input that raises, an invalid one that succeeds,
or a result that differs from the canonical input's is a *silent wrong result*; any other
exception is a *bad exception*; a worker process that dies is a *crash* (the parent restarts
the worker after the case that killed it).

    PYTHONPATH=$PWD python bench/fuzz.py --cases 10000 [--seed 0]

writes bench/results/fuzz.json and fuzz.md (cases by entry point and input kind, findings with
their case ids: ``--worker --start i --stop i+1`` replays one). tests/test_fuzz.py runs a few
hundred cases through the same worker.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
N_FEATURES, N_LABELS, N_TRAIN = 20, 8, 40
MODEL = dict(hidden_sizes=(8,), epochs=1, batch_size=16, n_threads=1, neighbours=0,
             rerank=False, random_state=0, shared_negatives=4)
OPS = ("predict_topk", "predict_proba", "score", "partial_fit", "fit", "save_load", "read_xc",
       "write_xc", "config")
# how often each entry point is drawn: training is the slow one
OP_WEIGHTS = np.array([30, 15, 15, 2, 1, 6, 10, 10, 11], float)
MUTATIONS = ("clean", "unsorted", "duplicates", "empty_rows", "out_of_range", "negative", "nan",
             "inf", "wrong_cols", "wrong_dtype", "bad_indptr", "huge")
FORMATS = ("csr", "csr_array", "csc", "coo", "lil", "dense")
INVALID = {"out_of_range", "negative", "nan", "inf", "wrong_cols", "wrong_dtype", "bad_indptr",
           "huge"}


# ---------------------------------------------------------------------------------------------
# inputs


def training_data():
    rng = np.random.default_rng(12345)
    X = sp.random(N_TRAIN, N_FEATURES, density=0.3, format="csr", random_state=rng,
                  dtype=np.float32)
    labels = [sorted(set(rng.integers(0, N_LABELS, rng.integers(1, 3)).tolist()))
              for _ in range(N_TRAIN)]
    return X, labels


def _entries(rng, n_rows, n_cols, empty_rows):
    """(rows, cols, values) of a random sparse matrix, rows sorted, ids within a row random."""
    per_row = rng.integers(0, 5, n_rows)
    if empty_rows:
        per_row[rng.random(n_rows) < 0.5] = 0
    rows = np.repeat(np.arange(n_rows), per_row)
    cols = rng.integers(0, n_cols, rows.size)
    vals = rng.uniform(-2, 2, rows.size).astype(np.float32)
    return rows, cols, vals


def make_features(rng, n_rows):
    """(input, canonical dense float32 or None when the input is invalid, mutation, format)."""
    mutation = MUTATIONS[rng.integers(len(MUTATIONS))]
    fmt = FORMATS[rng.integers(len(FORMATS))]
    n_cols = N_FEATURES + (int(rng.choice([-3, -1, 1, 5])) if mutation == "wrong_cols" else 0)
    rows, cols, vals = _entries(rng, n_rows, n_cols, mutation == "empty_rows")
    if rows.size == 0:
        rows, cols, vals = np.array([0]), np.array([1]), np.array([1.0], np.float32)
    if mutation == "duplicates":
        k = rng.integers(0, rows.size, rows.size)
        rows, cols, vals = (np.concatenate([rows, rows[k]]), np.concatenate([cols, cols[k]]),
                            np.concatenate([vals, vals[k]]))
        o = np.argsort(rows, kind="stable")
        rows, cols, vals = rows[o], cols[o], vals[o]
    dense = np.zeros((n_rows, n_cols), np.float64)
    np.add.at(dense, (rows, cols), vals.astype(np.float64))
    pos = int(rng.integers(rows.size))
    if mutation == "out_of_range":
        cols[pos] = n_cols + int(rng.choice([0, 1, 15, 1_000_000, 2**31 - 2]))
    elif mutation == "negative":
        cols[pos] = -int(rng.choice([1, 2, 1_000_000]))
    elif mutation == "nan":
        vals[pos] = np.nan
    elif mutation == "inf":
        vals[pos] = rng.choice([np.inf, -np.inf])
    elif mutation == "huge":
        vals = vals.astype(np.float64)
        vals[pos] = 1e300
    if mutation == "unsorted" or rng.random() < 0.3:
        o = rng.permutation(rows.size)      # any order of entries; CSR keeps rows grouped below
        o = o[np.argsort(rows[o], kind="stable")]
        rows, cols, vals = rows[o], cols[o], vals[o]
    bad_ids = mutation in ("out_of_range", "negative")
    if fmt == "dense" or (fmt == "lil" and bad_ids):
        if bad_ids:      # a dense array cannot hold a bad id: a wrong shape stands for it
            X = np.zeros((n_rows, n_cols + 1))
        else:
            X = np.zeros((n_rows, n_cols), vals.dtype)
            np.add.at(X, (rows, cols), vals)     # a NaN / inf entry stays non-finite
        fmt = "dense"
    elif fmt in ("csr", "csr_array", "csc"):
        major, minor = (rows, cols) if fmt != "csc" else (cols, rows)
        n_major = n_rows if fmt != "csc" else n_cols
        if fmt == "csc":
            o = np.argsort(major, kind="stable")
            major, minor, v = major[o], minor[o], vals[o]
            if bad_ids:          # a bad column id of CSC is a bad major index: make the row id bad
                minor = minor.copy()
                minor[0] = n_rows + 3 if mutation == "out_of_range" else -1
                major = np.clip(major, 0, n_cols - 1)
                o = np.argsort(major, kind="stable")
                major, minor, v = major[o], minor[o], v[o]
        else:
            v = vals
        indptr = np.zeros(n_major + 1, np.int64)
        np.add.at(indptr, np.clip(major, 0, n_major - 1) + 1, 1)
        indptr = np.cumsum(indptr)
        if mutation == "bad_indptr":
            kind = rng.integers(4)
            if kind == 0:
                indptr = indptr[:-1]
            elif kind == 1:
                indptr = indptr.copy()
                indptr[-1] += 2
            elif kind == 2 and n_major > 2:
                indptr = indptr.copy()
                indptr[1], indptr[-2] = indptr[-2] + 1, indptr[1]
            else:
                indptr = indptr + 1
        cls = {"csr": sp.csr_matrix, "csr_array": sp.csr_array, "csc": sp.csc_matrix}[fmt]
        idx_dtype = np.int64 if mutation == "huge" or rng.random() < 0.5 else np.int32
        try:
            X = cls((v, minor.astype(idx_dtype), indptr), shape=(n_rows, n_cols))
        except (ValueError, OverflowError):
            # scipy's own checks refused it (a short indptr): the raw arrays reach us anyway
            X = cls((n_rows, n_cols), dtype=v.dtype)
            X.data, X.indices, X.indptr = v, minor.astype(idx_dtype), indptr
    elif fmt == "coo":
        # scipy's COO constructor checks ids (not CSR's): build in range, then set the ids
        X = sp.coo_matrix((vals, (rows, np.clip(cols, 0, n_cols - 1))), shape=(n_rows, n_cols))
        X.col = cols.astype(X.col.dtype) if bad_ids else X.col
    else:   # lil from an in-range matrix
        X = sp.lil_matrix(sp.coo_matrix((vals, (rows, cols)), shape=(n_rows, n_cols)))
    if mutation == "wrong_dtype":
        kind = rng.integers(4)
        if kind == 0:
            X = np.array([["a"] * n_cols] * n_rows)
        elif kind == 1:
            X = (X.toarray() if sp.issparse(X) else X).astype(np.complex64)
        elif kind == 2:
            X = np.zeros(n_cols)                              # 1-D
        else:
            X = [[1, 2], [3]]                                 # ragged
        fmt = "dense"
    if mutation == "bad_indptr" and fmt not in ("csr", "csr_array", "csc"):
        mutation = "clean"          # only a compressed format has an indptr to damage
    if fmt == "dense" and mutation in ("out_of_range", "negative"):
        mutation = "wrong_cols"     # stood for by one column too many (above)
        dense = np.zeros((n_rows, n_cols + 1))
    invalid = mutation in INVALID
    return X, (None if invalid else dense.astype(np.float32)), mutation, fmt


def make_labels(rng, n_rows):
    """(labels, canonical 0/1 dense or None when invalid, mutation)."""
    lists = [sorted(set(rng.integers(0, N_LABELS, rng.integers(0, 3)).tolist()))
             for _ in range(n_rows)]
    if not any(lists):
        lists[0] = [int(rng.integers(N_LABELS))]
    canon = np.zeros((n_rows, N_LABELS), np.float32)
    for i, l in enumerate(lists):
        canon[i, l] = 1
    mutation = ("clean", "lists", "out_of_range", "negative", "float_id", "not01", "dense",
                "duplicates", "wrong_rows")[rng.integers(9)]
    row = int(rng.integers(n_rows))
    if mutation == "clean":
        return sp.csr_matrix(canon), canon, mutation
    if mutation == "lists":
        return [list(reversed(l)) for l in lists], canon, mutation
    if mutation == "duplicates":
        return [l + l for l in lists], canon, mutation
    if mutation == "dense":
        return canon.astype(int), canon, mutation
    if mutation == "wrong_rows":
        return lists[:-1], None, mutation
    if mutation == "not01":
        bad = canon.copy()
        bad[row, 0] = rng.choice([2.0, 0.5, np.nan, -1.0])
        return bad, None, mutation
    if mutation == "float_id":
        bad = [list(l) for l in lists]
        bad[row] = bad[row] + [rng.choice([1.5, "x", None])]
        return bad, None, mutation
    bad_id = (N_LABELS + int(rng.choice([0, 5, 10**6])) if mutation == "out_of_range"
              else -int(rng.choice([1, 7])))
    if rng.random() < 0.5:
        bad = [list(l) for l in lists]
        bad[row] = bad[row] + [bad_id]
        return bad, None, mutation
    M = sp.csr_matrix(canon)
    if M.nnz == 0:
        return [[bad_id]] * n_rows, None, mutation
    ind = M.indices.copy()
    ind[int(rng.integers(M.nnz))] = bad_id
    return sp.csr_matrix((M.data, ind, M.indptr), shape=M.shape), None, mutation


# ---------------------------------------------------------------------------------------------
# one case


def _same_topk(a, b):
    return a.shape == b.shape and np.array_equal(a, b)


class Case:
    """What one case did: ``outcome`` is "ok", "wrong" (a silent wrong result) or "bad" (an
    exception other than ValueError); ``detail`` says what."""

    def __init__(self, op, kind):
        self.op, self.kind, self.outcome, self.detail = op, kind, "ok", ""


def run_case(model, model_path, i, seed, workdir):
    import slide
    from slide.data import read_xc, write_xc
    rng = np.random.default_rng([seed, i])
    op = OPS[rng.choice(len(OPS), p=OP_WEIGHTS / OP_WEIGHTS.sum())]
    n_rows = int(rng.integers(1, 7))
    case = Case(op, "")

    def expect(call, valid, check=None):
        try:
            got = call()
        except ValueError as exc:
            if valid:
                case.outcome, case.detail = "wrong", f"valid input raised: {exc}"
            elif not str(exc).strip():
                case.outcome, case.detail = "wrong", "ValueError without a message"
            return
        except Exception:
            case.outcome = "bad"
            case.detail = traceback.format_exc(limit=3)[-600:]
            return
        if not valid:
            case.outcome, case.detail = "wrong", "invalid input accepted"
        elif check is not None and not check(got):
            case.outcome, case.detail = "wrong", "result differs from the canonical input's"

    if op in ("predict_topk", "predict_proba", "score", "partial_fit", "fit", "write_xc"):
        X, Xc, mutation, fmt = make_features(rng, n_rows)
        case.kind = f"X:{mutation}/{fmt}"
        if op in ("write_xc", "fit") and mutation == "wrong_cols":
            Xc = X.toarray() if sp.issparse(X) else np.asarray(X, np.float32)
            Xc = Xc.astype(np.float32)   # a file or a fresh model has any feature count
        valid = Xc is not None
        Xcanon = sp.csr_matrix(Xc) if valid else None
        if op == "predict_topk":
            k = int(rng.choice([1, 3, N_LABELS, N_LABELS + 1, 0]))
            exact = bool(rng.random() < 0.7)
            valid = valid and 1 <= k <= N_LABELS
            ref = (model.predict_topk(Xcanon, k=k, exact=exact) if valid else None)
            expect(lambda: model.predict_topk(X, k=k, exact=exact), valid,
                   lambda got: _same_topk(got, ref))
            case.kind += f"/k={k}"
        elif op == "predict_proba":
            ref = model.predict_proba(Xcanon) if valid else None
            expect(lambda: model.predict_proba(X), valid,
                   lambda got: np.allclose(got, ref, rtol=1e-5, atol=1e-7))
        elif op in ("score", "partial_fit", "fit", "write_xc"):
            Y, Yc, ymut = make_labels(rng, n_rows)
            case.kind += f" Y:{ymut}"
            valid = valid and Yc is not None
            if op in ("fit", "write_xc") and isinstance(Y, list) and ymut == "out_of_range" \
                    and Xc is not None and min(min(l, default=0) for l in Y) >= 0:
                # label lists without n_labels: a large id widens the label space (with a
                # warning when it looks mistyped), which is not wrong for a fresh model or a file
                valid, Yc = True, None
            if op == "fit":
                valid = valid and (Yc is None or Yc.any())
            if op == "score":
                ref = model.score(Xcanon, Yc) if valid else None
                expect(lambda: model.score(X, Y), valid, lambda got: got == ref)
            elif op == "partial_fit":
                valid = valid and Yc.any()
                a, b = slide.load(model_path), slide.load(model_path)
                if valid:
                    a.partial_fit(Xcanon, Yc)
                expect(lambda: b.partial_fit(X, Y), valid,
                       lambda got: np.array_equal(a.network_.W, b.network_.W))
            elif op == "fit":
                ref = None
                if valid and Yc is not None:
                    n_lab = (max(max(l) for l in Y if len(l)) + 1 if isinstance(Y, list)
                             else N_LABELS)
                    ref = slide.SlideClassifier(**MODEL).fit(Xcanon, sp.csr_matrix(Yc)[:, :n_lab])
                expect(lambda: slide.SlideClassifier(**MODEL).fit(X, Y), valid,
                       None if ref is None else
                       (lambda got: np.array_equal(got.network_.W, ref.network_.W)))
            else:
                path = os.path.join(workdir, f"w{i}.txt")

                def round_trip():
                    write_xc(path, X, Y)
                    return read_xc(path)

                def same(got):
                    # label lists infer the label count (largest id + 1): compare the entries
                    same_y = Yc is None or np.array_equal(
                        np.argwhere(got[1].toarray()), np.argwhere(Yc))
                    # duplicates are summed in float32 (the reference sums in float64)
                    return (got[0].shape == Xc.shape and np.allclose(got[0].toarray(), Xc,
                                                                     rtol=1e-6, atol=1e-6)
                            and same_y)
                expect(round_trip, valid, same)
    elif op == "save_load":
        path = os.path.join(workdir, f"m{i}.slide")
        model.save(path)
        raw = bytearray(open(path, "rb").read())
        damage = ("none", "truncate", "flip", "garbage")[rng.integers(4)]
        if damage == "truncate":
            raw = raw[:int(rng.integers(0, len(raw)))]
        elif damage == "flip":
            for p in rng.integers(0, len(raw), int(rng.integers(1, 4))):
                raw[p] ^= 1 << int(rng.integers(8))
        elif damage == "garbage":
            raw = bytearray(rng.integers(0, 256, int(rng.integers(0, 400))).astype(np.uint8))
        with open(path, "wb") as f:
            f.write(bytes(raw))
        case.kind = f"file:{damage}"
        Xq = training_data()[0][:4]
        ref = model.predict_topk(Xq, k=3)
        # a flipped bit may land where no check can see it (a float's low bits): such a load
        # may succeed with other weights; only the undamaged file must predict the same
        expect(lambda: slide.load(path).predict_topk(Xq, k=3), damage in ("none", "flip"),
               (lambda got: _same_topk(got, ref)) if damage == "none" else None)
        if damage == "flip" and case.outcome == "wrong" and "valid input raised" in case.detail:
            case.outcome, case.detail = "ok", ""     # refusing a damaged file is right
    elif op == "read_xc":
        text = _xc_text(rng)
        case.kind = "xc:" + text[1]
        path = os.path.join(workdir, f"r{i}.txt")
        with open(path, "wb") as f:
            f.write(text[0])
        if text[1] == "mutated":        # valid or not: the two readers must agree
            expect(lambda: _agree(read_xc, path), True)
        else:
            expect(lambda: _read_both_ways(read_xc, path), text[1] == "clean")
    else:
        text, valid, what = _config_text(rng)
        case.kind = "config:" + what
        path = os.path.join(workdir, f"c{i}.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        from slide.config import load_config
        expect(lambda: load_config(path, check_files=False), valid)
    return case


def _read_both_ways(read_xc, path):
    """``read_xc`` of ``path`` by NumPy first (``slide.data.xc_numpy``) and by the parser
    kernel: their matrices, or their error, must be the same (RuntimeError if not)."""
    outcomes = []
    for use_kernel in (False, True):
        try:
            outcomes.append(read_xc(path, use_kernel=use_kernel))
        except ValueError as exc:
            outcomes.append(exc)
    numpy_first, kernel = outcomes
    if isinstance(kernel, ValueError):
        if str(numpy_first) != str(kernel):
            raise RuntimeError(f"the readers disagree: {numpy_first!r} against {kernel!r}")
        raise kernel
    if isinstance(numpy_first, ValueError) or any(
            a.shape != b.shape or (a != b).nnz or a.indices.dtype != b.indices.dtype
            for a, b in zip(numpy_first, kernel)):
        raise RuntimeError("the readers disagree")
    return kernel


def _agree(read_xc, path):
    """``_read_both_ways``, an error both readers give counting as agreement."""
    try:
        _read_both_ways(read_xc, path)
    except ValueError:
        pass


# the bytes a mutated XC file's edits draw from: the format's own, and a few it rejects
XC_BYTES = b"0123456789.,:- \n\re+E\tx"


def _xc_text(rng):
    """(bytes of an XC file, "clean" or what is wrong with it)."""
    n, d, L = int(rng.integers(1, 5)), 10, 5
    lines = [f"{n} {d} {L}"]
    for _ in range(n):
        labs = ",".join(str(x) for x in sorted(set(rng.integers(0, L, 2).tolist())))
        feats = " ".join(f"{f}:{rng.uniform(0, 1):.3f}"
                         for f in sorted(set(rng.integers(0, d, 3).tolist())))
        lines.append(f"{labs} {feats}")
    what = ("clean", "feature_id", "label_id", "negative", "value", "header", "count", "binary",
            "nan", "mutated")[rng.integers(10)]
    r = 1 + int(rng.integers(n))
    if what == "feature_id":
        lines[r] += f" {d + int(rng.choice([0, 7, 10**9]))}:1.0"
    elif what == "label_id":
        lines[r] = f"{L + int(rng.choice([0, 3]))} " + lines[r].split(" ", 1)[1]
    elif what == "negative":
        lines[r] += " -3:1.0"
    elif what == "value":
        lines[r] += " 1:abc"
    elif what == "header":
        lines[0] = rng.choice(["", "x y z", "1 2", "-1 10 5", "1 10 5 7"])
    elif what == "count":
        lines.append(lines[-1])
    elif what == "nan":
        lines[r] += " 9:nan"
    data = ("\n".join(lines) + "\n").encode()
    if what == "mutated":               # one to three bytes inserted, deleted or replaced
        data = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(0, len(data)))
            edit, byte = int(rng.integers(3)), XC_BYTES[rng.integers(len(XC_BYTES))]
            if edit == 0:
                data.insert(i, byte)
            elif edit == 1:
                del data[i]
            else:
                data[i] = byte
        data = bytes(data)
    if what == "binary":
        data = bytes(rng.integers(0, 256, int(rng.integers(1, 200))).astype(np.uint8))
    return data, what


def _config_text(rng):
    """(TOML text, valid?, what)."""
    what = ("clean", "unknown_key", "bad_type", "out_of_range", "syntax", "batch_huge",
            "binary")[rng.integers(7)]
    body = {"clean": 'data.preset = "tiny"\ntrain.batch_size = 32\n',
            "unknown_key": 'data.preset = "tiny"\nmodel.hiden_sizes = [8]\n',
            "bad_type": 'data.preset = "tiny"\ntrain.batch_size = "big"\n',
            "out_of_range": 'data.preset = "tiny"\ntrain.batch_size = 0\n',
            "syntax": 'data.preset = "tiny\ntrain.batch_size = \n',
            "batch_huge": 'data.preset = "tiny"\ntrain.batch_size = 2000000\n',
            "binary": "\x00\x01 = [[\n"}[what]
    return body, what == "clean", what


# ---------------------------------------------------------------------------------------------
# worker and parent


def worker(seed, start, stop, out_path):
    """Run cases start..stop-1 in this process, one JSON line each; a line {"start": i} goes
    out (flushed) before case i, so the parent can name the case that killed the process."""
    import slide
    X, labels = training_data()
    model = slide.SlideClassifier(**MODEL).fit(X, labels)
    model.predict_topk(X[:2], k=2, exact=False)          # build the serving index once
    with tempfile.TemporaryDirectory() as workdir, open(out_path, "a") as out:
        model_path = os.path.join(workdir, "model.slide")
        model.save(model_path)      # partial_fit cases train copies loaded from it
        for i in range(start, stop):
            out.write(json.dumps({"start": i}) + "\n")
            out.flush()
            c = run_case(model, model_path, i, seed, workdir)
            out.write(json.dumps({"case": i, "op": c.op, "kind": c.kind, "outcome": c.outcome,
                                  "detail": c.detail}) + "\n")
            out.flush()
            for f in os.listdir(workdir):
                if f != "model.slide":
                    os.unlink(os.path.join(workdir, f))


def run(n_cases, seed=0, time_limit=None, log=None):
    """Run n_cases cases in worker processes (restarted after a crash). Returns the summary."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    records, crashes = [], []
    next_case = 0
    with tempfile.TemporaryDirectory() as tmp:
        while next_case < n_cases:
            out_path = os.path.join(tmp, f"from{next_case}.jsonl")
            stop = n_cases
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--seed", str(seed),
                   "--start", str(next_case), "--stop", str(stop), "--out", out_path]
            timeout = None if time_limit is None else max(30.0, time_limit - (time.time() - t0))
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                      timeout=timeout)
                rc, stderr = proc.returncode, proc.stderr
            except subprocess.TimeoutExpired:
                rc, stderr = None, "time limit"
            started, done = None, set()
            if os.path.exists(out_path):
                for line in open(out_path):
                    r = json.loads(line)
                    if "start" in r:
                        started = r["start"]
                    else:
                        records.append(r)
                        done.add(r["case"])
            if rc is None:      # the time limit: stop where the worker stood
                break
            if rc == 0:
                next_case = stop
                continue
            if started is None or started in done:
                raise RuntimeError(f"worker failed outside any case (rc {rc}):\n{stderr[-2000:]}")
            # rc < 0: killed by a signal (SIGSEGV, SIGABRT of a heap check): a crash of slide;
            # rc > 0: the worker's Python raised outside ``expect``: a harness error, recorded
            crashes.append({"case": started, "returncode": rc, "stderr": stderr[-600:],
                            "kind": "crash" if rc < 0 else "harness_error"})
            if log:
                log(f"crash at case {started} (rc {rc})")
            next_case = started + 1
    by_op = {}
    for r in records:
        d = by_op.setdefault(r["op"], {"cases": 0, "wrong": 0, "bad_exception": 0})
        d["cases"] += 1
        d["wrong"] += r["outcome"] == "wrong"
        d["bad_exception"] += r["outcome"] == "bad"
    findings = [r for r in records if r["outcome"] != "ok"]
    return {"seed": seed, "cases_requested": n_cases, "cases_tried": len(records) + len(crashes),
            "crashes": sum(c["kind"] == "crash" for c in crashes),
            "harness_errors": sum(c["kind"] == "harness_error" for c in crashes),
            "silent_wrong_results": sum(r["outcome"] == "wrong"
                                                                 for r in records),
            "bad_exceptions": sum(r["outcome"] == "bad" for r in records),
            "by_entry_point": by_op, "crash_cases": crashes, "findings": findings[:50],
            "seconds": round(time.time() - t0, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=None,
                    help="seconds: stop the run there and record the cases tried")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--start", type=int)
    ap.add_argument("--stop", type=int)
    ap.add_argument("--out")
    ap.add_argument("--results", default=os.path.join(HERE, "results", "fuzz"))
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.seed, a.start, a.stop, a.out)
        return
    sys.path.insert(0, REPO)
    from bench.common import git_commit
    commit = git_commit()
    summary = run(a.cases, a.seed, a.time_limit, log=lambda s: print(s, file=sys.stderr))
    summary = {"commit": commit, **summary}
    with open(a.results + ".json", "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    lines = [f"# Input fuzzing (bench/fuzz.py) at {commit}", "",
             f"{summary['cases_tried']} cases tried of {a.cases} requested (seed {a.seed}, "
             f"{summary['seconds']} s): **{summary['crashes']} crashes, "
             f"{summary['silent_wrong_results']} silent wrong results, "
             f"{summary['bad_exceptions']} exceptions other than ValueError**.", "",
             "| entry point | cases | wrong | bad exception |", "|---|---|---|---|"]
    for op, d in sorted(summary["by_entry_point"].items()):
        lines.append(f"| {op} | {d['cases']} | {d['wrong']} | {d['bad_exception']} |")
    if summary["findings"] or summary["crash_cases"]:
        lines += ["", "## Findings (replay: --worker --start i --stop i+1 --out FILE)", ""]
        for c in summary["crash_cases"]:
            lines.append(f"- case {c['case']}: {c['kind']}, return code {c['returncode']}")
        for r in summary["findings"]:
            detail = r["detail"].strip().splitlines()[-1] if r["detail"].strip() else ""
            lines.append(f"- case {r['case']} ({r['op']}, {r['kind']}): {r['outcome']}: "
                         f"{detail[:200]}")
    with open(a.results + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
