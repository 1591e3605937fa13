"""Claiming a row's step record atomically: what lets several batches in flight share catch-up
Adam's records without locks.

Catch-up Adam (``slide.network.adam``) records, per row, the last optimizer step that touched
it; a batch at step ``t`` first applies the zero-gradient steps the row missed since its record,
then records ``t``. Read, catch up, write: two batches in flight that touch the same row at once
could both read the same old record and both apply the steps it missed, the row getting them
twice. ``claim_step`` makes the read and the write one atomic exchange (``cmpxchg``), so of two
batches that touch a row only one catches up a given missed step; the weights themselves are
still updated without locks (HOGWILD). With one batch at a time the claim always succeeds at
once and the results are the bits they were.
"""
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from slide.kernels.jit import njit


@intrinsic
def compare_exchange(typingctx, arr, idx, expected, new):
    """Atomically: if ``arr[idx] == expected``, set it to ``new``; return what ``arr[idx]``
    held before (``expected`` when the exchange took place). ``arr``: a C-contiguous 1-D
    integer array; no bounds check (the callers index rows they own)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"
            and isinstance(arr.dtype, types.Integer)):
        return None
    dtype = arr.dtype
    sig = dtype(arr, idx, expected, new)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, signature.args[0], ary, [args[1]],
                                       wraparound=False)
        old = context.cast(builder, args[2], signature.args[2], dtype)
        val = context.cast(builder, args[3], signature.args[3], dtype)
        # the record guards no other memory (the rows are HOGWILD), so the exchange itself is
        # all that must be atomic: monotonic ordering
        pair = builder.cmpxchg(ptr, old, val, "monotonic", "monotonic")
        return builder.extract_value(pair, 0)

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def claim_step(records, i, t):
    """Record step ``t`` for row ``i`` unless a later step has (``records[i] >= t``), in one
    atomic exchange, and return the record it replaced: the steps after it and before ``t``
    are the ones this caller catches up (none where it was ``t`` or later already)."""
    while True:
        last = records[i]
        if last >= t:
            return last
        if compare_exchange(records, i, last, t) == last:
            return last
