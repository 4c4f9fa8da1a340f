"""Tensor-core MMA from Numba: inline PTX on a real target, an exact emulation under the simulator.

Kernels call ``to_tf32`` / ``pack_half2`` on their operands and ``mma_tf32_m16n8k8``,
``mma_f16_m16n8k8`` or ``mma_f16_m16n8k16`` with one warp's fragments (float32 accumulators in
all three); the names are bound at import time to the PTX intrinsics or to the emulation, so one
kernel source runs in both places.

Fragment layouts (PTX ISA, ``mma.m16n8k8`` with tf32 inputs), with ``g = lane >> 2`` and
``t = lane & 3``; `LAYOUT_M16N8K8_TF32` holds them as data, and the emulation rebuilds the tiles
from exactly those tables, so a kernel that loads a fragment from the wrong place computes a
wrong product under the simulator as it would on the GPU.
"""
import threading

import numpy as np
from numba import config, cuda

__all__ = ["SIMULATED", "LAYOUT_M16N8K8_TF32", "LAYOUT_M16N8K8_F16", "LAYOUT_M16N8K16_F16",
           "to_tf32", "tf32_round", "mma_tf32_m16n8k8", "pack_half2", "mma_f16_m16n8k8",
           "mma_f16_m16n8k16"]

SIMULATED = bool(config.ENABLE_CUDASIM)


