"""A software prefetch for kernels that walk rows scattered over a large array.

The optimizer's row steps (``slide.network.optim``) visit a batch's rows of W and of Adam's two
moments in an order no hardware prefetcher can guess: each row is a few cache lines at a random
place in arrays of hundreds of MB, so the loop waits for DRAM at every row. Asking for the next
row's lines while the current one is computed hides much of that wait (at 200k labels the
first layer's step alone touches thousands of rows of W, M and V a batch). A prefetch is a hint:
it never changes a result.
"""
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from slide.kernels.jit import njit

# floats per 64-byte cache line
LINE = 16


@intrinsic
def prefetch_line(typingctx, arr, idx):
    """llvm.prefetch of the cache line holding arr[idx] (a write is coming, keep it in all
    cache levels); no effect on the program's results, never faults."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 1), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True)
def prefetch_row(arr, start, length):
    """Prefetch arr[start:start + length] (a flat float32 array; an empty ``arr`` is a
    no-op)."""
    if arr.shape[0] == 0:
        return
    for c in range(0, length, LINE):
        prefetch_line(arr, start + c)
