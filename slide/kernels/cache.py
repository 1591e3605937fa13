"""Numba's on-disk cache of slide's kernels, keyed by the sources of the whole package.

Numba keys a cached kernel by the contents of the one file that defines it. But a kernel's
machine code also holds what it calls or inlines from other files: the optimizer's Adam
arithmetic (``slide.network.adam``) inlined into the row steps of ``slide.network.row_steps``,
the samplers' and the layers' helpers in every batch kernel. After an edit to such a file
alone (a ``git pull`` in an editable install, a developer's change), Numba's own keys would
go on serving the old code from the cache, silently.

So every kernel defined in slide is keyed by its own file (as Numba does) and by a digest of
all of slide's Python sources: any change to any of them recompiles every kernel, once.
This uses Numba's caching internals (its list of cache locators); where they differ from
what is expected here, nothing is changed and Numba's own keys apply.
"""
import hashlib
import os

from numba.core import caching

# the package's directory: the files whose kernels take the package-wide key
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_digest = None


def package_digest(root=PACKAGE_ROOT):
    """sha256 of every ``.py`` file under ``root``: their paths relative to it and their
    contents, in a fixed order (~1 MB read once a process, a few ms)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
            h.update(b"\0")
    return h.digest()


def _package_digest():
    global _digest
    if _digest is None:
        _digest = package_digest()
    return _digest


def _inside(py_file):
    return os.path.abspath(py_file).startswith(PACKAGE_ROOT + os.sep)


def _package_keyed(base):
    """A subclass of Numba's locator ``base`` that takes slide's files only and adds the
    package digest to each one's source stamp."""

    class Locator(base):
        slide_package_keyed = True

        @classmethod
        def from_function(cls, py_func, py_file):
            if not _inside(py_file):
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return super().get_source_stamp(), _package_digest()

    Locator.__name__ = Locator.__qualname__ = "PackageKeyed" + base.__name__
    return Locator


def install():
    """Put the package-keyed locators first in Numba's list (once); returns whether they are
    there. Must run before any of slide's kernels is defined (``slide.kernels`` imports this
    first): a kernel's locator is chosen when its decorator runs."""
    try:
        impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
        bases = [getattr(caching, name, None) or getattr(caching, "_" + name)
                 for name in ("UserProvidedCacheLocator", "InTreeCacheLocator",
                              "UserWideCacheLocator")]
        current = list(impl._locator_classes)
    except AttributeError:
        return False
    if any(getattr(c, "slide_package_keyed", False) for c in current):
        return True
    impl._locator_classes = [_package_keyed(b) for b in bases] + current
    return True


INSTALLED = install()
