"""``slide.show_versions`` / ``slide info``: what a run's speed depends on, and the advice."""
import io
import json

import numba
import numpy as np

import slide
from slide import environment
from slide.cli.main import main


def test_system_info_reports_the_blas_kernels_this_process_runs():
    from threadpoolctl import threadpool_info
    info = environment.system_info()
    assert info["numpy"] == np.__version__ and info["numba"] == numba.__version__
    assert info["numba_threads"] == numba.get_num_threads()
    assert info["vector_width"] in (128, 256, 512)
    loaded = {(d["internal_api"], d["version"], d.get("architecture"))
              for d in threadpool_info() if d["user_api"] == "blas"}
    # scipy's OpenBLAS (the one the products call) is among them
    assert loaded and {(b["library"], b["version"], b["kernel"]) for b in info["blas"]} == loaded


def test_the_cpu_target_names_the_generation_numba_compiles_for(monkeypatch):
    import llvmlite.binding as ll
    monkeypatch.delenv("NUMBA_CPU_NAME", raising=False)
    assert environment.system_info()["cpu_target"] == ll.get_host_cpu_name()
    monkeypatch.setenv("NUMBA_CPU_NAME", "znver3")       # the user's target, not the host's
    assert environment.system_info()["cpu_target"] == "znver3"
    assert any(line.startswith("cpu_target:") and "znver3" in line
               for line in environment.format_info(environment.system_info()))


def test_a_pinned_openblas_kernel_gets_a_note(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    info = environment.system_info()
    assert info["openblas_coretype"] == "Haswell"
    assert any("OPENBLAS_CORETYPE=Haswell" in n for n in info["notes"])
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    info = environment.system_info()
    assert info["openblas_coretype"] is None
    assert not any("OPENBLAS_CORETYPE" in n for n in info["notes"])


def test_a_threading_layer_other_than_tbb_gets_a_note():
    base = {"openblas_coretype": None, "numba_threads": 4}
    assert environment.notes(dict(base, threading_layer="tbb")) == []
    assert environment.notes(dict(base, threading_layer="tbb (not started yet)")) == []
    assert "TBB" in environment.notes(dict(base, threading_layer="omp"))[0]
    assert environment.notes(dict(base, threading_layer="omp", numba_threads=1)) == []


def test_show_versions_prints_every_field():
    out = io.StringIO()
    slide.show_versions(file=out)
    text = out.getvalue()
    for key in ("slide:", "numpy:", "numba:", "threading_layer:", "vector_width:", "blas:",
                "OPENBLAS_CORETYPE:"):
        assert key in text, key


def test_cli_info_json(capsys, monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["openblas_coretype"] == "Haswell" and info["blas"] and info["notes"]
    assert main(["info"]) == 0
    assert "note: OPENBLAS_CORETYPE=Haswell" in capsys.readouterr().out
