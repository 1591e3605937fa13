"""``slide evaluate`` and ``slide predict`` (the input streamed in chunks of lines)."""
from __future__ import annotations

import json
import os
import sys
import time

from slide.cli.common import (EXIT_DATA, EXIT_OK, EXIT_USAGE, KS, PROPENSITY_FILE, CliError, _err,
                              _info)
from slide.cli.rundir import _resolve_model
from slide.fileio import atomic_write, write_text


def _predict_topk_chunked(model, X, k, exact, chunk=4096):
    import numpy as np
    parts = []
    for start in range(0, X.shape[0], chunk):
        parts.append(np.asarray(model.predict_topk(X[start:start + chunk], k=k, exact=exact)))
    if not parts:
        return np.zeros((0, k), dtype=np.int64)
    return np.concatenate(parts, axis=0)


def _scores(model, X, Y, inv_prop=None, exact=True):
    from slide import metrics
    topk = _predict_topk_chunked(model, X, max(KS), exact)
    return metrics.evaluate(Y, topk, ks=KS, inv_propensity=inv_prop)


def _model_dims(model):
    n_features = getattr(model, "n_features_in_", None)
    n_labels = getattr(model, "n_labels_", None) or getattr(model, "n_outputs_", None)
    return n_features, n_labels


def _conform(X, n_features, path):
    """Give ``X`` the model's feature count (a file's header may be narrower or wider; columns
    beyond the model's are an error, never silently dropped)."""
    if n_features is None or X.shape[1] == n_features:
        return X
    if X.shape[1] > n_features and X.nnz and int(X.indices.max()) >= n_features:
        raise CliError(f"{path}: feature index {int(X.indices.max())} is outside the model's "
                       f"{n_features} features", EXIT_DATA)
    X = X.tocsr(copy=False)
    X.resize((X.shape[0], n_features))
    return X


def _check_sparse(args, model, path):
    """``--sparse`` needs a model with an LSH serving index: an ensemble scores every label."""
    if args.sparse and hasattr(model, "members_"):
        raise CliError(f"--sparse: {path} is an ensemble, which scores every label; serve one "
                       f"of its members with --sparse (an ensemble run keeps each in "
                       f"member-K/), or leave --sparse out", EXIT_USAGE)


def _evaluation_data(args, model, run_dir):
    """``(classifier, X, Y)`` of ``slide evaluate``'s data file: XC, or raw text for a model
    trained on text (its vectorizer, its label names; unseen names left out with a note)."""
    from slide import data as data_mod
    from slide.cli.textdata import known_labels, read_text_for_model, text_parts
    from slide.data.textfile import format_of
    steps, model = text_parts(model, run_dir)
    if format_of(args.data) != "xc":
        X, label_lists = read_text_for_model(args.data, steps, model, need_labels=False)
        return model, X, known_labels(model.classes_, label_lists, args.data)
    X, Y = data_mod.read_xc(args.data)
    return model, X, Y


