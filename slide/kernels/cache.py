"""Numba's on-disk cache of slide's kernels, keyed per module by the sources it imports.

Numba keys a cached kernel by the contents of the one file that defines it. But a kernel's
machine code also holds what it calls or inlines from other files: the optimizer's Adam
arithmetic (``slide.network.adam``) inlined into the row steps of ``slide.network.row_steps``,
the samplers' and the layers' helpers in every batch kernel. After an edit to such a file
alone (a ``git pull`` in an editable install, a developer's change), Numba's own keys would
go on serving the old code from the cache, silently.

So every kernel defined in slide is keyed by its own file (as Numba does) and by a digest of
the sources of its module's **import closure**: the module and every slide module it imports,
transitively (``module_closure``). An edit or an upgrade recompiles the kernels whose closure
holds a changed file, and no other: an edit to ``slide/rank/rerank.py`` leaves the network's
kernels cached.

Why the closure holds everything a kernel's code depends on. Numba compiles a kernel from its
Python function and resolves every global name the function uses (a called function, an
inlined one, a constant, a NamedTuple class, a module's attribute) at compile time in the
*defining module's* globals, and freezes it into the machine code. A name in a module's
globals is defined by that module's own source or bound by one of its imports; a callee
found there is compiled the same way from its own module's globals. So whatever a kernel
calls or inlines, at any depth, is defined in a module reachable through import statements
from the kernel's module. The imports are read statically (``ast``) from every statement of
a file, at module level or inside a function, whatever it binds:

- ``import slide.a.b`` counts ``slide``, ``slide.a`` and ``slide.a.b`` (the name bound is
  ``slide``); ``import slide.a.b as m`` counts ``slide.a.b``;
- ``from slide.a import x`` counts ``slide.a.x`` when that is a module, and ``slide.a`` when
  ``x`` is not a module or the package ``slide.a`` binds the name ``x`` itself (or answers
  missing names through a module ``__getattr__``): the value may come from its ``__init__``;
- relative imports are resolved against the importing module's package;
- ``importlib.import_module("slide.a")`` and ``__import__("slide.a")`` with a literal name.

Plus, in every closure, ``slide.kernels`` (its ``__init__``: ``cache``, ``codegen``,
``threads``, ``compile_flags``): the set-up every kernel is compiled under, whichever module
it imports first.

What reaches a kernel as an argument rather than through an import. Numba keys each compiled
signature by its argument types, which covers arrays, scalars and tuples whole, but:

- a NamedTuple bundle is keyed by its class (by name) and its field types, not its field
  names, and a caller may hand a kernel a bundle whose class the kernel's module does not
  import (``slide.kernels.arrays``' bundles reach ``slide.kernels.touched``,
  ``slide.network.adam`` and ``slide.network.row_steps`` so). So every key also holds the
  layout of every NamedTuple class of slide: its module, name and field names in order
  (``bundle_layouts``); reordering two fields of one type recompiles every kernel;
- a jitted function passed as an argument is compiled into the kernel from a module the
  kernel's need not import. Numba keys such an argument's type by the function object of
  the process, so no other process is ever served that entry (it compiles again): never
  stale. No kernel of slide takes one; ``tests/test_kernel_cache.py`` checks both the
  sources and the compiled signatures of a fit's kernels.

What no closure sees: a module imported by a computed name (``import_module(f"slide.{name}")``:
the lazy public names of ``slide`` and ``slide.distributed``; the kernels' modules take
submodules from ``slide``, never those names), and state outside the sources (Numba's version
and the CPU features, which Numba keys its entries by; the threading layer, chosen when the
kernels run).

Computed once per process, at the first kernel the cache serves or stores: every ``.py`` file
under ``slide/`` read and its import lines parsed (the whole file only where a line does not
tell), a few tens of ms. A file that does not parse gives every kernel the digest of the
whole package (``package_digest``), as before closures. This uses Numba's caching internals
(its list of cache locators); where they differ from what is expected here, nothing is
changed and Numba's own keys apply.
"""
import ast
import hashlib
import os
import re

