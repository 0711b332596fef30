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


# Shuffle masks of an 8 × 8 transpose in three stages of two-vector shuffles (the lane
# patterns of AVX's unpacklo/hi, shuffle 0x44/0xEE and permute2f128 0x20/0x31); index k < 8
# picks lane k of the first vector, k >= 8 lane k − 8 of the second.
_INTERLEAVE_LO = (0, 8, 1, 9, 4, 12, 5, 13)
_INTERLEAVE_HI = (2, 10, 3, 11, 6, 14, 7, 15)
_PAIRS_LO = (0, 1, 8, 9, 4, 5, 12, 13)
_PAIRS_HI = (2, 3, 10, 11, 6, 7, 14, 15)
_HALVES_LO = (0, 1, 2, 3, 8, 9, 10, 11)
_HALVES_HI = (4, 5, 6, 7, 12, 13, 14, 15)


@intrinsic
def transpose_block8(
    typingctx, source, source_row, source_col, target, target_row, target_col
):  # pragma: no cover - compiled
    """``target[target_row + k, target_col + l] = source[source_row + l, source_col + k]``
    for ``k, l in 0..7``.

    Copies the 8 × 8 block of ``source`` at (``source_row``, ``source_col``) transposed into
    ``target`` (C-contiguous 2-D arrays of one element type; the same array is fine when the
    two blocks are disjoint): eight vector loads of source rows, 24 lane shuffles, eight
    vector stores of target rows. A plain copy of the values (bit for bit). No bounds check.
    """
    for array in (source, target):
        if not isinstance(array, types.Array) or array.ndim != 2 or array.layout != "C":
            return None
    if source.dtype != target.dtype:
        return None
    signature = types.void(source, source_row, source_col, target, target_row, target_col)

    def codegen(context, builder, sig, args):
        handles = [context.make_array(sig.args[k])(context, builder, args[k]) for k in (0, 3)]
        corners = [context.cast(builder, args[k], sig.args[k], types.intp) for k in (1, 2, 4, 5)]
        element = context.get_data_type(sig.args[0].dtype)
        vector = ir.VectorType(element, 8)
        align = context.get_abi_sizeof(element)
        i32 = ir.IntType(32)

        def row_pointer(which: int, first: ir.Value, k: int, second: ir.Value) -> ir.Value:
            index = builder.add(first, ir.Constant(first.type, k))
            pointer = cgutils.get_item_pointer(
                context,
                builder,
                sig.args[3 * which],
                handles[which],
                [index, second],
                wraparound=False,
            )
            return builder.bitcast(pointer, vector.as_pointer())

        def shuffle(a: ir.Value, b: ir.Value, lanes: tuple[int, ...]) -> ir.Value:
            mask = ir.Constant(ir.VectorType(i32, 8), [i32(lane) for lane in lanes])
            return builder.shuffle_vector(a, b, mask)

        rows = [
            builder.load(row_pointer(0, corners[0], k, corners[1]), align=align) for k in range(8)
        ]
        pairs = []
        for k in range(0, 8, 2):
            pairs.append(shuffle(rows[k], rows[k + 1], _INTERLEAVE_LO))
            pairs.append(shuffle(rows[k], rows[k + 1], _INTERLEAVE_HI))
        quads = []
        for first in (0, 1, 4, 5):
            quads.append(shuffle(pairs[first], pairs[first + 2], _PAIRS_LO))
            quads.append(shuffle(pairs[first], pairs[first + 2], _PAIRS_HI))
        # quads: (0,2 lo), (0,2 hi), (1,3 lo), (1,3 hi), (4,6 lo), (4,6 hi), (5,7 lo), (5,7 hi)
        columns = [shuffle(quads[k], quads[k + 4], _HALVES_LO) for k in range(4)]
        columns += [shuffle(quads[k], quads[k + 4], _HALVES_HI) for k in range(4)]
        for k in range(8):
            builder.store(columns[k], row_pointer(1, corners[2], k, corners[3]), align=align)
        return context.get_dummy_value()

    return signature, codegen