def cmd_evaluate(args):
    import numpy as np

    from slide import metrics
    model, mpath, run_dir = _resolve_model(args.model)
    model, X, Y = _evaluation_data(args, model, run_dir)
    _check_sparse(args, model, mpath)
    n_features, n_labels = _model_dims(model)
    X = _conform(X, n_features, args.data)
    if n_labels is not None and Y.shape[1] != n_labels:
        if Y.nnz and int(Y.indices.max()) >= n_labels:
            raise CliError(f"{args.data}: label {int(Y.indices.max())} is outside the model's "
                           f"{n_labels} labels", EXIT_DATA)
        Y = Y.tocsr(copy=False)
        Y.resize((Y.shape[0], n_labels))
    inv, source = None, None
    # the run directory's propensities; a dense baseline's model sits one level below its run
    for d in ([run_dir, os.path.dirname(os.path.abspath(run_dir))] if run_dir else []):
        path = os.path.join(d, PROPENSITY_FILE)
        if os.path.exists(path):
            cand = np.load(path)
            if cand.shape == (Y.shape[1],):
                inv, source = cand, f"training labels ({path})"
                break
    if inv is None:
        inv = metrics.inverse_propensity(Y)
        source = f"labels of {args.data} (no training propensities found beside the model)"
        _err(f"note: PSP@k uses inverse propensities from the {source}")
    t0 = time.perf_counter()
    topk = _predict_topk_chunked(model, X, max(KS), exact=not args.sparse)
    seconds = time.perf_counter() - t0
    res = metrics.evaluate(Y, topk, ks=KS, inv_propensity=inv)
    out = {"model": os.path.abspath(mpath), "data": os.path.abspath(args.data),
           "points": int(X.shape[0]),
           "inference": "sparse (serving index)" if args.sparse else "exact",
           "propensities": source, "predict_seconds": round(seconds, 3),
           **{k: float(v) for k, v in res.items()}}
    text = json.dumps(out, indent=2)
    if args.out:
        write_text(args.out, text + "\n")
    if args.json:
        print(text)
    else:
        _info(f"{out['points']:,} points of {args.data}, {out['inference']} inference "
              f"({seconds:.2f} s)")
        header = "metric " + " ".join(f"{'@' + str(k):>8s}" for k in KS)
        _info(header)
        for name in ("P", "nDCG", "PSP"):
            vals = " ".join(f"{float(res[f'{name}@{k}']):8.4f}" for k in KS)
            _info(f"{name:6s} {vals}")
        if args.out:
            _info(f"wrote {args.out}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# predict: streams the input in chunks of lines

def _read_xc_header(path, f):
    from slide.data import DataFormatError
    raw = f.readline()
    text = raw.decode("utf-8", errors="replace").strip()
    fields = text.split()
    if len(fields) != 3 or not all(x.isdigit() and x.isascii() for x in fields):
        raise DataFormatError(path, 1, text or "<empty>",
                              "header must be 'n_points n_features n_labels'")
    return tuple(int(x) for x in fields)


def _iter_xc_chunks(path, chunk_lines, tmpdir):
    """Yield ``(first_row, X)`` per chunk of at most ``chunk_lines`` data lines, parsed by
    ``slide.data.read_xc`` (one temporary file per chunk, with a header of its own) so only one
    chunk is in memory. Errors report the real file and line."""
    from slide.data import DataFormatError, read_xc
    tmp = os.path.join(tmpdir, "chunk.txt")
    with open(path, "rb") as f:
        n_points, n_features, n_labels = _read_xc_header(path, f)
        row = 0
        line_no = 1
        while True:
            lines = []
            while len(lines) < chunk_lines and row + len(lines) < n_points:
                raw = f.readline()
                if not raw:
                    break
                lines.append(raw if raw.endswith(b"\n") else raw + b"\n")
            if not lines:
                break
            # a private scratch file in a TemporaryDirectory (read back at once, then deleted):
            # not an output of slide, so no atomic rename or fsync per chunk
            with open(tmp, "wb") as out:
                out.write(f"{len(lines)} {n_features} {n_labels}\n".encode())
                out.writelines(lines)
            try:
                X, _ = read_xc(tmp)
            except DataFormatError as e:
                real = line_no + max(e.line - 1, 1)
                raise DataFormatError(path, real, e.token, e.reason) from None
            yield row, X
            row += len(lines)
            line_no += len(lines)
            if len(lines) < chunk_lines:
                break
        if row < n_points:
            raise DataFormatError(path, line_no + 1, "<end of file>",
                                  f"header announces {n_points} points but the file has {row}")
        for extra in f:
            line_no += 1
            if extra.strip():
                raise DataFormatError(path, line_no, extra.decode(errors="replace").strip()[:40],
                                      f"line beyond the {n_points} points of the header")


def cmd_predict(args):
    if args.k < 1:
        raise CliError(f"--k must be >= 1, got {args.k}", EXIT_USAGE)
    if args.chunk_size < 1:
        raise CliError(f"--chunk-size must be >= 1, got {args.chunk_size}", EXIT_USAGE)
    if not os.path.isfile(args.data):
        raise CliError(f"data file not found: {args.data}", EXIT_DATA)
    from slide.cli.textdata import text_parts
    from slide.data.textfile import format_of
    model, mpath, run_dir = _resolve_model(args.model)
    args.text_steps, model = text_parts(model, run_dir)
    _check_sparse(args, model, mpath)
    args.text_input = format_of(args.data) != "xc"
    n_features, _ = _model_dims(model)
    to_stdout = args.out in (None, "-")
    out_path = None if to_stdout else args.out
    t0 = time.perf_counter()
    if to_stdout:
        written = _write_predictions(sys.stdout, model, args, n_features)
    else:
        with atomic_write(out_path, "w") as out:    # a failed run leaves no partial file
            written = _write_predictions(out, model, args, n_features)
    if not to_stdout:
        _err(f"wrote top-{args.k} predictions of {written:,} points to {out_path} "
             f"({time.perf_counter() - t0:.1f} s)")
    return EXIT_OK


def _write_predictions(out, model, args, n_features):
    """Stream ``args.data`` chunk by chunk into ``out``; returns the number of lines."""
    import tempfile
    if getattr(args, "text_input", False):
        return _write_text_predictions(out, model, args)
    written = 0
    # a model that knows its labels' names answers in names, whatever its input's format
    named = bool(getattr(model, "named_labels_", False))
    with tempfile.TemporaryDirectory(prefix="slide-predict-") as tmpdir:
        for _, X in _iter_xc_chunks(args.data, args.chunk_size, tmpdir):
            X = _conform(X, n_features, args.data)
            labels, scores = _topk_with_scores(model, X, args.k, not args.sparse)
            if named:
                written += _write_named(out, model, labels, scores)
                continue
            lines = []
            for lab, sc in zip(labels, scores):
                lines.append(" ".join(f"{int(a)}:{float(b):.6g}" for a, b in zip(lab, sc)
                                      if a >= 0))
            out.write("\n".join(lines) + "\n")
            written += len(lines)
    return written


def _write_named(out, model, ids, scores):
    """One JSON line per row: the label names of ``ids`` (best first) and their scores."""
    import numpy as np
    names = np.asarray(model.classes_)
    for lab, sc in zip(ids, scores):
        keep = lab >= 0
        out.write(json.dumps({"labels": names[lab[keep]].tolist(),
                              "scores": [round(float(v), 6) for v in sc[keep]]}) + "\n")
    return len(ids)


def _write_text_predictions(out, model, args):
    """``slide predict`` on a JSONL / TSV file: one JSON line per document, the label names
    and their scores, streamed in chunks of ``--chunk-size`` documents."""
    from slide.cli.textdata import _transform
    from slide.data.textfile import iter_text_file
    if args.text_steps is None:
        raise CliError(f"{args.data} is raw text, but the model carries no vectorizer (it was "
                       f"not trained on a .jsonl / .tsv file)", EXIT_DATA)
    written = 0
    chunk = []

    def flush():
        X = _conform(_transform(args.text_steps, chunk), getattr(model, "n_features_in_", None),
                     args.data)
        ids, scores = _topk_with_scores(model, X, min(args.k, model.n_labels_),
                                        not args.sparse)
        return _write_named(out, model, ids, scores)

    for _, text, _ in iter_text_file(args.data):
        chunk.append(text)
        if len(chunk) == args.chunk_size:
            written += flush()
            chunk = []
    if chunk:
        written += flush()
    return written


def _topk_with_scores(model, X, k, exact):
    """Top-k label ids and their scores for a chunk: exact, the scores that ranked them
    (``predict_topk_scored``: the re-ranker's probabilities, else the blended probabilities
    with the neighbour vote, else the logits; an ensemble's, ``SlideEnsemble.
    predict_topk_scored``). Sparse, or a model without that method (a sharded one), the top-k
    comes without scores, so they are read from ``predict_scores`` on slices small enough that
    the dense score block stays under ~64 MB even at 670K labels."""
    import numpy as np
    if exact and hasattr(model, "predict_topk_scored"):
        labels, scores = model.predict_topk_scored(X, k=k)
        return labels, scores.astype(np.float32)
    labels = np.asarray(model.predict_topk(X, k=k, exact=exact))
    n_labels = max(1, int(getattr(model, "n_labels_", 1)))
    step = max(1, (16 << 20) // n_labels)
    scores = np.empty(labels.shape, dtype=np.float32)
    for a in range(0, X.shape[0], step):
        S = np.asarray(model.predict_scores(X[a:a + step]))
        lab = labels[a:a + step]
        scores[a:a + step] = np.take_along_axis(S, np.where(lab >= 0, lab, 0), axis=1)
    return labels, scores
