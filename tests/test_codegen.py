"""slide.kernels.codegen: 512-bit vectors on AVX-512 hosts, the user's choice kept."""
import os
import subprocess
import sys

import pytest

from slide.kernels.codegen import WIDE_TUNING_OFF, vector_width, wide_vector_features

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
    for env, wide in (({}, None), ({"SLIDE_VECTOR_WIDTH": "256"}, False)):
        e = {k: v for k, v in os.environ.items() if k != "NUMBA_CPU_FEATURES"}
        e.update(env)
        out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True,
                             text=True, check=True).stdout.split()
        width, tuned = int(out[0]), out[1] == "True"
        assert tuned == (width == 512)
        if wide is False:
            assert width <= 256
    assert vector_width() in (128, 256, 512)
