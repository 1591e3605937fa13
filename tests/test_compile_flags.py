"""slide.kernels.compile_flags: Numba's compile flags compared and hashed as Numba does."""
import itertools

from numba.core import targetconfig
from numba.core.compiler import Flags

from slide.kernels import compile_flags


def _flags(**options):
    flags = Flags()
    for name, value in options.items():
        setattr(flags, name, value)
    return flags


# unset, set to the default, set to other values; objects with their own equality among them
VARIANTS = [
    {},
    {"nrt": False},                              # the default, set
    {"nrt": True},
    {"nrt": True, "no_cfunc_wrapper": True},
    {"no_cfunc_wrapper": True, "nrt": True},     # the same, set in another order
    {"no_cfunc_wrapper": False},
    {"error_model": "numpy"},
    {"error_model": "python"},                   # the default, set
    {"fastmath": True},
    {"fastmath": {"nnan"}},
    {"inline": "always"},
    {"inline": "never"},                         # the default, set
    {"auto_parallel": True, "nrt": True},
]


def test_the_flags_compare_and_hash_as_numba_compares_and_hashes_them():
    assert compile_flags.INSTALLED
    assert targetconfig.TargetConfig.__eq__ is compile_flags.flags_equal
    equal_pairs = 0
    for a, b in itertools.product(VARIANTS, repeat=2):
        x, y = _flags(**a), _flags(**b)
        numba_says = compile_flags._NUMBA_EQ(x, y)
        assert (x == y) == numba_says, (a, b)
        assert hash(x) == compile_flags._NUMBA_HASH(x)
        equal_pairs += numba_says
    # pairs that differ only in what is set (a default set, another order) are equal
    assert equal_pairs > len(VARIANTS)


def test_other_objects_and_classes_are_left_to_numba():
    assert (_flags() == "Flags()") is False
    assert compile_flags.flags_equal(_flags(), object()) is NotImplemented

    class OtherConfig(targetconfig.TargetConfig):
        nrt = targetconfig.Option(type=bool, default=False, doc="")

    other = OtherConfig()
    assert compile_flags.flags_equal(other, OtherConfig())
    assert (other == _flags()) == compile_flags._NUMBA_EQ(other, _flags())


def test_installing_twice_changes_nothing():
    assert compile_flags.install()
    assert targetconfig.TargetConfig.__eq__ is compile_flags.flags_equal
    assert targetconfig.TargetConfig.__hash__ is compile_flags.flags_hash