from numba.core import caching

# the package's directory: the files whose kernels take the closure key
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# in every closure: the compile set-up of the process (codegen's CPU features, the threads)
COMPILE_SETUP = "kernels"

# the closure keys of this process, {absolute path of a module: digest}, computed at first use
_keys = None
_digest = None


def _python_files(root):
    """Every ``.py`` file under ``root``, in a fixed order (directories and names sorted)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def package_digest(root=PACKAGE_ROOT):
    """sha256 of every ``.py`` file under ``root``: their paths relative to it and their
    contents, in a fixed order. The key of a slide file that is no module of the import graph
    (none is: a safe fallback)."""
    h = hashlib.sha256()
    for path in _python_files(root):
        h.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
        h.update(b"\0")
    return h.digest()


def package_modules(root=PACKAGE_ROOT):
    """``{dotted module name: path}`` of every ``.py`` file under ``root`` (the package, named
    by its directory): ``slide/kernels/rng.py`` is ``slide.kernels.rng``, a package's
    ``__init__.py`` the package itself."""
    package = os.path.basename(os.path.normpath(root))
    out = {}
    for path in _python_files(root):
        parts = [package] + os.path.relpath(path, root)[:-3].split(os.sep)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_package(path):
    return os.path.basename(path) == "__init__.py"


def _absolute(name, path, level, module):
    """The absolute name of ``from <level dots><module> import``'s source in module ``name``."""
    if not level:
        return module or ""
    parts = name.split(".") if _is_package(path) else name.split(".")[:-1]
    parts = parts[:len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


# a physical line that starts an import statement (at any indentation)
_IMPORT_LINE = re.compile(rb"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import|import)\b.*$", re.M)
# the keyword, once in every import statement (a word: not after a letter, digit or "_")
_IMPORT_WORD = re.compile(rb"import\b")
_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _import_words(source):
    """How many times ``import`` stands as a word in ``source``."""
    return sum(1 for m in _IMPORT_WORD.finditer(source)
               if m.start() == 0 or source[m.start() - 1] not in _WORD_BYTES)


def _statement_at(source, start, end):
    """The source of the logical line starting with the physical line ``source[start:end]``
    (its bracket or backslash continuations added), unindented."""
    text = source[start:end]
    while (text.count(b"(") > text.count(b")") or text.rstrip().endswith(b"\\")) \
            and end < len(source):
        nxt = source.find(b"\n", end + 1)
        nxt = len(source) if nxt < 0 else nxt
        text, end = source[start:nxt], nxt
    return text.lstrip()


def _import_nodes(source, path):
    """``(nodes, literals)``: the ``Import`` / ``ImportFrom`` statements of a file, wherever
    they are, and the module names of its ``import_module("x")`` / ``__import__("x")``
    calls. Fast path: the statements on the lines that start with one, parsed alone; where
    those do not account for every ``import`` keyword of the file (the word in a string or a
    comment, an import after ``try:`` on one line) or the file calls ``import_module``, the
    whole file is parsed instead."""
    if b"import_module" not in source and b"__import__" not in source:
        nodes = []
        for m in _IMPORT_LINE.finditer(source):
            try:
                tree = ast.parse(_statement_at(source, m.start(), m.end()))
            except SyntaxError:
                break
            nodes.extend(n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))
        else:
            if len(nodes) == _import_words(source):
                return nodes, []
    nodes, literals = [], []
    for n in ast.walk(ast.parse(source, filename=path)):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            nodes.append(n)
        else:
            literal = _literal_import(n)
            if literal is not None:
                literals.append(literal)
    return nodes, literals


