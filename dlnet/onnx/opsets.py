"""ONNX handlers per (op_type, since_version). They build IR only; numbers are computed by folding.

`@handler("Relu", 6, 13, 14)` registers one function for every listed schema version whose semantics it covers:
a version bump that only added types is listed with the same function; one that changed meaning gets its own.
"""
import numpy as np

from ..errors import ModelError

HANDLERS = {}


def handler(op_type, *versions):
    def deco(fn):
        for v in versions:
            HANDLERS.setdefault(op_type, {})[v] = fn
        return fn
    return deco


def const(v, what):
    if v is None or v.const is None:
        raise ModelError(f"{what} must be a constant (computed at load time); dynamic values are not supported")
    return v.const


def reshape(b, x, shape):
    shape = tuple(int(d) for d in shape)
    return x if x.shape == shape else b.op("Reshape", [x], {"shape": shape})


def norm_axis(axis, rank):
    if not -rank <= axis < max(rank, 1):
        raise ModelError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


# ---------------------------------------------------------------- elementwise -------------------------------------
UNARY = {  # op_type: (IR op, versions)
    "Relu": (1, 6, 13, 14), "Sigmoid": (1, 6, 13), "Tanh": (1, 6, 13), "Exp": (1, 6, 13), "Log": (1, 6, 13),
    "Sqrt": (1, 6, 13), "Abs": (1, 6, 13), "Neg": (1, 6, 13), "Reciprocal": (1, 6, 13), "Floor": (1, 6, 13),
    "Ceil": (1, 6, 13), "Erf": (9, 13), "Sign": (9, 13), "Sin": (7, 22), "Cos": (7, 22), "Tan": (7, 22), "Asin": (7, 22),
    "Acos": (7, 22), "Atan": (7, 22), "Sinh": (9, 22), "Cosh": (9, 22), "Asinh": (9, 22), "Acosh": (9, 22), "Atanh": (9, 22),
    "Round": (11, 22), "Not": (1,), "IsNaN": (9, 13, 20), "Softsign": (1, 22), "Softplus": (1, 22), "HardSwish": (14, 22),
}
UNARY_ATTR = {  # ops with attributes that keep their ONNX names
    "LeakyRelu": (1, 6, 16), "Elu": (1, 6, 22), "Selu": (1, 6, 22), "HardSigmoid": (1, 6, 22), "Celu": (12, 28),
    "ThresholdedRelu": (10, 22), "Shrink": (9,), "IsInf": (10, 20),
}


def _unary(imp, node, xs, at):
    at = {k: v for k, v in at.items() if k != "consumed_inputs"}
    return [imp.b.op(node.op_type, [xs[0]], at)]


for _op, _vs in {**UNARY, **UNARY_ATTR}.items():
    handler(_op, *_vs)(_unary)


def _legacy_broadcast(imp, a, bv, at):
    """Op-sets < 7: `broadcast=1` with `axis` aligns B's dims at `axis` of A (no numpy broadcasting)."""
    if at.get("broadcast", 0) and bv.rank < a.rank:
        axis = at.get("axis", a.rank - bv.rank)
        axis = axis % a.rank
        shape = (1,) * axis + bv.shape + (1,) * (a.rank - axis - bv.rank)
        return reshape(imp.b, bv, shape)
    return bv


BINARY = {"Add": (1, 6, 7, 13, 14), "Sub": (1, 6, 7, 13, 14), "Mul": (1, 6, 7, 13, 14), "Div": (1, 6, 7, 13, 14),
          "Equal": (1, 7, 11, 13, 19), "Less": (1, 7, 9, 13), "Greater": (1, 7, 9, 13), "LessOrEqual": (12, 16),
          "GreaterOrEqual": (12, 16), "And": (1, 7), "Or": (1, 7), "Xor": (1, 7), "PRelu": (1, 6, 7, 9, 16),
          "BitShift": (11, 28), "Mod": (10, 13, 28)}


@handler("Add", *BINARY["Add"])
@handler("Sub", *BINARY["Sub"])
@handler("Mul", *BINARY["Mul"])
@handler("Div", *BINARY["Div"])
@handler("Equal", *BINARY["Equal"])
@handler("Less", *BINARY["Less"])
@handler("Greater", *BINARY["Greater"])
@handler("LessOrEqual", *BINARY["LessOrEqual"])
@handler("GreaterOrEqual", *BINARY["GreaterOrEqual"])
@handler("And", *BINARY["And"])
@handler("Or", *BINARY["Or"])
@handler("Xor", *BINARY["Xor"])
@handler("BitShift", *BINARY["BitShift"])
@handler("Mod", *BINARY["Mod"])
def _binary(imp, node, xs, at):
    a, bv = xs
    bv = _legacy_broadcast(imp, a, bv, at)
    keep = {k: v for k, v in at.items() if k in ("direction", "fmod")}
    return [imp.b.op(node.op_type, [a, bv], keep)]


@handler("PRelu", *BINARY["PRelu"])
def _prelu(imp, node, xs, at):
    x, slope = xs
    if slope.rank == 1 and x.rank > 2 and slope.shape[0] == x.shape[1] and slope.shape[0] != x.shape[-1]:
        slope = reshape(imp.b, slope, (slope.shape[0],) + (1,) * (x.rank - 2))  # op-set < 7 channel slopes
    return [imp.b.op("PRelu", [x, slope])]


@handler("Pow", 1, 7, 12, 13, 15)
def _pow(imp, node, xs, at):
    x, y = xs
    if x.dtype != y.dtype:
        y = imp.b.op("Cast", [y], {"to": x.dtype})
    return [imp.b.op("Pow", [x, y])]


@handler("Sum", 1, 6, 8, 13)
@handler("Max", 1, 6, 8, 12, 13)
@handler("Min", 1, 6, 8, 12, 13)
@handler("Mean", 1, 6, 8, 13)
def _variadic(imp, node, xs, at):
    op = {"Sum": "Add", "Mean": "Add"}.get(node.op_type, node.op_type)
    y = xs[0]
    for x in xs[1:]:
        y = imp.b.op(op, [y, x])
    if node.op_type == "Mean" and len(xs) > 1:
        y = imp.b.op("Div", [y, imp.b.const(np.asarray(len(xs), y.dtype))])
    if len(xs) == 1:
        y = imp.b.op("Identity", [y])
    return [y]


