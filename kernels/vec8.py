"""Two 8-lane vector loops for the CPU twins, written as LLVM IR: a dot product and an axpy (acc += w x).

Why by hand: an attention head is a short vector (D = 48 or 64). LLVM's loop vectoriser takes 32 floats per
iteration (8 lanes, interleaved 4 times) and runs what is left over one float at a time, so at D = 48 a third of
every dot product went scalar; numba leaves the SLP vectoriser off. These loops take 8 floats per step whatever
D is, and the caller adds the last D % 8 in order. The second operand may be int8 (an int8 KV pool): it is
converted to float32 in the vector registers (sitofp), so dequantizing costs no loop of its own.

    dot8(a, i, b, j, steps) -> float32   sum over k < 8 * steps of a.flat[i + k] b.flat[j + k]: lane l sums
                                         k = l, l + 8, ... in order with fma, then the lanes add in the fixed
                                         tree ((0+1)+(2+3))+((4+5)+(6+7))
    axpy8(w, b, j, acc, i, steps)        acc.flat[i + k] = fma(w, b.flat[j + k], acc.flat[i + k]), k < 8 * steps

dot_plain and axpy_plain, at the end, are the same two loops written plainly, one element at a time, k in
order: read them first; the tests compare the vector code with them.

They take whole C-contiguous arrays and flat offsets, not row views: numba counts references to a view's
parent atomically, and views made per position and head in a prange had both threads fighting over one
counter's cache line. Both are one fixed order (no reassociation), so a result never depends on what else
runs. No bounds checks: the caller keeps the offsets in range.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

LANES = 8
I64 = ir.IntType(64)
VF = ir.VectorType(ir.FloatType(), LANES)


def _vector_args(*arrays) -> bool:
    """a float32 C-contiguous array, then float32 or int8 ones."""
    ok = all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)
    return ok and arrays[0].dtype == types.float32 and all(a.dtype in (types.float32, types.int8) for a in arrays)


def _load(builder, context, ty, value, off):
    """8 elements of C-contiguous array `value` (numba type `ty`) from flat index off, as <8 x float>."""
    data = context.make_array(ty)(context, builder, value).data
    int8 = ty.dtype == types.int8
    vec = ir.VectorType(ir.IntType(8), LANES) if int8 else VF
    v = builder.load(builder.bitcast(builder.gep(data, [off]), vec.as_pointer()), align=1 if int8 else 4)
    return builder.sitofp(v, VF) if int8 else v


def _loop(builder, steps, n_carried):
    """Open `for k in range(steps)` carrying n_carried <8 x float> values from zero: returns (k, carried phis,
    close) where close(new values) ends the loop body and returns the values after the loop."""
    zero = ir.Constant(VF, [0.0] * LANES)
    entry, loop, done = builder.block, builder.append_basic_block("loop8"), builder.append_basic_block("done8")
    builder.cbranch(builder.icmp_signed(">", steps, ir.Constant(I64, 0)), loop, done)
    builder.position_at_end(loop)
    k = builder.phi(I64)
    carried = [builder.phi(VF) for _ in range(n_carried)]

    def close(new):
        k1 = builder.add(k, ir.Constant(I64, 1))
        builder.cbranch(builder.icmp_signed("<", k1, steps), loop, done)
        k.add_incoming(ir.Constant(I64, 0), entry)
        k.add_incoming(k1, loop)
        builder.position_at_end(done)
        after = []
        for phi, v in zip(carried, new):
            phi.add_incoming(zero, entry)
            phi.add_incoming(v, loop)
            out = builder.phi(VF)
            out.add_incoming(zero, entry)
            out.add_incoming(v, loop)
            after.append(out)
        return after
    return k, carried, close


def _fma(builder):
    return builder.module.declare_intrinsic("llvm.fma.v8f32", fnty=ir.FunctionType(VF, [VF] * 3))


@intrinsic
def dot8(typingctx, a, i, b, j, steps):
    if not _vector_args(a, b):
        return None

    def codegen(context, builder, signature, args):
        k, (acc,), close = _loop(builder, args[4], 1)
        off = builder.mul(k, ir.Constant(I64, LANES))
        va = _load(builder, context, signature.args[0], args[0], builder.add(args[1], off))
        vb = _load(builder, context, signature.args[2], args[2], builder.add(args[3], off))
        (total,) = close([builder.call(_fma(builder), [va, vb, acc])])
        e = [builder.extract_element(total, ir.Constant(ir.IntType(32), lane)) for lane in range(LANES)]

        def add(x, y):           # a flag of its own: numba's fastmath pass gives flagless fadds reassociation
            return builder.fadd(x, y, flags=("nsz",))
        return add(add(add(e[0], e[1]), add(e[2], e[3])), add(add(e[4], e[5]), add(e[6], e[7])))
    return types.float32(a, types.intp, b, types.intp, types.intp), codegen


@intrinsic
def axpy8(typingctx, w, b, j, acc, i, steps):
    if not (_vector_args(acc, b) and acc.dtype == types.float32 and isinstance(w, types.Float)):
        return None

    def codegen(context, builder, signature, args):
        wv = builder.fptrunc(args[0], ir.FloatType()) if signature.args[0] == types.float64 else args[0]
        splat = builder.insert_element(ir.Constant(VF, ir.Undefined), wv, ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(splat, ir.Constant(VF, ir.Undefined), ir.Constant(ir.VectorType(
            ir.IntType(32), LANES), [0] * LANES))
        k, _, close = _loop(builder, args[5], 0)
        off = builder.mul(k, ir.Constant(I64, LANES))
        vb = _load(builder, context, signature.args[1], args[1], builder.add(args[2], off))
        data = context.make_array(signature.args[3])(context, builder, args[3]).data
        ptr = builder.bitcast(builder.gep(data, [builder.add(args[4], off)]), VF.as_pointer())
        builder.store(builder.call(_fma(builder), [splat, vb, builder.load(ptr, align=4)]), ptr, align=4)
        close([])
        return context.get_dummy_value()
    return types.void(w, b, types.intp, acc, types.intp, types.intp), codegen


# ----------------------------------------------------------------------------- the same loops, plainly

@njit(cache=True)
def dot_plain(a, i, b, j, steps):
    """What dot8(a, i, b, j, steps) computes, as a plain loop: sum over k < 8 * steps of a.flat[i + k] b.flat[j + k],
    k in order (one chain, where dot8 keeps 8 lane sums and adds them in a tree), b converted to float32."""
    af, bf = a.reshape(a.size), b.reshape(b.size)       # flat views of the C-contiguous arrays
    acc = np.float32(0.0)
    for k in range(LANES * steps):
        acc += af[i + k] * np.float32(bf[j + k])
    return acc


@njit(cache=True)
def axpy_plain(w, b, j, acc, i, steps):
    """What axpy8(w, b, j, acc, i, steps) computes, as a plain loop: acc.flat[i + k] += w b.flat[j + k] for
    k < 8 * steps, in float32 (a multiply, then an add: two roundings where axpy8's fma has one)."""
    bf, af = b.reshape(b.size), acc.reshape(acc.size)   # flat views; af writes through to acc
    wf = np.float32(w)
    for k in range(LANES * steps):
        af[i + k] = af[i + k] + wf * np.float32(bf[j + k])
