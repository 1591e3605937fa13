"""The archive a checkpoint file is: an ``np.savez`` archive with a JSON ``__meta__`` entry that
lists every array's shape and dtype. This module opens one (checking its format tag and version
against what the caller reads), reads its arrays one at a time and their headers without the
data, checks the listing, and raises :class:`CheckpointError` on a file that is missing,
damaged or not what it claims. What the arrays and the metadata mean is
``slide.persist.checkpoint``'s (one model) and ``slide.persist.models``' (an ensemble).
"""
import json
import os
import zipfile

import numpy as np


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupted or does not match what is expected."""

    def __init__(self, path, problem):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ArchiveArrays:
    """The arrays of an open checkpoint archive, each read from the file when it is asked for
    (and not kept): ``load`` builds the model first and then copies the saved arrays into it
    one at a time, so a large model is never in memory twice (a 670k-label file of 1.45 GB
    peaked at 2.9 GB when every array was read first). ``shape_dtype`` reads an array's
    header only. Values set here (the step records of old files) are kept."""

    def __init__(self, npz):
        self._npz = npz
        self._names = [n for n in npz.files if n != "__meta__"]
        self._set = {}

    def __getitem__(self, name):
        if name in self._set:
            return self._set[name]
        if name not in self._names:
            raise KeyError(name)
        try:
            return self._npz[name]
        except READ_ERRORS as exc:
            raise Unreadable(exc) from None

    def __setitem__(self, name, value):
        self._set[name] = value

    def __contains__(self, name):
        return name in self._set or name in self._names

    def __iter__(self):
        return iter(list(dict.fromkeys(self._names + list(self._set))))

    def read_all(self):
        return {name: self[name] for name in self}

    def shape_dtype(self, name):
        if name in self._set:
            return self._set[name].shape, self._set[name].dtype
        if name not in self._names:
            raise KeyError(name)
        try:
            with self._npz.zip.open(name + ".npy") as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        except READ_ERRORS as exc:
            raise Unreadable(exc) from None
        return tuple(shape), dtype


class Unreadable(Exception):
    """An array of an open archive could not be read (``load`` names the file)."""


def shape_dtype(arrays, name):
    """(shape, dtype) of a saved array without reading it where the arrays allow that."""
    if isinstance(arrays, ArchiveArrays):
        return arrays.shape_dtype(name)
    return arrays[name].shape, arrays[name].dtype


# what a damaged archive raises when it is read (the directory, a header or an array)
READ_ERRORS = (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, UnicodeDecodeError)


def write_archive(f, meta, arrays):
    """``arrays`` and the JSON ``meta`` as one archive into the open binary file ``f``."""
    np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)


def open_archive(path, formats, versions):
    """``(npz, meta)`` of the archive at ``path`` whose format tag is one of ``formats`` and
    whose version is one of ``versions``, the archive left open; CheckpointError otherwise."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(path, "no such file")
    try:
        z = np.load(path, allow_pickle=False)
    except READ_ERRORS as exc:
        raise CheckpointError(path, f"unreadable, truncated or corrupted ({exc})") from None
    try:
        if "__meta__" not in z.files:
            raise CheckpointError(path, "not a slide checkpoint (no metadata entry)")
        meta = json.loads(z["__meta__"].tobytes().decode())
        _check_format(path, meta, formats, versions)
    except CheckpointError:
        z.close()
        raise
    except READ_ERRORS as exc:
        z.close()
        raise CheckpointError(path, f"unreadable, truncated or corrupted ({exc})") from None
    return z, meta


def _check_format(path, meta, formats, versions):
    if not isinstance(meta, dict) or meta.get("format") not in formats:
        raise CheckpointError(path, "not a slide checkpoint (wrong format tag)")
    if meta.get("version") not in versions:
        raise CheckpointError(path, f"format version {meta.get('version')!r} is not supported "
                                    f"(this slide reads version "
                                    f"{', '.join(map(str, versions))})")


def check_listed_arrays(path, meta, arrays):
    """Every array ``meta["arrays"]`` lists is in ``arrays`` with its listed shape and dtype
    (read from the headers), and no other array is."""
    expected = meta["arrays"]
    for name, (shape, dtype) in expected.items():
        if name not in arrays:
            raise CheckpointError(path, f"array {name!r} is missing")
        a_shape, a_dtype = shape_dtype(arrays, name)
        if list(a_shape) != list(shape) or str(a_dtype) != dtype:
            raise CheckpointError(path, f"array {name!r} has shape {a_shape} / {a_dtype}, "
                                        f"expected {tuple(shape)} / {dtype}")
    extra_names = set(arrays) - set(expected)
    if extra_names:
        raise CheckpointError(path, f"unexpected arrays {sorted(extra_names)}")