@handler("Clip", 1, 6)
def _clip_6(imp, node, xs, at):  # op-set < 11: min and max are attributes
    return [imp.b.op("Clip", [xs[0]], {"min": at.get("min", -3.4028234663852886e38),
                                        "max": at.get("max", 3.4028234663852886e38)})]


@handler("Clip", 11, 12, 13)
def _clip_11(imp, node, xs, at):  # op-set >= 11: min and max are optional inputs
    x = xs[0]
    lo = xs[1] if len(xs) > 1 else None
    hi = xs[2] if len(xs) > 2 else None
    constant = (lo is None or lo.const is not None) and (hi is None or hi.const is not None)
    if constant and x.dtype in ("float32", "float64", "float16"):  # one pointwise op with the bounds as literals
        attrs = {}
        if lo is not None:
            attrs["min"] = float(lo.const)
        if hi is not None:
            attrs["max"] = float(hi.const)
        return [imp.b.op("Clip", [x], attrs)]
    y = x  # runtime bounds, or integers: Max then Min
    if lo is not None:
        y = imp.b.op("Max", [y, lo])
    if hi is not None:
        y = imp.b.op("Min", [y, hi])
    return [y]


@handler("Where", 9, 16)
def _where(imp, node, xs, at):
    return [imp.b.op("Where", xs)]


@handler("Cast", 1, 6, 9, 13, 19, 21, 23, 24, 25, 28)  # later versions add types (float8, int4, ...)
def _cast(imp, node, xs, at):
    from .importer import onnx_dtype
    to = at["to"]
    to = onnx_dtype(to) if isinstance(to, int) else str(to).lower()
    return [imp.b.op("Cast", [xs[0]], {"to": to})]


