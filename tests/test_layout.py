"""The package layout is the pipeline, and its imports only go down (issue 30).

``LAYERS`` is the order, lowest first: a module may import modules of its own layer or of
any layer below, never above, and the import graph of ``slide`` has no circle. Imports are
read from the source (``ast``), every ``import`` statement, at module level or inside a
function: a deferred import cannot hide a circle here. Function-level imports themselves are
kept for optional dependencies and for the CLI's fast start (below)."""
import ast
import importlib
import os
import subprocess
import sys

import pytest

import slide

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "slide")

# lowest first; a name covers the module and, for a package, everything in it
LAYERS = (
    ("slide.kernels",),                         # @njit over arrays and bundles: numpy, numba
    ("slide.fileio", "slide.params", "slide.defaults", "slide.metrics", "slide.environment"),
    ("slide.data",),                            # input validation, the XC format
    ("slide.labels",),                          # label names <-> column ids (classes_)
    ("slide.synthetic",),
    ("slide.config",),                          # the TOML run configuration
    ("slide.network",),                         # the trainable MLP: Network, trainer, optim
    ("slide.rank",),                            # post-fit stages; they never see Network
    ("slide.persist.archive",),                 # the archive a file is: numpy only
    ("slide.persist.checkpoint",),              # the file format; knows components only
    ("slide.persist.pickling",),                # pickle through the format (the caller's class)
    ("slide.text",),                            # vectorizers in the format (no model class)
    ("slide.warmup",),
    ("slide.sklearn_api",),                     # scikit-learn conventions of the estimators
    ("slide.estimator",),                       # SlideClassifier = Network + RankStack
    ("slide.fused",),                           # K estimators trained in one pass
    ("slide.ensemble", "slide.search"),
    ("slide.distributed",),                     # ShardedSlideClassifier and its shards
    ("slide.persist.models",),                  # load(): the one module knowing the models
    ("slide.cli",),
    ("slide",),                                 # the package's lazy public names
)

# modules imported inside functions, on purpose: optional dependencies (a missing one fails
# only the feature that needs it) and platform modules
OPTIONAL = ("ray", "matplotlib", "resource")
# where function-level imports of anything are the design: the CLI loads the engine only for
# the command that needs it (``slide --help`` does not import Numba; tested below), and the
# run configuration is read by the CLI before any command runs
LAZY_FOR_STARTUP = ("slide.cli", "slide.config")


def _modules():
    """{dotted name: path} of every module of the package."""
    out = {}
    for dirpath, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(dirpath, f)
    return out


MODULES = _modules()


def _layer(name):
    best = None
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if name == prefix or name.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    assert best is not None, f"{name} is in no layer of LAYERS"
    return best[0]


