"""Low-level numba intrinsics."""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic


@intrinsic
def prefetch(typingctx, array, index):  # pragma: no cover - compiled
    """Hint the CPU to start loading ``array[index]`` into cache (``llvm.prefetch``, read).

    No effect on results; used where a loop's future addresses are known but
    not contiguous (the hardware prefetcher cannot guess them). No bounds check.
    """
    signature = types.void(array, index)

    def codegen(context, builder, sig, args):
        array_type = sig.args[0]
        handle = context.make_array(array_type)(context, builder, args[0])
        pointer = cgutils.get_item_pointer(
            context, builder, array_type, handle, [args[1]], wraparound=False
        )
        byte_pointer = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        function = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32]),
            "llvm.prefetch.p0",
        )
        # read (0), high temporal locality (3), data cache (1)
        builder.call(function, [builder.bitcast(pointer, byte_pointer), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return signature, codegen
