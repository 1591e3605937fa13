"""slide.kernels.codegen: 512-bit vectors on AVX-512 hosts, the user's choice kept."""
import os
import subprocess
import sys

import pytest

from slide.kernels.codegen import (SLIDE_FEATURES, WIDE_TUNING_OFF, vector_width,
                                   wide_vector_features)

AVX512 = "+64bit,+avx,+avx2,+avx512f,+fma,+sse"
AVX2 = "+64bit,+avx,+avx2,-avx512f,+fma,+sse"


def test_avx512_host_gets_the_tuning_turned_off():
    f = wide_vector_features({}, "x86_64", AVX512)
    assert f.split(",")[:-1] == AVX512.split(",")
    assert f.endswith("," + WIDE_TUNING_OFF)


def test_left_alone_without_avx512_or_off_x86():
    assert wide_vector_features({}, "x86_64", AVX2) is None
    assert wide_vector_features({}, "aarch64", "+neon,+avx512f") is None


def test_user_choices_are_kept():
    assert wide_vector_features({"NUMBA_CPU_FEATURES": "+sse"}, "x86_64", AVX512) is None
    # slide's own value, inherited from a parent process, is not a user's choice
    assert wide_vector_features({"NUMBA_CPU_FEATURES": "+sse", SLIDE_FEATURES: "+sse"},
                                "x86_64", AVX512) is not None
    assert wide_vector_features({"SLIDE_VECTOR_WIDTH": "256"}, "x86_64", AVX512) is None
    assert wide_vector_features({"SLIDE_VECTOR_WIDTH": "512"}, "x86_64", AVX512) is not None
    with pytest.raises(ValueError, match="SLIDE_VECTOR_WIDTH='128'"):
        wide_vector_features({"SLIDE_VECTOR_WIDTH": "128"}, "x86_64", AVX512)


def test_a_process_compiles_with_the_width_it_reports():
    # a fresh process: numba imported first (as a user's script would), then slide's kernels
    code = ("import numba, slide.kernels\n"
            "from numba.core.registry import cpu_target\n"
            "from slide.kernels.codegen import vector_width\n"
            "tm = cpu_target.target_context.codegen()._tm_features\n"
            "print(vector_width(), tm.endswith('-prefer-256-bit'))\n")
    host_wide = wide_vector_features({}) is not None       # this host: AVX-512 x86-64?
    mine = wide_vector_features({}) or "+sse"
    cases = [({}, host_wide),
             ({"SLIDE_VECTOR_WIDTH": "256"}, False),
             # the environment a parent process's slide left: its own choice, revisable
             ({"NUMBA_CPU_FEATURES": mine, SLIDE_FEATURES: mine, "SLIDE_VECTOR_WIDTH": "256"},
              False),
             ({"NUMBA_CPU_FEATURES": mine, SLIDE_FEATURES: mine}, host_wide),
             # the user's own features stay whatever slide would pick
             ({"NUMBA_CPU_FEATURES": mine, "SLIDE_VECTOR_WIDTH": "256"}, host_wide)]
    for env, wide in cases:
        e = {k: v for k, v in os.environ.items()
             if k not in ("NUMBA_CPU_FEATURES", SLIDE_FEATURES, "SLIDE_VECTOR_WIDTH")}
        e.update(env)
        out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True,
                             text=True, check=True).stdout.split()
        width, tuned = int(out[0]), out[1] == "True"
        assert tuned == (width == 512) == wide, env
    assert vector_width() in (128, 256, 512)


def test_every_kernel_is_built_without_a_c_callable_wrapper():
    """Every Numba kernel of slide's modules takes ``slide.kernels.jit.njit`` (no cfunc
    wrapper: dead code slide never calls, ~5 % of a cold compile), and a compiled kernel's
    library then holds no such wrapper."""
    import importlib

    import numpy as np
    from numba.core.registry import CPUDispatcher

    from slide.kernels import cache
    from slide.kernels.expsum import ordered_sum

    kernels, with_wrapper = 0, []
    for name in cache.package_modules():
        if name.endswith("__main__"):   # runs the command line when imported
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:         # an optional dependency (Ray) that is not installed
            continue
        for attr, value in vars(module).items():
            if isinstance(value, CPUDispatcher) and value.__module__ == name:
                kernels += 1
                if not value.targetoptions.get("no_cfunc_wrapper"):
                    with_wrapper.append(f"{name}.{attr}")
    assert kernels > 150 and not with_wrapper, (kernels, with_wrapper)
    ordered_sum(np.ones(5, np.float32))
    cres = ordered_sum.overloads[ordered_sum.signatures[0]]
    assert cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name) != 0
    assert cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name) == 0
