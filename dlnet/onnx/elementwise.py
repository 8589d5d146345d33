"""Element-wise ONNX ops: unary maths and activations, binary arithmetic and comparisons (with the op-set < 7
`broadcast` attribute), variadic Sum/Max/Min/Mean, Clip, Where, Cast, Identity, Dropout."""
import numpy as np

from ..errors import ModelError
from .common import const, handler, onnx_dtype, reshape

UNARY = {  # op_type (the IR op of the same name): versions
    "Relu": (1, 6, 13, 14), "Sigmoid": (1, 6, 13), "Tanh": (1, 6, 13), "Exp": (1, 6, 13), "Log": (1, 6, 13),
    "Sqrt": (1, 6, 13), "Abs": (1, 6, 13), "Neg": (1, 6, 13), "Reciprocal": (1, 6, 13), "Floor": (1, 6, 13),
    "Ceil": (1, 6, 13), "Erf": (9, 13), "Sign": (9, 13), "Sin": (7, 22), "Cos": (7, 22), "Tan": (7, 22),
    "Asin": (7, 22), "Acos": (7, 22), "Atan": (7, 22), "Sinh": (9, 22), "Cosh": (9, 22), "Asinh": (9, 22),
    "Acosh": (9, 22), "Atanh": (9, 22), "Round": (11, 22), "Not": (1,), "IsNaN": (9, 13, 20), "Softsign": (1, 22),
    "Softplus": (1, 22), "HardSwish": (14, 22), "Mish": (18, 22), "BitwiseNot": (18,),
}
UNARY_ATTR = {  # ops with attributes that keep their ONNX names
    "LeakyRelu": (1, 6, 16), "Elu": (1, 6, 22), "Selu": (1, 6, 22), "HardSigmoid": (1, 6, 22), "Celu": (12, 28),
    "ThresholdedRelu": (10, 22), "Shrink": (9,), "IsInf": (10, 20), "Swish": (24,),
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
          "BitShift": (11, 28), "Mod": (10, 13, 28), "BitwiseAnd": (18,), "BitwiseOr": (18,), "BitwiseXor": (18,)}


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
@handler("BitwiseAnd", *BINARY["BitwiseAnd"])
@handler("BitwiseOr", *BINARY["BitwiseOr"])
@handler("BitwiseXor", *BINARY["BitwiseXor"])
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
    to = at["to"]
    to = onnx_dtype(to) if isinstance(to, int) else str(to).lower()
    return [imp.b.op("Cast", [xs[0]], {"to": to})]


@handler("CastLike", 15, 19, 21, 23, 24, 25)  # 19 adds saturate (float8 only), later versions add types
def _cast_like(imp, node, xs, at):
    return [imp.b.op("Cast", [xs[0]], {"to": xs[1].dtype})]


@handler("Gelu", 20)
def _gelu(imp, node, xs, at):  # approximate="none": x Phi(x) by erf; "tanh": by tanh (GeluTanh)
    approximate = at.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ModelError(f"approximate={approximate!r}: expected 'none' or 'tanh'")
    x = xs[0]
    if x.dtype not in ("float32", "float64", "float16"):
        raise ModelError(f"dtype {x.dtype} is not supported (supported: float32, float64, float16)")
    return [imp.b.op("Gelu" if approximate == "none" else "GeluTanh", [x])]


@handler("SwiGLU", 28)
def _swiglu(imp, node, xs, at):  # y = Swish_alpha(A) * B, A and B of one shape (no broadcasting)
    a, gate_b = xs
    if a.shape != gate_b.shape or a.dtype != gate_b.dtype:
        raise ModelError(f"A and B must have one shape and dtype (no broadcasting), got {a.dtype}{list(a.shape)} and "
                         f"{gate_b.dtype}{list(gate_b.shape)}")
    return [imp.b.op("Mul", [imp.b.op("Swish", [a], {"alpha": float(at.get("alpha", 1.0))}), gate_b])]


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
