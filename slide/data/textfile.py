"""Raw-text data files for ``slide train / evaluate / predict`` (docs/text.md).

Two forms, one document per line (UTF-8):

- **JSONL** (``.jsonl``): ``{"text": "...", "labels": ["name", ...]}``; label names are strings
  or integers; ``labels`` may be absent or empty in a file only predicted on.
- **TSV** (``.tsv``): ``labels<TAB>text``, the labels separated by commas (``a,b,c``; empty
  for none); the text is everything after the first tab.

Blank lines are skipped. A malformed line raises ``DataFormatError`` naming the file, the line
(1-based) and the field, as ``read_xc`` does for XC files.
"""
import json
import os

from slide.data.xc import DataFormatError

FORMATS = ("jsonl", "tsv")
EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".tsv": "tsv"}


def format_of(path, default="xc"):
    """The format a file's extension names (``.jsonl`` / ``.tsv``), else ``default``."""
    return EXTENSIONS.get(os.path.splitext(str(path))[1].lower(), default)


def _short(text, n=40):
    text = text.strip()
    return text if len(text) <= n else text[:n] + "..."


def _jsonl_record(path, line_no, line, need_labels):
    try:
        rec = json.loads(line)
    except ValueError as exc:
        raise DataFormatError(path, line_no, _short(line), f"not a JSON object ({exc.msg})") \
            from None
    if not isinstance(rec, dict):
        raise DataFormatError(path, line_no, _short(line), "not a JSON object")
    text = rec.get("text")
    if not isinstance(text, str):
        raise DataFormatError(path, line_no, _short(line),
                              "field 'text' is missing or not a string")
    labels = rec.get("labels", [] if not need_labels else None)
    if labels is None:
        raise DataFormatError(path, line_no, _short(line), "field 'labels' is missing")
    if not isinstance(labels, list) or not all(
            isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))
            for v in labels):
        raise DataFormatError(path, line_no, _short(json.dumps(labels)),
                              "field 'labels' must be a list of strings or integers")
    return text, labels


def _tsv_record(path, line_no, line, need_labels):
    head, tab, text = line.rstrip("\r\n").partition("\t")
    if not tab:
        raise DataFormatError(path, line_no, _short(line),
                              "no tab: a TSV line is 'labels<TAB>text'")
    labels = [v.strip() for v in head.split(",")] if head.strip() else []
    if any(not v for v in labels):
        raise DataFormatError(path, line_no, _short(head),
                              "field 'labels' has an empty name (labels are 'a,b,c')")
    if need_labels and not labels:
        raise DataFormatError(path, line_no, _short(line), "field 'labels' is empty")
    return text, labels


def iter_text_file(path, fmt=None, need_labels=False):
    """Yield ``(line number, text, labels)`` of each non-blank line of a JSONL or TSV file."""
    fmt = fmt or format_of(path, None)
    if fmt not in FORMATS:
        raise ValueError(f"{path}: not a text data file (.jsonl or .tsv), format {fmt!r}")
    parse = _jsonl_record if fmt == "jsonl" else _tsv_record
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataFormatError(path, line_no, _short(raw.decode("utf-8", "replace")),
                                      f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
            if not line.strip():
                continue
            text, labels = parse(path, line_no, line, need_labels)
            yield line_no, text, labels


def read_text_file(path, fmt=None, need_labels=False):
    """``(texts, label lists)`` of a whole JSONL or TSV file (``iter_text_file``)."""
    texts, labels = [], []
    for _, text, labs in iter_text_file(path, fmt, need_labels):
        texts.append(text)
        labels.append(labs)
    if not texts:
        raise DataFormatError(path, 1, "<empty>", "no documents in the file")
    return texts, labels
