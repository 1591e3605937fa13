"""slide's kernels are cached under a key of the whole package's sources
(``slide.kernels.cache``): a kernel's machine code holds what it inlines from other files, and
Numba's own key (the defining file's contents) kept serving it after such a file changed."""
import importlib
import sys

import numpy as np
from numba.core.caching import FunctionCache

from slide.kernels import cache
from slide.kernels.expsum import ordered_sum


def test_the_package_keyed_locators_are_installed_for_slide_files_only(tmp_path, monkeypatch):
    assert cache.INSTALLED
    locator = ordered_sum._cache._impl.locator
    assert getattr(locator, "slide_package_keyed", False)
    assert locator.get_source_stamp()[1] == cache.package_digest()
    # a kernel in a module outside slide keeps Numba's own locator and key
    (tmp_path / "outside_mod.py").write_text(
        "import numba\n\n@numba.njit(cache=True)\ndef plus_one(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("outside_mod")
    try:
        assert mod.plus_one(1) == 2
        assert not getattr(mod.plus_one._cache._impl.locator, "slide_package_keyed", False)
    finally:
        sys.modules.pop("outside_mod", None)


def test_the_digest_follows_every_python_source(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "notes.txt").write_text("not a source\n")
    d0 = cache.package_digest(str(tmp_path))
    assert cache.package_digest(str(tmp_path)) == d0
    (tmp_path / "notes.txt").write_text("changed\n")
    assert cache.package_digest(str(tmp_path)) == d0
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    d1 = cache.package_digest(str(tmp_path))
    assert d1 != d0
    (tmp_path / "sub" / "b.py").rename(tmp_path / "sub" / "c.py")     # same bytes, new name
    assert cache.package_digest(str(tmp_path)) not in (d0, d1)


def test_a_cached_kernel_is_stale_once_any_slide_source_changes(monkeypatch):
    """The kernel's own file unchanged, another one of slide's sources changed (here: its
    digest): the cache index no longer serves the compiled code."""
    ordered_sum(np.ones(9, np.float32))            # compiled or loaded, and in the cache
    assert FunctionCache(ordered_sum.py_func)._cache_file._load_index()
    monkeypatch.setattr(cache, "_digest", b"\0" * 32)
    assert FunctionCache(ordered_sum.py_func)._cache_file._load_index() == {}
