"""slide: CPU training of extreme-classification networks with LSH-sampled sparse layers.

Public names are loaded lazily (PEP 562) so that ``import slide`` and the CLI start fast and
Numba kernels are compiled (or loaded from cache) only when first used.
"""
from importlib import import_module


__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "read_xc": "slide.data",
    "write_xc": "slide.data",
    "read_split": "slide.data",
    "read_libsvm": "slide.data",
    "iterate_minibatches": "slide.data",
    "DataFormatError": "slide.data",
    "generate": "slide.synthetic",
    "PRESETS": "slide.synthetic",
    "SlideClassifier": "slide.estimator",
    "SlideEnsemble": "slide.ensemble",
    "SlideSearch": "slide.search",
    "load": "slide.persist.models",
    "save": "slide.text",
    "show_versions": "slide.environment",
}
_SUBMODULES = {"kernels", "network", "rank", "persist", "estimator", "ensemble", "distributed",
               "data", "synthetic", "metrics", "params", "config", "cli", "labels", "text",
               "fused", "search"}

__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = import_module(f"slide.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'slide' has no attribute {name!r}")


def __dir__():
    return __all__