@handler("Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25)
def _identity(imp, node, xs, at):
    return [xs[0]]


@handler("Dropout", 1, 6, 7, 10, 12, 13, 22)
def _dropout(imp, node, xs, at):
    # inference: identity. The optional mask output (op-set >= 7) is all ones.
    x = xs[0]
    if getattr(imp, "training", False):
        from ..graph.ops.grad_nn import dropout_training
        return dropout_training(imp, node, xs, at)
    training = xs[2] if len(xs) > 2 and xs[2] is not None else None
    ratio = xs[1] if len(xs) > 1 and xs[1] is not None else None
    if training is not None:
        const(training, "Dropout's training_mode")
        if bool(training.const) and ratio is not None:
            const(ratio, "Dropout's ratio in training mode")
    zero_ratio = ratio is not None and float(ratio.const) == 0.0 if ratio is not None and ratio.const is not None \
        else False
    if training is not None and bool(training.const) and not zero_ratio:
        raise ModelError("Dropout with training_mode (random masks) is not supported; inference is identity")
    outs = [x]
    if len(node.output) > 1 and node.output[1]:
        outs.append(imp.b.const(np.ones(x.shape, bool)))
    return outs


# ---------------------------------------------------------------- constants and shapes ----------------------------
@handler("Constant", 1, 9, 11, 12, 13, 19, 21, 23, 24, 25)
def _constant(imp, node, xs, at):
    if "value" in at:
        return [imp.b.const(at["value"])]
    for key, dt in (("value_float", np.float32), ("value_int", np.int64)):
        if key in at:
            return [imp.b.const(np.asarray(at[key], dt))]
    for key, dt in (("value_floats", np.float32), ("value_ints", np.int64)):
        if key in at:
            return [imp.b.const(np.asarray(at[key], dt))]
    raise ModelError(f"Constant without a supported value attribute ({sorted(at)})")


@handler("ConstantOfShape", 9, 20, 21, 23, 24, 25)
def _constant_of_shape(imp, node, xs, at):
    shape = const(xs[0], "ConstantOfShape's shape").astype(np.int64)
    value = at.get("value", np.zeros(1, np.float32))
    return [imp.b.const(np.full(tuple(shape), value.reshape(-1)[0], value.dtype))]


@handler("Shape", 1, 13)
def _shape_1(imp, node, xs, at):
    return [imp.b.const(np.asarray(xs[0].shape, np.int64))]


@handler("Shape", 15, 19, 21, 23, 24, 25)
def _shape_15(imp, node, xs, at):  # op-set 15 adds start/end
    s = xs[0].shape
    return [imp.b.const(np.asarray(s[at.get("start", 0):at.get("end", len(s))], np.int64))]


@handler("Size", 1, 13, 19, 21, 23, 24, 25)
def _size(imp, node, xs, at):
    return [imp.b.const(np.asarray(xs[0].size, np.int64))]


@handler("Reshape", 1)
def _reshape_1(imp, node, xs, at):  # op-set 1: shape is an attribute
    return [_reshape(imp, xs[0], np.asarray(at["shape"], np.int64), 0)]


@handler("Reshape", 5, 13)
def _reshape_5(imp, node, xs, at):
    return [_reshape(imp, xs[0], const(xs[1], "Reshape's shape"), 0)]


@handler("Reshape", 14, 19, 21, 23, 24, 25)
def _reshape_14(imp, node, xs, at):  # op-set 14 adds allowzero
    return [_reshape(imp, xs[0], const(xs[1], "Reshape's shape"), at.get("allowzero", 0))]


def _reshape(imp, x, shape, allowzero):
    shape = [int(d) for d in shape]
    out = []
    for i, d in enumerate(shape):
        out.append(x.shape[i] if d == 0 and not allowzero else d)
    if out.count(-1) > 1:
        raise ModelError(f"Reshape to {shape}: more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        out[out.index(-1)] = x.size // known if known else 0
    return reshape(imp.b, x, out)


@handler("Flatten", 1, 9, 11, 13, 21, 23, 24, 25)
def _flatten(imp, node, xs, at):
    x = xs[0]
    axis = at.get("axis", 1)
    axis = axis % x.rank if axis < 0 else axis
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [reshape(imp.b, x, (outer, x.size // outer if outer else 0))]


def _squeeze(imp, x, axes):
    axes = [norm_axis(a, x.rank) for a in axes] if axes is not None else [i for i, d in enumerate(x.shape) if d == 1]
    for a in axes:
        if x.shape[a] != 1:
            raise ModelError(f"Squeeze axis {a} has size {x.shape[a]}, expected 1")
    return reshape(imp.b, x, [d for i, d in enumerate(x.shape) if i not in axes])


def _unsqueeze(imp, x, axes):
    rank = x.rank + len(axes)
    axes = sorted(norm_axis(a, rank) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(imp.b, x, shape)


@handler("Squeeze", 1, 11)
def _squeeze_1(imp, node, xs, at):  # axes attribute (negative allowed from 11)
    return [_squeeze(imp, xs[0], at.get("axes"))]


@handler("Squeeze", 13, 21, 23, 24, 25)
def _squeeze_13(imp, node, xs, at):  # op-set 13: axes moved to an optional input
    axes = const(xs[1], "Squeeze's axes").tolist() if len(xs) > 1 and xs[1] is not None else None
    return [_squeeze(imp, xs[0], axes)]


@handler("Unsqueeze", 1, 11)
def _unsqueeze_1(imp, node, xs, at):
    return [_unsqueeze(imp, xs[0], at["axes"])]


@handler("Unsqueeze", 13, 21, 23, 24, 25)
def _unsqueeze_13(imp, node, xs, at):  # op-set 13: axes moved to an input
    return [_unsqueeze(imp, xs[0], const(xs[1], "Unsqueeze's axes").reshape(-1).tolist())]


@handler("Transpose", 1, 13, 21, 23, 24, 25)
def _transpose(imp, node, xs, at):
    x = xs[0]
    perm = at.get("perm") or list(range(x.rank))[::-1]
    return [imp.b.op("Transpose", [x], {"perm": tuple(int(p) % max(x.rank, 1) for p in perm)})]


@handler("Concat", 1, 4, 11, 13)
def _concat(imp, node, xs, at):
    xs = [x for x in xs if x is not None]
    axis = norm_axis(at.get("axis", 1), xs[0].rank)
    nonempty = [x for x in xs if x.shape[axis] != 0] or xs[:1]
    if len(nonempty) == 1:
        return [imp.b.op("Identity", nonempty)]
    return [imp.b.op("Concat", nonempty, {"axis": axis})]


def _slice(imp, x, starts, ends, axes, steps):
    rank = x.rank
    axes = list(range(len(starts))) if axes is None else [norm_axis(int(a), rank) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    st, cnt, sp = [0] * rank, list(x.shape), [1] * rank
    for a, s, e, k in zip(axes, starts, ends, steps):
        if k == 0:
            raise ModelError("Slice step 0")
        s, e = int(max(min(s, 2**62), -2**62)), int(max(min(e, 2**62), -2**62))
        r = range(x.shape[a])[slice(s, e, k)]
        st[a], cnt[a], sp[a] = (r.start if len(r) else 0), len(r), k
    if cnt == list(x.shape) and all(s == 0 for s in st) and all(k == 1 for k in sp):
        return x
    return imp.b.op("Slice", [x], {"starts": tuple(st), "steps": tuple(sp), "counts": tuple(cnt)})


@handler("Slice", 1)
def _slice_1(imp, node, xs, at):  # op-set 1: starts/ends/axes are attributes
    return [_slice(imp, xs[0], at["starts"], at["ends"], at.get("axes"), None)]


@handler("Slice", 10, 11, 13)
def _slice_10(imp, node, xs, at):  # op-set 10: inputs, with steps
    opt = [const(v, "Slice's " + n).reshape(-1).tolist() if v is not None else None
           for v, n in zip(list(xs[1:]) + [None] * (5 - len(xs)), ("starts", "ends", "axes", "steps"))]
    return [_slice(imp, xs[0], *opt)]


@handler("Split", 2, 11)
def _split_2(imp, node, xs, at):  # split sizes as an attribute
    return _split(imp, xs[0], at.get("axis", 0), at.get("split"), len(node.output))


@handler("Split", 13)
def _split_13(imp, node, xs, at):  # op-set 13: split sizes moved to an input
    sizes = const(xs[1], "Split's split").tolist() if len(xs) > 1 and xs[1] is not None else None
    return _split(imp, xs[0], at.get("axis", 0), sizes, len(node.output))


@handler("Split", 18)
def _split_18(imp, node, xs, at):  # op-set 18: num_outputs, uneven last chunk
    sizes = const(xs[1], "Split's split").tolist() if len(xs) > 1 and xs[1] is not None else None
    x = xs[0]
    axis = norm_axis(at.get("axis", 0), x.rank)
    if sizes is None:
        n = at.get("num_outputs", len(node.output))
        chunk = -(-x.shape[axis] // n)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(n)]
    return _split(imp, x, axis, sizes, len(node.output))


def _split(imp, x, axis, sizes, n):
    axis = norm_axis(axis, x.rank)
    if not sizes:
        if x.shape[axis] % n:
            raise ModelError(f"Split of {x.shape[axis]} into {n} equal parts")
        sizes = [x.shape[axis] // n] * n
    outs, start = [], 0
    for s in sizes:
        starts = [0] * x.rank
        ends = list(x.shape)
        starts[axis], ends[axis] = start, start + int(s)
        outs.append(_slice(imp, x, starts, ends, None, None))
        start += int(s)
    return outs


@handler("Expand", 8, 13)
def _expand(imp, node, xs, at):
    x = xs[0]
    shape = np.broadcast_shapes(x.shape, tuple(int(d) for d in const(xs[1], "Expand's shape")))
    return [x if shape == x.shape else imp.b.op("Expand", [x], {"shape": shape})]


@handler("Tile", 6, 13)
def _tile(imp, node, xs, at):
    # tile = interleave unit dims, broadcast them to the repeat counts, merge: a view + Expand, no kernel of its own
    x = xs[0]
    reps = [int(r) for r in const(xs[1], "Tile's repeats")]
    inter = [d for dim in x.shape for d in (1, dim)]
    target = [d for r, dim in zip(reps, x.shape) for d in (r, dim)]
    y = imp.b.op("Expand", [reshape(imp.b, x, inter)], {"shape": tuple(target)})
    return [reshape(imp.b, y, [r * d for r, d in zip(reps, x.shape)])]


@handler("Gather", 1, 11, 13)
def _gather(imp, node, xs, at):
    x, idx = xs
    axis = norm_axis(at.get("axis", 0), x.rank)
    return [imp.b.op("Gather", [x, idx], {"axis": axis})]


@handler("Range", 11, 27)
def _range(imp, node, xs, at):
    s, l, d = (const(v, "Range's inputs") for v in xs)
    return [imp.b.const(np.arange(s, l, d).astype(s.dtype))]


def _pads_2(at):
    return list(at.get("pads") or at.get("paddings")), at.get("mode", "constant"), at.get("value", 0.0)


@handler("Pad", 2)
def _pad_2(imp, node, xs, at):  # op-set 2: pads and value are attributes
    pads, mode, value = _pads_2(at)
    return [_pad(imp, xs[0], pads, mode, value)]


@handler("Pad", 11, 13)
def _pad_11(imp, node, xs, at):  # op-set 11: pads and constant value are inputs
    pads = const(xs[1], "Pad's pads").tolist()
    value = const(xs[2], "Pad's value").reshape(-1)[0] if len(xs) > 2 and xs[2] is not None else 0
    return [_pad(imp, xs[0], pads, at.get("mode", "constant"), value)]


@handler("Pad", 18, 19, 21, 23, 24, 25)
def _pad_18(imp, node, xs, at):  # op-set 18: optional axes input; 19 adds mode 'wrap'
    x = xs[0]
    pads = const(xs[1], "Pad's pads").tolist()
    value = const(xs[2], "Pad's value").reshape(-1)[0] if len(xs) > 2 and xs[2] is not None else 0
    if len(xs) > 3 and xs[3] is not None:
        axes = [norm_axis(int(a), x.rank) for a in const(xs[3], "Pad's axes")]
        full = [0] * (2 * x.rank)
        for i, a in enumerate(axes):
            full[a], full[a + x.rank] = pads[i], pads[i + len(axes)]
        pads = full
    return [_pad(imp, x, pads, at.get("mode", "constant"), value)]


def _pad(imp, x, pads, mode, value):
    pads = [int(p) for p in pads]
    if not any(pads):
        return x
    if any(p < 0 for p in pads):  # negative pads crop: a Slice, then the positive part
        starts = [max(0, -p) for p in pads[:x.rank]]
        ends = [d - max(0, -p) for d, p in zip(x.shape, pads[x.rank:])]
        x = _slice(imp, x, starts, ends, None, None)
        pads = [max(0, p) for p in pads]
        if not any(pads):
            return x
    return imp.b.op("Pad", [x], {"pads": tuple(pads), "mode": mode, "value": float(value)})


# ---------------------------------------------------------------- neural-network ops ------------------------------
def _auto_pads(at, in_spatial, kernel, strides, dilations):
    """Explicit pads (begins + ends) from auto_pad; SAME_UPPER puts the odd cell at the end, SAME_LOWER first."""
    nsp = len(in_spatial)
    auto = at.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return list(at.get("pads") or [0] * 2 * nsp)
    if auto == "VALID":
        return [0] * 2 * nsp
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ModelError(f"auto_pad {auto!r}: expected NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    begins, ends = [], []
    for size, k, s, d in zip(in_spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins + ends


@handler("Conv", 1, 11, 22)
def _conv(imp, node, xs, at):
    x, w = xs[0], xs[1]
    nsp = x.rank - 2
    kernel = list(at.get("kernel_shape") or w.shape[2:])
    strides = list(at.get("strides") or [1] * nsp)
    dil = list(at.get("dilations") or [1] * nsp)
    pads = _auto_pads(at, x.shape[2:], kernel, strides, dil)
    inputs = [x, w] + ([xs[2]] if len(xs) > 2 and xs[2] is not None else [])
    return [imp.b.op("Conv", inputs, {"strides": tuple(strides), "pads": tuple(pads), "dilations": tuple(dil),
                                      "group": at.get("group", 1)})]


def _pool(imp, node, xs, at, op):
    x = xs[0]
    nsp = x.rank - 2
    kernel = list(at["kernel_shape"])
    strides = list(at.get("strides") or [1] * nsp)
    dil = list(at.get("dilations") or [1] * nsp)
    pads = _auto_pads(at, x.shape[2:], kernel, strides, dil)
    attrs = {"kernel_shape": tuple(kernel), "strides": tuple(strides), "pads": tuple(pads), "dilations": tuple(dil)}
    if at.get("ceil_mode", 0):
        attrs["ceil_mode"] = 1
    if op == "AveragePool":
        attrs["count_include_pad"] = at.get("count_include_pad", 0)
    y = imp.b.op(op, [x], attrs)
    if len(node.output) > 1 and node.output[1]:  # op-set 8+
        return [y, _maxpool_indices(imp.b, x, y, kernel, strides, pads, dil, at.get("storage_order", 0))]
    return [y]


def _maxpool_indices(b, x, y, kernel, strides, pads, dil, storage_order):
    """MaxPool's Indices: the flat index into x (row-major, or column-major over the spatial dims when
    storage_order=1) of the first maximum of each window. Windows are gathered from x with one padding slot
    (the lowest value) appended, arg-maxed, and mapped through a table of window offset -> flat index."""
    n, c, space, out = x.shape[0], x.shape[1], x.shape[2:], y.shape[2:]
    size = int(np.prod(space))
    grid = np.stack(np.meshgrid(*[np.arange(o) * st - p for o, st, p in zip(out, strides, pads)], indexing="ij"), -1)
    taps = np.stack(np.meshgrid(*[np.arange(k) * d for k, d in zip(kernel, dil)], indexing="ij"), -1)
    at = grid.reshape(-1, 1, len(space)) + taps.reshape(1, -1, len(space))  # [windows, taps, spatial dims]
    inside = np.all((at >= 0) & (at < np.asarray(space)), axis=-1)
    row_major = np.ravel_multi_index(tuple(np.clip(at, 0, np.asarray(space) - 1).transpose(2, 0, 1)), space)
    col_major = np.ravel_multi_index(tuple(np.clip(at, 0, np.asarray(space) - 1)[..., ::-1].transpose(2, 0, 1)),
                                     space[::-1])
    lowest = np.finfo(x.dtype).min if np.dtype(x.dtype).kind == "f" else np.iinfo(x.dtype).min
    flat = b.op("Concat", [reshape(b, x, (n, c, size)), b.const(np.full((n, c, 1), lowest, x.dtype))], {"axis": 2})
    windows = b.op("Gather", [flat, b.const(np.where(inside, row_major, size).astype(np.int64))], {"axis": 2})
    first = b.op("ArgReduce", [windows], {"mode": "max", "axis": 3, "keepdims": 1})
    table = (col_major if storage_order else row_major).astype(np.int64)
    table = b.op("Expand", [b.const(table[None, None])], {"shape": (n, c) + table.shape})
    index = b.op("GatherElements", [table, first], {"axis": 3})
    plane = b.const((np.arange(n * c, dtype=np.int64) * size).reshape(n, c, 1, 1))
    return reshape(b, b.op("Add", [index, plane]), y.shape)


@handler("MaxPool", 1, 8, 10, 11, 12, 22)
def _maxpool(imp, node, xs, at):
    return _pool(imp, node, xs, at, "MaxPool")


@handler("AveragePool", 1, 7, 10, 11, 19, 22)
def _avgpool(imp, node, xs, at):
    return _pool(imp, node, xs, at, "AveragePool")


@handler("GlobalAveragePool", 1, 22)
def _gap(imp, node, xs, at):
    x = xs[0]
    return [imp.b.op("Reduce", [x], {"mode": "mean", "axes": tuple(range(2, x.rank)), "keepdims": 1})]


@handler("GlobalMaxPool", 1, 22)
def _gmp(imp, node, xs, at):
    x = xs[0]
    return [imp.b.op("Reduce", [x], {"mode": "max", "axes": tuple(range(2, x.rank)), "keepdims": 1})]


@handler("BatchNormalization", 1, 6, 7, 9, 14, 15)
def _batchnorm(imp, node, xs, at):
    # op-set < 9 had `spatial`; < 7 `is_test`; 14 added training_mode. Inference form here; training elsewhere.
    x, scale, bias, mean, var = xs[:5]
    if at.get("spatial", 1) == 0:
        raise ModelError("BatchNormalization with spatial=0 is not supported")
    stats_out = len(node.output) > 1 and any(node.output[1:])
    if (at.get("training_mode", 0) or stats_out) and not getattr(imp, "training", False):
        if imp.opset < 14:  # before 14 the extra outputs were saved statistics of a layout nobody agreed on
            raise ModelError("BatchNormalization's statistics outputs before op-set 14 are not supported")
        return _batchnorm_batch_stats(imp, x, scale, bias, mean, var, at.get("epsilon", 1e-5),
                                      at.get("momentum", 0.9))[:len(node.output)]
    if not getattr(imp, "training", False) and any(v.const is None for v in (scale, bias, mean, var)):
        return [_batchnorm_composed(imp.b, x, scale, bias, mean, var, at.get("epsilon", 1e-5))]
    if getattr(imp, "training", False):
        from ..graph.ops.grad_nn import batchnorm_training
        y = batchnorm_training(imp.b, x, scale, bias, mean, var, at.get("epsilon", 1e-5), at.get("momentum", 0.9),
                               imp.state_updates)
        return [y] + [None] * (len([o for o in node.output if o]) - 1)
    return [imp.b.op("BatchNormalization", [x, scale, bias, mean, var], {"epsilon": at.get("epsilon", 1e-5),
                                                                      "momentum": at.get("momentum", 0.9)})]


def _batchnorm_composed(b, x, scale, bias, mean, var, eps):
    """y = (x - mean) * scale / sqrt(var + eps) + B of primitives, for statistics known only at run time."""
    channel = (1, x.shape[1]) + (1,) * (x.rank - 2)
    scale, bias, mean, var = (reshape(b, v, channel) for v in (scale, bias, mean, var))
    inv = b.op("Div", [scale, b.op("Sqrt", [b.op("Add", [var, b.const(np.asarray(eps, x.dtype))])])])
    return b.op("Add", [b.op("Mul", [b.op("Sub", [x, mean]), inv]), bias])


def _batchnorm_batch_stats(imp, x, scale, bias, mean, var, eps, momentum):
    """training_mode=1 in an inference graph (op-set 14+): normalise by the batch's mean and (biased) variance;
    the outputs are y, mean * momentum + batch_mean * (1 - momentum), and the same for var."""
    b = imp.b
    axes = (0,) + tuple(range(2, x.rank))
    batch_mean = b.op("Reduce", [x], {"mode": "mean", "axes": axes, "keepdims": 1})
    centred = b.op("Sub", [x, batch_mean])
    batch_var = b.op("Reduce", [b.op("Mul", [centred, centred])], {"mode": "mean", "axes": axes, "keepdims": 1})
    y = _batchnorm_composed(b, x, scale, bias, batch_mean, batch_var, eps)
    keep = b.const(np.asarray(momentum, x.dtype))
    take = b.const(np.asarray(1 - momentum, x.dtype))
    running = [b.op("Add", [b.op("Mul", [reshape(b, old, (x.shape[1],)), keep]),
                            b.op("Mul", [reshape(b, new, (x.shape[1],)), take])])
               for old, new in ((mean, batch_mean), (var, batch_var))]
    return [y] + running


@handler("RoiAlign", 10, 16, 22)  # 16 adds coordinate_transformation_mode, default half_pixel (10 behaves as
def _roi_align(imp, node, xs, at):  # output_half_pixel); 22 adds types
    x, rois, batch = xs
    default = "half_pixel" if imp.opset >= 16 else "output_half_pixel"
    mode, coords = at.get("mode", "avg"), at.get("coordinate_transformation_mode", default)
    if mode not in ("avg", "max") or coords not in ("half_pixel", "output_half_pixel"):
        raise ModelError(f"RoiAlign's mode is {mode!r} and coordinate_transformation_mode {coords!r}; expected avg or "
                         "max, and half_pixel or output_half_pixel")
    if rois.dtype != x.dtype:
        rois = imp.b.op("Cast", [rois], {"to": x.dtype})
    if batch.dtype != "int64":
        batch = imp.b.op("Cast", [batch], {"to": "int64"})
    attrs = {"mode": mode, "output_height": at.get("output_height", 1), "output_width": at.get("output_width", 1),
             "sampling_ratio": at.get("sampling_ratio", 0), "spatial_scale": at.get("spatial_scale", 1.0),
             "half_pixel": int(coords == "half_pixel")}
    return [imp.b.op("RoiAlign", [x, rois, batch], attrs)]


@handler("Det", 11, 22)  # 22 adds types
def _det(imp, node, xs, at):
    return [imp.b.op("Det", [xs[0]])]


@handler("LRN", 1, 13)
def _lrn(imp, node, xs, at):
    return [imp.b.op("LRN", [xs[0]], {"size": at["size"], "alpha": at.get("alpha", 1e-4),
                                      "beta": at.get("beta", 0.75), "bias": at.get("bias", 1.0)})]


def _softmax_legacy(imp, node, xs, at, op):
    # op-sets < 13: the input is flattened to 2-D at `axis` and normalised over the whole second dim
    x = xs[0]
    axis = norm_axis(at.get("axis", 1), x.rank)
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    flat = reshape(imp.b, x, (outer, x.size // outer if outer else 0))
    y = imp.b.op(op, [flat], {"axis": 1})
    return [reshape(imp.b, y, x.shape)]


@handler("Softmax", 1, 11)
def _softmax_1(imp, node, xs, at):
    return _softmax_legacy(imp, node, xs, at, "Softmax")


@handler("LogSoftmax", 1, 11)
def _logsoftmax_1(imp, node, xs, at):
    return _softmax_legacy(imp, node, xs, at, "LogSoftmax")


@handler("Softmax", 13)
@handler("LogSoftmax", 13)
def _softmax_13(imp, node, xs, at):  # op-set 13: one axis, default -1
    x = xs[0]
    return [imp.b.op(node.op_type, [x], {"axis": norm_axis(at.get("axis", -1), x.rank)})]


@handler("Gemm", 1, 6, 7, 9, 11, 13)
def _gemm(imp, node, xs, at):
    # op-set < 7: `broadcast` attr; < 11: C required. Same maths.
    a, bm = xs[0], xs[1]
    c = xs[2] if len(xs) > 2 and xs[2] is not None else None
    attrs = {"transA": at.get("transA", 0), "transB": at.get("transB", 0), "alpha": at.get("alpha", 1.0),
             "beta": at.get("beta", 1.0)}
    if c is not None and attrs["beta"] == 0.0:
        c = None
    return [imp.b.op("Gemm", [a, bm] + ([c] if c is not None else []), attrs)]


@handler("MatMul", 1, 9, 13)
def _matmul(imp, node, xs, at):
    a, bm = xs
    if a.rank == 0 or bm.rank == 0:
        raise ModelError("MatMul of a scalar")
    a2 = reshape(imp.b, a, (1,) + a.shape) if a.rank == 1 else a
    b2 = reshape(imp.b, bm, bm.shape + (1,)) if bm.rank == 1 else bm
    y = imp.b.op("Gemm", [a2, b2], {})
    shape = list(y.shape)
    if bm.rank == 1:
        shape.pop(-1)
    if a.rank == 1:
        shape.pop(-2 if bm.rank != 1 else -1)
    return [reshape(imp.b, y, shape)]


# ---------------------------------------------------------------- reductions --------------------------------------
REDUCE_MODES = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
                "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceLogSum": "logsum",
                "ReduceLogSumExp": "logsumexp", "ReduceSumSquare": "sumsquare"}


def _reduce(imp, node, x, axes, keepdims, noop_empty=0):
    if axes is None or len(axes) == 0:
        if noop_empty:
            return x
        axes = list(range(x.rank))
    axes = tuple(sorted({norm_axis(int(a), x.rank) for a in axes}))
    return imp.b.op("Reduce", [x], {"mode": REDUCE_MODES[node.op_type], "axes": axes, "keepdims": keepdims})


def _reduce_attr(imp, node, xs, at):  # axes as an attribute
    return [_reduce(imp, node, xs[0], at.get("axes"), at.get("keepdims", 1))]


def _reduce_input(imp, node, xs, at):  # op-set 13 (ReduceSum) / 18 (the rest): axes as an optional input
    axes = const(xs[1], "the reduction axes").reshape(-1).tolist() if len(xs) > 1 and xs[1] is not None else None
    return [_reduce(imp, node, xs[0], axes, at.get("keepdims", 1), at.get("noop_with_empty_axes", 0))]


for _op in REDUCE_MODES:
    if _op == "ReduceSum":
        handler(_op, 1, 11)(_reduce_attr)
        handler(_op, 13)(_reduce_input)
    else:
        handler(_op, 1, 11, 12, 13)(_reduce_attr)  # 12: ReduceMax/Min add int8/uint8
        handler(_op, 18, 20, 28)(_reduce_input)  # 20: Max/Min add bool; 28: LogSum(Exp) add types


# ---------------------------------------------------------------- index-valued reductions -------------------------
@handler("ArgMax", 1, 11, 12, 13)
@handler("ArgMin", 1, 11, 12, 13)
def _argreduce(imp, node, xs, at):  # 11: negative axis; 12: select_last_index
    x = xs[0]
    attrs = {"mode": "max" if node.op_type == "ArgMax" else "min", "axis": norm_axis(at.get("axis", 0), x.rank),
             "keepdims": at.get("keepdims", 1), "select_last": at.get("select_last_index", 0)}
    return [imp.b.op("ArgReduce", [x], attrs)]


def _hardmax(imp, x, axis):
    b = imp.b
    arg = b.op("ArgReduce", [x], {"mode": "max", "axis": axis, "keepdims": 1})
    ids = b.const(np.arange(x.shape[axis], dtype=np.int64).reshape((-1,) + (1,) * (x.rank - axis - 1)))
    return b.op("Cast", [b.op("Equal", [arg, ids])], {"to": x.dtype})


@handler("Hardmax", 1, 11)
def _hardmax_1(imp, node, xs, at):  # op-sets < 13: flattened to 2-D at `axis`, as Softmax
    x = xs[0]
    axis = norm_axis(at.get("axis", 1), x.rank)
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    flat = reshape(imp.b, x, (outer, x.size // outer if outer else 0))
    return [reshape(imp.b, _hardmax(imp, flat, 1), x.shape)]


@handler("Hardmax", 13)
def _hardmax_13(imp, node, xs, at):
    x = xs[0]
    return [_hardmax(imp, x, norm_axis(at.get("axis", -1), x.rank))]


# ---------------------------------------------------------------- normalisations and losses, composed -------------
@handler("MeanVarianceNormalization", 9, 13)
def _mvn(imp, node, xs, at):  # y = (x - mean) / (sqrt(mean(x^2) - mean^2) + 1e-9), as the ONNX function
    b, x = imp.b, xs[0]
    axes = tuple(sorted(norm_axis(a, x.rank) for a in at.get("axes", [0, 2, 3])))
    mean = b.op("Reduce", [x], {"mode": "mean", "axes": axes, "keepdims": 1})
    sq_mean = b.op("Reduce", [b.op("Mul", [x, x])], {"mode": "mean", "axes": axes, "keepdims": 1})
    std = b.op("Sqrt", [b.op("Sub", [sq_mean, b.op("Mul", [mean, mean])])])
    return [b.op("Div", [b.op("Sub", [x, mean]), b.op("Add", [std, b.const(np.asarray(1e-9, x.dtype))])])]


def _nll(imp, logp, target, weight, at):
    """loss[n, d..] = -logp[n, target, d..] * w[target] (0 where target == ignore_index), then the reduction."""
    b = imp.b
    C = logp.shape[1]
    t = b.op("Reshape", [target], {"shape": (target.shape[0], 1) + target.shape[1:]})
    ids = b.const(np.arange(C, dtype=target.dtype).reshape((1, C) + (1,) * (logp.rank - 2)))
    onehot = b.op("Cast", [b.op("Equal", [t, ids])], {"to": logp.dtype})
    wsel = onehot if weight is None else b.op("Mul", [onehot, reshape(b, weight, (1, C) + (1,) * (logp.rank - 2))])
    w = b.op("Reduce", [wsel], {"mode": "sum", "axes": (1,), "keepdims": 0})
    if "ignore_index" in at:
        keep = b.op("Not", [b.op("Equal", [target, b.const(np.asarray(at["ignore_index"], target.dtype))])])
        w = b.op("Mul", [w, b.op("Cast", [keep], {"to": logp.dtype})])
    picked = b.op("Reduce", [b.op("Mul", [onehot, logp])], {"mode": "sum", "axes": (1,), "keepdims": 0})
    loss = b.op("Neg", [b.op("Mul", [picked, w])])
    reduction = at.get("reduction", "mean")
    every = tuple(range(loss.rank))
    if reduction == "none":
        return loss
    total = b.op("Reduce", [loss], {"mode": "sum", "axes": every, "keepdims": 0})
    if reduction == "sum":
        return total
    return b.op("Div", [total, b.op("Reduce", [w], {"mode": "sum", "axes": every, "keepdims": 0})])


@handler("NegativeLogLikelihoodLoss", 12, 13, 22)
def _nll_loss(imp, node, xs, at):
    weight = xs[2] if len(xs) > 2 else None
    return [_nll(imp, xs[0], xs[1], weight, at)]


@handler("SoftmaxCrossEntropyLoss", 12, 13)
def _sce_loss(imp, node, xs, at):
    x = xs[0]
    logp = imp.b.op("LogSoftmax", [x], {"axis": 1})
    weight = xs[2] if len(xs) > 2 else None
    return [_nll(imp, logp, xs[1], weight, at), logp]


# ---------------------------------------------------------------- element-wise indexing ---------------------------
@handler("GatherElements", 11, 13)
def _gather_elements(imp, node, xs, at):
    x, idx = xs
    return [imp.b.op("GatherElements", [x, idx], {"axis": norm_axis(at.get("axis", 0), x.rank)})]


@handler("Scatter", 9, 11)
@handler("ScatterElements", 11, 13)
def _scatter_elements(imp, node, xs, at):  # Scatter (deprecated) is ScatterElements without reduction
    x, idx, upd = xs
    return [imp.b.op("ScatterElements", [x, idx, upd], {"axis": norm_axis(at.get("axis", 0), x.rank)})]


@handler("ScatterElements", 16, 18)
def _scatter_elements_16(imp, node, xs, at):  # 16 adds reduction add/mul; 18 adds max/min
    x, idx, upd = xs
    return [imp.b.op("ScatterElements", [x, idx, upd], {"axis": norm_axis(at.get("axis", 0), x.rank),
                                                         "reduction": at.get("reduction", "none")})]


def _nd_linear(imp, x, idx, batch_dims):
    """GatherND/ScatterND indices -> (x viewed as [rows, slice...], row numbers shaped idx.shape[:-1])."""
    b = imp.b
    k = idx.shape[-1]
    lead = x.shape[:batch_dims + k]
    dims = b.const(np.asarray(x.shape[batch_dims:batch_dims + k], np.int64))
    i64 = idx if idx.dtype == "int64" else b.op("Cast", [idx], {"to": "int64"})
    i64 = b.op("Where", [b.op("Less", [i64, b.const(np.asarray(0, np.int64))]), b.op("Add", [i64, dims]), i64])
    strides = np.asarray([int(np.prod(lead[batch_dims + j + 1:], dtype=np.int64)) for j in range(k)], np.int64)
    lin = b.op("Reduce", [b.op("Mul", [i64, b.const(strides)])], {"mode": "sum", "axes": (idx.rank - 1,),
                                                                   "keepdims": 0}) if k else \
        b.const(np.zeros(idx.shape[:-1], np.int64))
    if batch_dims:
        per = int(np.prod(lead[batch_dims:], dtype=np.int64))
        nb = int(np.prod(lead[:batch_dims], dtype=np.int64))
        base = np.arange(nb, dtype=np.int64).reshape(lead[:batch_dims] + (1,) * (idx.rank - 1 - batch_dims)) * per
        lin = b.op("Add", [lin, b.const(base)])
    rows = int(np.prod(lead, dtype=np.int64))
    return reshape(b, x, (rows,) + x.shape[batch_dims + k:]), lin


@handler("GatherND", 11, 12, 13)
def _gather_nd(imp, node, xs, at):  # 12 adds batch_dims
    x, idx = xs
    flat, lin = _nd_linear(imp, x, idx, at.get("batch_dims", 0))
    return [imp.b.op("Gather", [flat, lin], {"axis": 0})]


@handler("ScatterND", 11, 13, 16, 18)
def _scatter_nd(imp, node, xs, at):  # 16 adds reduction add/mul, 18 max/min: a ScatterElements over row numbers
    b = imp.b
    x, idx, upd = xs
    flat, lin = _nd_linear(imp, x, idx, 0)
    n = int(np.prod(lin.shape, dtype=np.int64))
    slice_shape = flat.shape[1:]
    width = int(np.prod(slice_shape, dtype=np.int64))
    rows = b.op("Expand", [reshape(b, lin, (n, 1))], {"shape": (n, width)}) if width != 1 else reshape(b, lin, (n, 1))
    y = b.op("ScatterElements", [reshape(b, flat, (flat.shape[0], width)), rows, reshape(b, upd, (n, width))],
             {"axis": 0, "reduction": at.get("reduction", "none")})
    return [reshape(b, y, x.shape)]


# ---------------------------------------------------------------- ConvTranspose, composed -------------------------
@handler("ConvTranspose", 1, 11, 22)
def _conv_transpose(imp, node, xs, at):
    """y = Conv(zero-insert(x, strides) padded by (k-1)*d - pads, flip(w) with in/out channels swapped per group).

    output_shape (when given) decides the total padding; SAME_UPPER puts the odd cell at the end, SAME_LOWER and
    NOTSET at the start (as the reference evaluator splits it). Constant weights fold to their flipped form at load.
    """
    b = imp.b
    x, w = xs[0], xs[1]
    bias = xs[2] if len(xs) > 2 and xs[2] is not None else None
    nsp = x.rank - 2
    group = at.get("group", 1)
    kernel = list(w.shape[2:])
    strides = list(at.get("strides") or [1] * nsp)
    dil = list(at.get("dilations") or [1] * nsp)
    out_pad = list(at.get("output_padding") or [0] * nsp)
    pads = list(at.get("pads") or [0] * 2 * nsp)
    auto = at.get("auto_pad", "NOTSET")
    out_shape = at.get("output_shape")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = list(out_shape)[-nsp:] if out_shape is not None else [d * s for d, s in zip(x.shape[2:], strides)]
        for i in range(nsp):
            total = strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - out_shape[i]
            small, big = total // 2, total - total // 2
            pads[i], pads[i + nsp] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * 2 * nsp
    # zero insertion: [N, C, H, 1, W, 1] padded to [N, C, H, s, W, s], then the trailing s-1 zeros cut
    if any(s > 1 for s in strides):
        inter = list(x.shape[:2]) + [d for dim in x.shape[2:] for d in (dim, 1)]
        zpads = [0] * len(inter) * 2
        for i, s in enumerate(strides):
            zpads[len(inter) + 3 + 2 * i] = s - 1
        z = _pad(imp, reshape(b, x, inter), zpads, "constant", 0.0)
        z = reshape(b, z, list(x.shape[:2]) + [d * s for d, s in zip(x.shape[2:], strides)])
        x = _slice(imp, z, [0] * nsp, [(d - 1) * s + 1 for d, s in zip(x.shape[2:], strides)],
                   list(range(2, 2 + nsp)), None)
    edge = [(k - 1) * d for k, d in zip(kernel, dil)]
    begins = [e - p for e, p in zip(edge, pads[:nsp])]
    ends = [e - p + o for e, p, o in zip(edge, pads[nsp:], out_pad)]
    x = _pad(imp, x, [0, 0] + begins + [0, 0] + ends, "constant", 0.0)
    cin, cout_g = w.shape[0], w.shape[1]
    wg = reshape(b, w, [group, cin // group, cout_g] + kernel)
    wg = b.op("Transpose", [wg], {"perm": (0, 2, 1) + tuple(range(3, 3 + nsp))})
    wg = _slice(imp, wg, [-1] * nsp, [-2**62] * nsp, list(range(3, 3 + nsp)), [-1] * nsp)
    wf = reshape(b, wg, [group * cout_g, cin // group] + kernel)
    inputs = [x, wf] + ([bias] if bias is not None else [])
    return [b.op("Conv", inputs, {"strides": (1,) * nsp, "pads": (0,) * 2 * nsp, "dilations": tuple(dil),
                                  "group": group})]


# ---------------------------------------------------------------- handlers kept in their own modules ---------------
# resize: Resize, Upsample; composed: CumSum, OneHot, TopK, Einsum, quantisation, ...; recurrent: RNN, GRU, LSTM;
# control: If (constant condition), Scan (unrolled); dynamic: NonZero, Compress, Unique, NonMaxSuppression (host ops
# at run time); text: StringNormalizer, TfIdfVectorizer. Registration side effects; they import this module.
from . import composed, control, dynamic, recurrent, resize, text  # noqa: F401