def _literal_import(node):
    """The module name of ``import_module("x")`` / ``__import__("x")`` with a literal
    argument, else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    arg = node.args[0]
    if fname in ("import_module", "__import__") and isinstance(arg, ast.Constant) \
            and isinstance(arg.value, str):
        return arg.value
    return None


def _other_bindings(name, path, source):
    """The names that package ``name``'s ``__init__`` (its ``source``) binds to anything but
    its own submodule of that name, or None where it defines a module ``__getattr__`` (any
    name may come from it)."""
    names = set()
    for n in ast.walk(ast.parse(source, filename=path)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if n.name == "__getattr__":
                return None
            names.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.Import):
            for a in n.names:
                bound = a.asname or a.name.split(".")[0]
                if a.asname is None or a.name != f"{name}.{bound}":
                    names.add(bound)
        elif isinstance(n, ast.ImportFrom):
            source_module = _absolute(name, path, n.level, n.module)
            for a in n.names:
                bound = a.asname or a.name
                if f"{source_module}.{a.name}" != f"{name}.{bound}":
                    names.add(bound)
    return names


def module_imports(name, path, modules, sources, bindings=None):
    """The modules of ``modules`` that module ``name`` (file ``path``; ``sources``: every
    module's bytes) imports, by the rules of the module docstring. ``bindings`` memoizes
    ``_other_bindings`` of the packages."""
    bindings = {} if bindings is None else bindings
    found = set()

    def other_bindings(package):
        if package not in bindings:
            bindings[package] = _other_bindings(package, modules[package], sources[package])
        return bindings[package]

    def from_import(source, attr):
        sub = f"{source}.{attr}"
        if sub in modules:
            found.add(sub)
            if source in modules and _is_package(modules[source]):
                other = other_bindings(source)
                if other is None or attr in other:
                    found.add(source)
        else:
            found.add(source)

    nodes, literals = _import_nodes(sources[name], path)
    found.update(literals)
    for n in nodes:
        if isinstance(n, ast.Import):
            for a in n.names:
                parts = a.name.split(".")
                for i in range(len(parts) if a.asname else 1, len(parts) + 1):
                    found.add(".".join(parts[:i]))
        else:
            source = _absolute(name, path, n.level, n.module)
            for a in n.names:
                if a.name == "*":
                    found.add(source)
                else:
                    from_import(source, a.name)
    return {m for m in found if m in modules and m != name}


def _is_named_tuple_base(node):
    """Whether a class's base expression names ``NamedTuple`` (``typing.NamedTuple`` too)."""
    return (getattr(node, "id", None) or getattr(node, "attr", None)) == "NamedTuple"


def bundle_layouts(modules, sources):
    """sha256 of the layout of every NamedTuple class of the package: its module, name and
    field names in order (``class X(NamedTuple)``, read with ``ast``); a module that makes one
    otherwise (``namedtuple(...)``, ``NamedTuple("X", ...)``) counts with its whole source."""
    h = hashlib.sha256()
    for name in sorted(modules):
        source = sources[name]
        if b"NamedTuple" not in source and b"namedtuple" not in source:
            continue
        for n in ast.walk(ast.parse(source, filename=modules[name])):
            if isinstance(n, ast.ClassDef) and any(map(_is_named_tuple_base, n.bases)):
                fields = [s.target.id for s in n.body if isinstance(s, ast.AnnAssign)
                          and isinstance(s.target, ast.Name)]
                h.update(f"{name}.{n.name}({','.join(fields)})\n".encode())
            elif isinstance(n, ast.Call) and (getattr(n.func, "id", None)
                                              or getattr(n.func, "attr", None)) in (
                    "namedtuple", "NamedTuple"):
                h.update(f"{name}:".encode() + hashlib.sha256(source).digest() + b"\n")
    return h.digest()


def import_graph(root=PACKAGE_ROOT):
    """``(modules, graph, sources)``: ``package_modules(root)``, ``{module: the modules it
    imports}`` and ``{module: its file's bytes}``."""
    modules = package_modules(root)
    sources = {}
    for name, path in modules.items():
        with open(path, "rb") as f:
            sources[name] = f.read()
    bindings = {}
    graph = {name: module_imports(name, path, modules, sources, bindings)
             for name, path in modules.items()}
    return modules, graph, sources


def module_closure(name, graph):
    """``name`` and every module it reaches in ``graph``, plus the compile set-up's closure
    (``COMPILE_SETUP``), as a sorted tuple."""
    setup = f"{name.split('.')[0]}.{COMPILE_SETUP}"
    seen, todo = set(), [name] + ([setup] if setup in graph else [])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return tuple(sorted(seen))


def closure_digest(closure, modules, sources, root, _entries=None):
    """sha256 of the modules of ``closure``: each one's path relative to ``root`` and the
    sha256 of its contents (``_entries`` memoizes them by module)."""
    h = hashlib.sha256()
    for m in closure:
        entry = None if _entries is None else _entries.get(m)
        if entry is None:
            entry = (os.path.relpath(modules[m], root).encode() + b"\0"
                     + hashlib.sha256(sources[m]).digest())
            if _entries is not None:
                _entries[m] = entry
        h.update(entry)
    return h.digest()


def module_keys(root=PACKAGE_ROOT):
    """``{absolute path of each module under root: its key}``: the digest of its import
    closure and of the package's NamedTuple layouts (``bundle_layouts``)."""
    modules, graph, sources = import_graph(root)
    layouts = bundle_layouts(modules, sources)
    entries = {}
    return {os.path.abspath(path): hashlib.sha256(
                closure_digest(module_closure(name, graph), modules, sources, root, entries)
                + layouts).digest()
            for name, path in modules.items()}


def kernel_key(py_file):
    """The key added to the source stamp of a kernel defined in ``py_file`` (a file of the
    package): its module's closure digest, computed with every other one at first use."""
    global _keys, _digest
    if _keys is None:
        try:
            _keys = module_keys()
        except (OSError, SyntaxError, ValueError, RecursionError):
            _keys = {}      # a source that does not parse: every kernel takes the package's
    key = _keys.get(os.path.abspath(py_file))
    if key is None:     # a file that was no module at first use: the whole package's digest
        if _digest is None:
            _digest = package_digest()
        key = _digest
    return key


def _inside(py_file):
    return os.path.abspath(py_file).startswith(PACKAGE_ROOT + os.sep)


def _closure_keyed(base):
    """A subclass of Numba's locator ``base`` that takes slide's files only and adds the
    digest of each one's import closure to its source stamp."""

    class Locator(base):
        slide_closure_keyed = True

        @classmethod
        def from_function(cls, py_func, py_file):
            if not _inside(py_file):
                return None
            self = super().from_function(py_func, py_file)
            if self is not None:
                self.slide_py_file = py_file
            return self

        def get_source_stamp(self):
            return super().get_source_stamp(), kernel_key(self.slide_py_file)

    Locator.__name__ = Locator.__qualname__ = "ClosureKeyed" + base.__name__
    return Locator


def install():
    """Put the closure-keyed locators first in Numba's list (once); returns whether they are
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
    if any(getattr(c, "slide_closure_keyed", False) for c in current):
        return True
    impl._locator_classes = [_closure_keyed(b) for b in bases] + current
    return True


INSTALLED = install()


def is_compiled(dispatcher):
    """Whether a call of the kernel ``dispatcher`` would find machine code without compiling:
    a signature compiled in this process, or an entry in Numba's cache for its current source
    (a stale or missing index is not). True where Numba's private cache API is not as
    expected, or ``dispatcher`` is no Numba dispatcher (``NUMBA_DISABLE_JIT``): the caller then
    takes the path it takes when compiled."""
    if getattr(dispatcher, "signatures", True):
        return True
    try:
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:   # noqa: BLE001 -- Numba's private cache API: any change means "unknown"
        return True
