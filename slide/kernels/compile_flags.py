"""A faster comparison of Numba's compile flags, with the same answers.

While Numba types a kernel, every call to a function it implements by ``@overload``
(``np.empty``, ``min``, an array's methods...) looks up the implementation in a cache keyed by
the argument types and by the flags the kernel is compiled with (a ``TargetConfig``). Those
flags hash alike whatever their values (the hash covers the options' names only), so every
lookup compares the flags of the entries with the same argument types, and Numba's
``__eq__`` builds two dicts of every option's value a comparison. A cold warm-up makes about
half a million of them, some 5 % of its compile (``bench/results/first_fit_debtags.md``,
"Numba's compile flags compared faster").

The comparison here is Numba's, computed from the options a flags object has set: two flags
of one class are equal when every option set on either has the same value on both (an option
not set has its default, as Numba's own comparison reads it). The hash is Numba's value, kept
once a class. ``tests/test_compile_flags.py`` checks both against Numba's own on pairs of
flags. Where Numba's classes are not laid out as expected here (a later version), nothing is
changed.
"""
from numba.core import targetconfig

_NUMBA_EQ = targetconfig.TargetConfig.__eq__
_NUMBA_HASH = targetconfig.TargetConfig.__hash__


def flags_equal(mine, theirs):
    """``mine == theirs`` for two Numba ``TargetConfig`` objects, as Numba answers it."""
    if type(mine) is not type(theirs):
        return _NUMBA_EQ(mine, theirs)
    set_mine, set_theirs = mine._values, theirs._values
    if set_mine == set_theirs:
        return True
    options = type(mine).options
    for name in set_mine.keys() | set_theirs.keys():
        option = options.get(name)
        if option is None:          # not an option of the class: Numba's own comparison
            return _NUMBA_EQ(mine, theirs)
        default = option.default
        if set_mine.get(name, default) != set_theirs.get(name, default):
            return False
    return True


_class_hashes = {}


def flags_hash(flags):
    """``hash(flags)`` as Numba computes it (the hash of its options' names, sorted), kept once
    a class."""
    cls = type(flags)
    h = _class_hashes.get(cls)
    if h is None:
        h = _class_hashes[cls] = hash(tuple(sorted(cls.options)))
    return h


def _laid_out_as_expected():
    """Numba's flags hold their set options in ``_values`` and their options in the class's
    ``options``, and compare and hash with the functions this module replaces."""
    flags = targetconfig.TargetConfig()
    return (isinstance(getattr(flags, "_values", None), dict)
            and hasattr(targetconfig.TargetConfig, "options")
            and _NUMBA_EQ.__qualname__ == "TargetConfig.__eq__"
            and _NUMBA_HASH.__qualname__ == "TargetConfig.__hash__"
            and _NUMBA_HASH(flags) == flags_hash(flags))


def install():
    """Compare and hash Numba's flags with ``flags_equal`` and ``flags_hash`` in this process.
    Returns whether they are installed."""
    config = targetconfig.TargetConfig
    if config.__eq__ is flags_equal:
        return True
    if not _laid_out_as_expected():
        return False
    config.__eq__ = flags_equal
    config.__hash__ = flags_hash
    return True


INSTALLED = install()
