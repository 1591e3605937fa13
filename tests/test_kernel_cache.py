"""slide's kernels are cached under a key of their module's import closure
(``slide.kernels.cache``): a kernel's machine code holds what it inlines from other files, and
Numba's own key (the defining file's contents) kept serving it after such a file changed;
a key of the whole package recompiled every kernel after any edit."""
import ast
import importlib
import os
import shutil
import sys

import numpy as np
import pytest
from numba.core import types
from numba.core.caching import FunctionCache
from numba.core.registry import CPUDispatcher

from slide.kernels import cache
from slide.kernels.expsum import ordered_sum


def _copy_package(tmp_path):
    """A copy of slide's sources (no caches) under tmp_path/slide; its root."""
    root = tmp_path / "slide"
    shutil.copytree(cache.PACKAGE_ROOT, root, ignore=shutil.ignore_patterns("__pycache__",
                                                                            "*.nb[ic]"))
    return root


def _keys_by_module(root):
    """``{dotted module: key}`` of the package under ``root``."""
    keys = cache.module_keys(str(root))
    return {name: keys[os.path.abspath(path)]
            for name, path in cache.package_modules(str(root)).items()}


def _append(path, text="\n# edited\n"):
    with open(path, "a") as f:
        f.write(text)


def test_the_closure_keyed_locators_are_installed_for_slide_files_only(tmp_path, monkeypatch):
    assert cache.INSTALLED
    locator = ordered_sum._cache._impl.locator
    assert getattr(locator, "slide_closure_keyed", False)
    path = os.path.join(cache.PACKAGE_ROOT, "kernels", "expsum.py")
    assert locator.get_source_stamp()[1] == cache.kernel_key(path) \
        == cache.module_keys()[os.path.abspath(path)]
    # a kernel in a module outside slide keeps Numba's own locator and key
    (tmp_path / "outside_mod.py").write_text(
        "import numba\n\n@numba.njit(cache=True)\ndef plus_one(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("outside_mod")
    try:
        assert mod.plus_one(1) == 2
        assert not getattr(mod.plus_one._cache._impl.locator, "slide_closure_keyed", False)
    finally:
        sys.modules.pop("outside_mod", None)


def test_a_closure_holds_what_its_module_imports_transitively_and_nothing_else():
    _, graph, _ = cache.import_graph()
    adam = cache.module_closure("slide.network.adam", graph)
    # its own import (layers, for FASTMATH), that module's imports (rng, normal, prefetch:
    # not adam's own), and the compile set-up
    assert "slide.kernels.layers" in graph["slide.network.adam"]
    assert "slide.kernels.rng" not in graph["slide.network.adam"]
    assert {"slide.network.adam", "slide.kernels.layers", "slide.kernels.rng",
            "slide.kernels.normal", "slide.kernels.prefetch", "slide.kernels",
            "slide.kernels.codegen", "slide.kernels.cache"} <= set(adam)
    assert "slide.rank.rerank" not in adam and "slide.network.network" not in adam
    assert "slide.estimator" not in adam
    # row_steps imports adam, and so what adam imports
    assert set(adam) <= set(cache.module_closure("slide.network.row_steps", graph))
    # the post-fit stages never see the network
    assert not any(m.startswith("slide.network")
                   for m in cache.module_closure("slide.rank.candidates", graph))


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_import_rules(tmp_path):
    """Every way a module can bind another's names: ``import a.b`` (and ``as``), ``from a
    import module`` / ``name``, relative imports, function-level imports, ``import_module``
    with a literal name; a package counts where its ``__init__`` may be what a name is."""
    root = tmp_path / "slide"
    _write(root, {
        "__init__.py": "",
        "kernels/__init__.py": "from slide.kernels import setup\n",
        "kernels/setup.py": "",
        "a/__init__.py": "",
        "a/b.py": "",
        "c.py": "",
        "d.py": "X = 1\n",
        "e/__init__.py": "from slide.e.sub import helper\n",     # binds helper, not sub
        "e/sub.py": "def helper():\n    pass\n",
        "f/__init__.py": "sub = 3\n",                            # binds sub itself
        "f/sub.py": "",
        "g/__init__.py": "def __getattr__(name):\n    return name\n",
        "g/sub.py": "",
        "h/__init__.py": "",
        "h/one.py": "",
        "h/two.py": "",
        "h/inner/__init__.py": "",
        "h/inner/mod.py": ("from . import deep\nfrom ..one import x\nfrom .. import two\n"
                           '"""the word import in a docstring"""\n'),
        "h/inner/deep.py": "",
        "late.py": "",
        "lazy.py": "",
        "unrelated.py": "from slide import c\n",
        "user.py": ("import slide.a.b\nimport slide.c as c\nfrom slide.d import X\n"
                    "from slide.e import sub\nfrom slide.f import sub as fsub\n"
                    "from slide.g import sub as gsub\nfrom slide.h.inner import mod\n"
                    "from importlib import import_module\n"
                    "def f():\n    from slide import late\n"
                    "    return import_module('slide.lazy')\n"),
    })
    _, graph, _ = cache.import_graph(str(root))
    assert graph["slide.user"] == {"slide", "slide.a", "slide.a.b", "slide.c", "slide.d",
                                   "slide.e.sub", "slide.f", "slide.f.sub", "slide.g",
                                   "slide.g.sub", "slide.h.inner.mod", "slide.late",
                                   "slide.lazy"}
    assert graph["slide.h.inner.mod"] == {"slide.h.inner.deep", "slide.h.one", "slide.h.two"}
    closure = cache.module_closure("slide.user", graph)
    assert {"slide.h.inner.deep", "slide.h.one", "slide.kernels",
            "slide.kernels.setup"} <= set(closure)
    assert "slide.unrelated" not in closure and "slide.e" not in closure


def test_the_fast_import_scan_agrees_with_a_full_parse(monkeypatch):
    """The lines that start an import, parsed alone (``_import_nodes``' fast path), give the
    package's graph that parsing every file whole gives."""
    _, fast, _ = cache.import_graph()

    def full_parse(source, path):
        nodes, literals = [], []
        for n in ast.walk(ast.parse(source)):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                nodes.append(n)
            elif cache._literal_import(n) is not None:
                literals.append(cache._literal_import(n))
        return nodes, literals
    monkeypatch.setattr(cache, "_import_nodes", full_parse)
    assert cache.import_graph()[1] == fast
    # an import after "try:" on one line, and the word in a comment: the whole file is parsed
    nodes, _ = cache._import_nodes(b"try: import slide.c\nexcept ImportError: pass\n", "x.py")
    assert [n.names[0].name for n in nodes] == ["slide.c"]


def test_an_edit_recompiles_the_kernels_whose_closure_holds_it_and_no_other(tmp_path):
    root = _copy_package(tmp_path)
    before = _keys_by_module(root)
    # the copy, wherever it is, keys as the package does
    assert before["slide.kernels.expsum"] == cache.kernel_key(
        os.path.join(cache.PACKAGE_ROOT, "kernels", "expsum.py"))

    _append(root / "rank" / "rerank.py")              # no kernel of the network sees it
    after = _keys_by_module(root)
    changed = {m for m in before if after[m] != before[m]}
    assert "slide.rank.rerank" in changed and "slide.estimator" in changed
    assert not any(m.startswith(("slide.network", "slide.kernels")) for m in changed)

    _append(root / "kernels" / "layers.py")           # adam inlines its FASTMATH setting
    again = _keys_by_module(root)
    changed = {m for m in after if again[m] != after[m]}
    assert {"slide.network.adam", "slide.network.row_steps", "slide.kernels.layers",
            "slide.kernels.expsum"} <= changed
    assert "slide.kernels.rng" not in changed         # layers imports rng, not the reverse


def test_a_bundles_fields_are_in_every_key(tmp_path):
    """A NamedTuple handed to a kernel whose module does not import it (``arrays.Touched``
    to ``touched``, ``adam``, ``row_steps``): Numba's index keys it by its class and field
    types, so reordering two fields of one type must change the key through the layouts."""
    root = _copy_package(tmp_path)
    _, graph, _ = cache.import_graph(str(root))
    assert "slide.kernels.arrays" not in cache.module_closure("slide.kernels.touched", graph)
    before = _keys_by_module(root)
    arrays = root / "kernels" / "arrays.py"
    lines = arrays.read_text().splitlines(keepends=True)
    touched = next(n for n in ast.walk(ast.parse("".join(lines)))
                   if isinstance(n, ast.ClassDef) and n.name == "Touched")
    i, j = touched.body[0].lineno - 1, touched.body[1].lineno - 1      # two arrays' fields
    lines[i], lines[j] = lines[j], lines[i]
    arrays.write_text("".join(lines))
    after = _keys_by_module(root)
    assert all(after[m] != before[m] for m in before)
    # an edit elsewhere in a bundle's module leaves the kernels that do not import it alone
    arrays.write_text(arrays.read_text() + "\n# edited\n")
    assert _keys_by_module(root)["slide.kernels.touched"] == after["slide.kernels.touched"]


def test_a_cached_kernel_is_stale_once_its_closure_changes_and_not_otherwise(tmp_path,
                                                                             monkeypatch):
    """The kernel's own file unchanged: the cache index no longer serves its compiled code
    once a module of its closure changed, and still does after an edit outside it."""
    ordered_sum(np.ones(9, np.float32))            # compiled or loaded, and in the cache
    assert FunctionCache(ordered_sum.py_func)._cache_file._load_index()
    root = _copy_package(tmp_path)
    _append(root / "rank" / "rerank.py")
    keys = cache.module_keys(str(root))
    monkeypatch.setattr(cache, "_keys", {os.path.join(cache.PACKAGE_ROOT, os.path.relpath(
        p, str(root))): k for p, k in keys.items()})
    assert FunctionCache(ordered_sum.py_func)._cache_file._load_index()
    _append(root / "kernels" / "layers.py")         # expsum imports FASTMATH from it
    keys = cache.module_keys(str(root))
    monkeypatch.setattr(cache, "_keys", {os.path.join(cache.PACKAGE_ROOT, os.path.relpath(
        p, str(root))): k for p, k in keys.items()})
    assert FunctionCache(ordered_sum.py_func)._cache_file._load_index() == {}


def test_a_source_that_does_not_parse_keys_every_kernel_by_the_whole_package(monkeypatch):
    def broken(root=cache.PACKAGE_ROOT):
        raise SyntaxError("a broken file")
    monkeypatch.setattr(cache, "module_keys", broken)
    monkeypatch.setattr(cache, "_keys", None)
    monkeypatch.setattr(cache, "_digest", None)
    assert cache.kernel_key(os.path.join(cache.PACKAGE_ROOT, "kernels", "expsum.py")) \
        == cache.package_digest()


def test_no_kernel_calls_a_function_it_is_given():
    """A jitted function passed as an argument is compiled into its caller from a module the
    caller need not import: no kernel of slide takes one (Numba would also never serve such a
    kernel from the cache to another process: the argument's type is the function object)."""
    found = []
    for name, path in cache.package_modules().items():
        for fn in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if not isinstance(fn, ast.FunctionDef) or not any(
                    "jit" in ast.unparse(d) for d in fn.decorator_list):
                continue
            params = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
            found += [f"{name}.{fn.name}: {c.func.id}()" for c in ast.walk(fn)
                      if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                      and c.func.id in params]
    assert not found, found


def _nested(t):
    yield t
    for attr in ("types", "dtype"):
        sub = getattr(t, attr, None)
        for s in (sub if isinstance(sub, (tuple, list)) else [sub]):
            if isinstance(s, types.Type):
                yield from _nested(s)


@pytest.mark.parametrize("engine", ["batched", "per_sample"])
def test_every_compiled_argument_type_is_keyed(tiny, engine):
    """After a small fit, every type signature of slide's kernels takes no function, and each
    NamedTuple in it is a ``class X(NamedTuple)`` of the package whose layout the keys hold."""
    import slide
    X, Y = tiny[0][:200], tiny[1][:200]
    slide.SlideClassifier(hidden_sizes=(16,), K=4, L=4, range_pow=6, bucket_size=32,
                          sampler_budget=40, min_active=50, shared_negatives=30,
                          batch_size=32, epochs=1, n_threads=1, neighbours=0,
                          engine=engine, random_state=0).fit(X, Y)
    modules, _, sources = cache.import_graph()
    declared = set()
    for name in modules:
        if b"NamedTuple" in sources[name]:
            for n in ast.walk(ast.parse(sources[name])):
                if isinstance(n, ast.ClassDef) and any(map(cache._is_named_tuple_base,
                                                           n.bases)):
                    declared.add(f"{name}.{n.name}")
    bundles, bad = set(), []
    for name, module in list(sys.modules.items()):
        if not name.startswith("slide"):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, CPUDispatcher) and value.__module__ == name:
                for sig in value.signatures:
                    for t in (u for a in sig for u in _nested(a)):
                        if isinstance(t, (types.Dispatcher, types.FunctionType,
                                          types.Function)):
                            bad.append(f"{name}.{attr}: {t}")
                        cls = getattr(t, "instance_class", None)
                        if cls is not None and cls.__module__.startswith("slide"):
                            bundles.add(f"{cls.__module__}.{cls.__qualname__}")
    assert not bad, bad
    assert "slide.kernels.arrays.Touched" in bundles or engine == "per_sample"
    assert bundles and bundles <= declared, bundles - declared