def _fragment_positions(entries):
    """For each lane, the (row, col) of every register, from ``f(g, t) -> (row, col)`` rules."""
    table = np.empty((32, len(entries), 2), dtype=np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for k, rule in enumerate(entries):
            table[lane, k] = rule(g, t)
    return table


#: Register -> tile position of every lane: A (16 x 8, rows x k), B (8 x 8, k x cols) and the
#: accumulator C/D (16 x 8).
LAYOUT_M16N8K8_TF32 = {
    "a": _fragment_positions([lambda g, t: (g, t), lambda g, t: (g + 8, t),
                              lambda g, t: (g, t + 4), lambda g, t: (g + 8, t + 4)]),
    "b": _fragment_positions([lambda g, t: (t, g), lambda g, t: (t + 4, g)]),
    "c": _fragment_positions([lambda g, t: (g, 2 * t), lambda g, t: (g, 2 * t + 1),
                              lambda g, t: (g + 8, 2 * t), lambda g, t: (g + 8, 2 * t + 1)]),
}


#: The fp16 ``mma.m16n8k8``: each 32-bit register holds two halves, listed low half first.
#: A: a0 = (g, 2t), (g, 2t+1); a1 = (g+8, 2t), (g+8, 2t+1). B: b0 = (2t, g), (2t+1, g).
LAYOUT_M16N8K8_F16 = {
    "a": _fragment_positions([lambda g, t: (g, 2 * t), lambda g, t: (g, 2 * t + 1),
                              lambda g, t: (g + 8, 2 * t), lambda g, t: (g + 8, 2 * t + 1)]),
    "b": _fragment_positions([lambda g, t: (2 * t, g), lambda g, t: (2 * t + 1, g)]),
    "c": LAYOUT_M16N8K8_TF32["c"],
}


#: The fp16 ``mma.m16n8k16`` (the SDDMM's: 16 features per step). A: a0 = (g, 2t..2t+1),
#: a1 = (g+8, 2t..2t+1), a2 = (g, 2t+8..2t+9), a3 = (g+8, 2t+8..2t+9); B: b0 = (2t..2t+1, g),
#: b1 = (2t+8..2t+9, g).
LAYOUT_M16N8K16_F16 = {
    "a": _fragment_positions([lambda g, t: (g, 2 * t), lambda g, t: (g, 2 * t + 1),
                              lambda g, t: (g + 8, 2 * t), lambda g, t: (g + 8, 2 * t + 1),
                              lambda g, t: (g, 2 * t + 8), lambda g, t: (g, 2 * t + 9),
                              lambda g, t: (g + 8, 2 * t + 8), lambda g, t: (g + 8, 2 * t + 9)]),
    "b": _fragment_positions([lambda g, t: (2 * t, g), lambda g, t: (2 * t + 1, g),
                              lambda g, t: (2 * t + 8, g), lambda g, t: (2 * t + 9, g)]),
    "c": LAYOUT_M16N8K8_TF32["c"],
}


def tf32_round(x):
    """Round float32 values to tf32 (10 mantissa bits), to nearest with ties away from zero,
    as ``cvt.rna.tf32.f32`` does; NaN and infinity pass through."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), rounded, x)


if not SIMULATED:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def to_tf32(typingctx, x):
        """float32 -> tf32 bit pattern in a 32-bit register (``cvt.rna.tf32.f32``)."""
        sig = types.uint32(types.float32)

        def codegen(context, builder, signature, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), [ir.FloatType()]),
                               "cvt.rna.tf32.f32 $0, $1;", "=r,f")
            return builder.call(asm, args)
        return sig, codegen

    def _mma_signature_and_codegen(instruction, a_registers, b_registers):
        """An mma with 32-bit A and B registers and four float32 accumulators in, four float32
        results out (a tuple), from its PTX mnemonic."""
        n_registers = a_registers + b_registers
        f32, u32 = types.float32, types.uint32
        sig = types.UniTuple(f32, 4)(*([u32] * n_registers + [f32] * 4))
        a_regs = ",".join(f"${4 + k}" for k in range(a_registers))
        b_regs = ",".join(f"${4 + k}" for k in range(a_registers, n_registers))
        c_regs = ",".join(f"${4 + n_registers + k}" for k in range(4))
        template = f"{instruction} {{$0,$1,$2,$3}}, {{{a_regs}}}, {{{b_regs}}}, {{{c_regs}}};"
        constraints = ",".join(["=f"] * 4 + ["r"] * n_registers + ["f"] * 4)

        def codegen(context, builder, signature, args):
            f32_ir, u32_ir = ir.FloatType(), ir.IntType(32)
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([f32_ir] * 4),
                                               [u32_ir] * n_registers + [f32_ir] * 4),
                               template, constraints)
            result = builder.call(asm, args)
            values = [builder.extract_value(result, k) for k in range(4)]
            return context.make_tuple(builder, signature.return_type, values)
        return sig, codegen

    @intrinsic
    def mma_tf32_m16n8k8(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A B + C on one warp: tf32 inputs (4 A, 2 B registers), float32 accumulators."""
        return _mma_signature_and_codegen("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
                                          a_registers=4, b_registers=2)

    @intrinsic
    def pack_half2(typingctx, low, high):
        """Two float32 -> one register of two fp16 (round to nearest), ``low`` in the low half."""
        sig = types.uint32(types.float32, types.float32)

        def codegen(context, builder, signature, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), [ir.FloatType(), ir.FloatType()]),
                               "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f")  # operand a -> high half
            return builder.call(asm, args)
        return sig, codegen

    @intrinsic
    def mma_f16_m16n8k8(typingctx, a0, a1, b0, c0, c1, c2, c3):
        """D = A B + C on one warp: fp16 pairs (2 A, 1 B registers), float32 accumulators."""
        return _mma_signature_and_codegen("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32",
                                          a_registers=2, b_registers=1)

    @intrinsic
    def mma_f16_m16n8k16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A B + C on one warp: fp16 pairs (4 A, 2 B registers), float32 accumulators."""
        return _mma_signature_and_codegen("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                                          a_registers=4, b_registers=2)

else:
    # One fragment store per (block, warp): every lane writes its registers, the block meets
    # at a barrier, each lane rebuilds the tiles and takes its share of D, and a second barrier
    # keeps the store until every lane has read it. mma.sync needs all lanes of a warp to take
    # part, and kernels call it uniformly across the block, so the barriers are met.
    _fragments = {}
    _fragments_lock = threading.Lock()

    # Device functions, so the simulator binds its thread-aware ``cuda`` module in their globals.
    @cuda.jit(device=True)
    def _warp_key():
        tid, dim, block = cuda.threadIdx, cuda.blockDim, cuda.blockIdx
        linear = tid.x + dim.x * (tid.y + dim.y * tid.z)
        return (block.x, block.y, block.z, linear // 32), linear % 32

    def to_tf32(x):
        """float32 -> tf32-rounded float32 (the simulator passes values, not bit patterns)."""
        return np.float32(tf32_round(np.float32(x)))

    @cuda.jit(device=True)
    def _warp_mma(layout, registers, accumulators, tag):
        """Gather the warp's registers, rebuild A, B and C from ``layout``, return this lane's D.

        ``registers`` are this lane's A then B elements (one per layout position).
        """
        key, lane = _warp_key()
        n_a, n_b = layout["a"].shape[1], layout["b"].shape[1]
        with _fragments_lock:
            store = _fragments.setdefault(key + (tag,), np.zeros((32, n_a + n_b + 4), np.float32))
        store[lane] = tuple(registers) + tuple(accumulators)
        cuda.syncthreads()
        depth = layout["b"][..., 0].max() + 1  # the reduction extent k
        tiles = {"a": np.zeros((16, depth), np.float32), "b": np.zeros((depth, 8), np.float32),
                 "c": np.zeros((16, 8), np.float32)}
        columns = {"a": slice(0, n_a), "b": slice(n_a, n_a + n_b), "c": slice(n_a + n_b, None)}
        for name, tile in tiles.items():
            positions = layout[name]
            tile[positions[..., 0], positions[..., 1]] = store[:, columns[name]]
        d = (tiles["a"].astype(np.float64) @ tiles["b"].astype(np.float64)
             + tiles["c"]).astype(np.float32)
        cuda.syncthreads()
        return tuple(d[row, col] for row, col in layout["c"][lane])

    @cuda.jit(device=True)
    def mma_tf32_m16n8k8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """Emulated warp MMA with the layouts of `LAYOUT_M16N8K8_TF32`."""
        return _warp_mma(LAYOUT_M16N8K8_TF32, (a0, a1, a2, a3, b0, b1), (c0, c1, c2, c3), "tf32")

    @cuda.jit(device=True)
    def pack_half2(low, high):
        """Two float32 -> a pair of fp16 values (the simulator passes values, not bits)."""
        return (np.float16(low), np.float16(high))

    @cuda.jit(device=True)
    def mma_f16_m16n8k8(a0, a1, b0, c0, c1, c2, c3):
        """Emulated warp MMA with the layouts of `LAYOUT_M16N8K8_F16`, fp32 accumulation."""
        return _warp_mma(LAYOUT_M16N8K8_F16, (a0[0], a0[1], a1[0], a1[1], b0[0], b0[1]),
                         (c0, c1, c2, c3), "f16")

    @cuda.jit(device=True)
    def mma_f16_m16n8k16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """Emulated warp MMA with the layouts of `LAYOUT_M16N8K16_F16`, fp32 accumulation."""
        return _warp_mma(LAYOUT_M16N8K16_F16, (a0[0], a0[1], a1[0], a1[1], a2[0], a2[1], a3[0],
                                               a3[1], b0[0], b0[1], b1[0], b1[1]),
                         (c0, c1, c2, c3), "f16k16")