def _imports(path):
    """[(imported slide module, line, inside a function)] of one file."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    local = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                out.append((a.name, n.lineno, id(n) in local))
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            for a in n.names:
                sub = f"{n.module}.{a.name}"
                out.append((sub if sub in MODULES else n.module, n.lineno, id(n) in local))
    return out


def _graph():
    """{module: {imported slide module: line}}."""
    g = {}
    for name, path in MODULES.items():
        g[name] = {}
        for target, line, _ in _imports(path):
            if target.split(".")[0] == "slide" and target != name:
                g[name].setdefault(target, line)
    return g


def test_every_module_is_in_a_layer():
    for name in MODULES:
        _layer(name)


def test_imports_only_go_down():
    up = [f"{name} (line {line}) imports {target}"
          for name, targets in _graph().items() for target, line in targets.items()
          if _layer(target) > _layer(name)]
    assert not up, "upward imports:\n" + "\n".join(up)


def test_the_import_graph_has_no_circle():
    g = _graph()
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in g.get(m, ()):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if t in g and not state.get(t):
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if not state.get(m):
            visit(m)


def test_the_layer_test_sees_an_upward_import_and_a_circle(monkeypatch):
    # the checks above can fail: a fake network module importing the estimator, and a fake
    # pair of kernels importing each other
    fake = {"slide.network.fake": {"slide.estimator": 1}}
    assert any(_layer(t) > _layer(n) for n, ts in fake.items() for t in ts)
    monkeypatch.setattr(sys.modules[__name__], "_graph",
                        lambda: {"slide.kernels.a": {"slide.kernels.b": 1},
                                 "slide.kernels.b": {"slide.kernels.a": 2}})
    with pytest.raises(AssertionError, match="import circle: slide.kernels.a -> "
                                             "slide.kernels.b -> slide.kernels.a"):
        test_the_import_graph_has_no_circle()


def test_function_level_imports_are_optional_dependencies_only():
    found = []
    for name, path in MODULES.items():
        if any(name == p or name.startswith(p + ".") for p in LAZY_FOR_STARTUP):
            continue
        for target, line, inside in _imports(path):
            if inside and target.split(".")[0] not in OPTIONAL:
                found.append(f"{name} line {line}: {target}")
    assert not found, "function-level imports:\n" + "\n".join(found)


def test_kernels_import_only_numpy_numba_and_each_other():
    # (scipy.sparse for the CSR input of a few batch entry points; llvmlite, numba's own code
    # generator, for the prefetch intrinsic; the standard library)
    allowed = ("numpy", "numba", "llvmlite", "scipy", "slide.kernels")
    bad = [f"{name}: {target}" for name, path in MODULES.items()
           if name.startswith("slide.kernels")
           for target, _, _ in _imports(path)
           if target.split(".")[0] not in sys.stdlib_module_names
           and not any(target == a or target.startswith(a + ".") for a in allowed)]
    assert not bad, bad


def test_the_cli_starts_without_the_engine():
    code = ("import sys, slide.cli; bad = [m for m in ('numba', 'slide.estimator', "
            "'slide.network') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_public_names_exist():
    for name in slide.__all__:
        assert getattr(slide, name) is not None, name
    distributed = importlib.import_module("slide.distributed")
    for name in distributed.__all__:
        assert getattr(distributed, name) is not None, name
    assert set(slide.__all__) >= {"kernels", "network", "rank", "persist", "SlideClassifier",
                                  "SlideEnsemble", "load"}


# ---------------------------------------------------------------------------------------------
# function size

MAX_PARAMS = 15
MAX_LINES = 80
# keyword-only constructors that only store their keywords (scikit-learn's convention)
PARAMS_EXEMPT = {("slide.estimator", "SlideClassifier.__init__")}


def _functions(tree):
    """(qualified name, node) of every function, methods as Class.method."""
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, child))
                walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def _n_params(fn):
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return len([n for n in names if n not in ("self", "cls")])


def _oversized(sources):
    """["module.function: why"] of the functions over the bounds in {module: source}."""
    bad = []
    for name, src in sources.items():
        for qual, fn in _functions(ast.parse(src)):
            n_lines = fn.end_lineno - fn.lineno + 1
            if _n_params(fn) > MAX_PARAMS and (name, qual) not in PARAMS_EXEMPT:
                bad.append(f"{name}.{qual}: {_n_params(fn)} parameters")
            if n_lines > MAX_LINES:
                bad.append(f"{name}.{qual}: {n_lines} lines")
    return bad


def test_no_function_is_over_15_parameters_or_80_lines():
    sources = {name: open(path, encoding="utf-8").read() for name, path in MODULES.items()}
    bad = _oversized(sources)
    assert not bad, "\n".join(bad)


def test_the_size_check_sees_a_long_function_and_a_long_signature():
    long_body = "def f(a):\n" + "    a += 1\n" * MAX_LINES + "    return a\n"
    wide = "def g(" + ", ".join(f"p{i}" for i in range(MAX_PARAMS + 1)) + "):\n    pass\n"
    method = "class C:\n    def h(self, " + ", ".join(f"p{i}" for i in range(MAX_PARAMS)) \
        + "):\n        pass\n"
    assert _oversized({"m": long_body + wide + method}) == [
        f"m.f: {MAX_LINES + 2} lines", f"m.g: {MAX_PARAMS + 1} parameters"]
