"""Data I/O for extreme-classification data sets: the XC / split / libsvm readers and the XC
writer (``slide.data.xc``, over the byte-parser kernels of ``slide.kernels.parse``), validation of
user input, the seeded minibatch order and the label caps (``slide.data.inputs``)."""
from slide.data.inputs import (as_feature_matrix, as_label_matrix, cap_row_labels,
                               iterate_minibatches)
from slide.data.xc import DataFormatError, read_libsvm, read_split, read_xc, write_xc


__all__ = [
    "DataFormatError",
    "read_xc",
    "write_xc",
    "read_split",
    "read_libsvm",
    "as_feature_matrix",
    "as_label_matrix",
    "iterate_minibatches",
    "cap_row_labels",
]
