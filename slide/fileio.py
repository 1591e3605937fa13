"""The one way slide writes a file: atomically.

Every file the project writes (checkpoints, models, configs, metrics snapshots, predictions,
generated data sets) goes through ``atomic_write``: the bytes go to a temporary file in the
target's directory, are flushed and fsync'ed, and only then renamed over the target; the
directory is fsync'ed so the rename survives a crash. A failure at any point (a full disk, an
exception raised by the writer, Ctrl-C) leaves the previous file intact and no temporary file
behind. The file gets the mode a plain ``open(path, "w")`` would give it (0666 less the
umask), not ``mkstemp``'s 0600.
"""
import contextlib
import errno
import os
import tempfile


def _current_umask():
    """The process's umask. Linux reports it in /proc/self/status; elsewhere it can only be
    read by setting it (``os.umask`` returns the old one) and setting it back, which another
    thread creating a file in between would see."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:          # some platforms cannot open a directory; the rename still stands
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path, mode="wb", encoding=None):
    """Context manager yielding a file object whose content replaces ``path`` on success.

    ``mode`` is ``"wb"`` or ``"w"`` (text; ``encoding`` defaults to UTF-8). The target is
    untouched if the body raises.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write mode must be 'wb' or 'w', not {mode!r}")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    # the errors name the caller's path, not the temporary file's
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory, cannot be written as a file",
                                path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(errno.ENOENT, f"cannot write it: no directory {directory}",
                                path)
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
    try:
        if mode == "w":
            f = os.fdopen(fd, "w", encoding=encoding or "utf-8", newline="")
        else:
            f = os.fdopen(fd, "wb")
        with f:
            # mkstemp creates the file 0600 whatever the umask; give it the mode open() would
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), 0o666 & ~_current_umask())
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def atomic_link(src, path):
    """Make ``path`` a second name of the file ``src`` (a hard link, no copy), replacing
    ``path`` atomically. False, with nothing changed, where the file system cannot link (the
    caller then writes ``path`` itself)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.link")
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.link(src, tmp)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    _fsync_dir(directory)
    return True


def write_text(path, text):
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_write(path, "w") as f:
        f.write(text)


def write_bytes(path, data):
    """Write ``data`` to ``path`` atomically."""
    with atomic_write(path, "wb") as f:
        f.write(data)
