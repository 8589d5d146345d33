"""Elementwise ops. One table row each: C expression (the kernel), numpy maths (folding), gradient."""
import math

import numpy as np

from ...errors import ModelError
from .base import REQUIRED, Op, register


def lit(x, T="float"):
    """A C literal of the compute type."""
    x = float(x)
    if math.isnan(x):
        return f"({T})NAN"
    if math.isinf(x):
        return f"({T})({'-' if x < 0 else ''}INFINITY)"
    return f"(({T}){x!r})"


FLOATS = ("float32", "float64", "float16")


def _clamp01(e, T):
    """e clamped to [0, 1], a NaN kept (OpenCL's clamp returns 0 for it)."""
    return f"({e} < 0 ? ({T})0 : ({e} > 1 ? ({T})1 : {e}))"


def _erf_np(x):
    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x


class Pointwise(Op):
    """y = f(x0, x1, ...) with numpy broadcasting. `c(attrs, args, T)` gives the C expression."""
    kind = "pointwise"
    inplace = True
    arity = 1
    bool_out = False

    def out_dtype(self, node):
        if self.bool_out:
            return "bool"
        return node.inputs[0].dtype

    def infer(self, node):
        shape = np.broadcast_shapes(*[v.shape for v in node.inputs if v is not None])
        return [(self.out_dtype(node), shape)]

    def numpy(self, node, *xs):
        y = self.np(node.attrs, *xs)
        return [np.asarray(y).astype(self.out_dtype(node))]

    def expr(self, node, args, T):
        return self.c(node.attrs, args, T)

    def lower(self, node, lw):
        lw.pointwise([node])


def _pointwise(name, arity, c, np_fn, grad=None, bool_out=False, attrs=None):
    cls = type(name, (Pointwise,), {"name": name, "arity": arity, "bool_out": bool_out, "attrs": attrs or {},
                                    "c": staticmethod(c), "np": staticmethod(np_fn)})
    if grad is not None:
        cls.grad = lambda self, b, node, dys: grad(b, node, dys[0], *node.inputs, node.outputs[0])
    register(cls)
    return cls


def _f(v):
    return v.astype(np.float64) if v.dtype.kind == "f" else v


# Unary maths:  name, C expression of a, numpy, gradient (b, node, dy, x, y) -> [dx]
# NaN propagates as IEEE says: comparisons are written so that a NaN takes the branch that returns it (OpenCL's
# max/min/clamp return the non-NaN operand, so none of them touch data)
# Relu's gradient tests y > 0 (true exactly where x > 0): y is kept for the next layer anyway, so x is read once and
# its producer (BatchNormalization's affine, a residual Add) fuses with the Relu
_pointwise("Relu", 1, lambda at, a, T: f"({a[0]} < 0 ? ({T})0 : {a[0]})", lambda at, x: np.maximum(x, 0),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, b.op("Cast", [b.op("Greater", [y, b.const(np.zeros((), y.dtype))])],
                                                        {"to": y.dtype})])])
_pointwise("LeakyRelu", 1, lambda at, a, T: f"({a[0]} >= 0 ? {a[0]} : {a[0]} * {lit(at['alpha'], T)})",
           lambda at, x: np.where(x >= 0, x, x * at["alpha"]), attrs={"alpha": 0.01})
_pointwise("Sigmoid", 1, lambda at, a, T: f"(({T})1 / (({T})1 + exp(-{a[0]})))", lambda at, x: 1 / (1 + np.exp(-x)),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, b.op("Mul", [y, b.op("Sub", [b.const(np.ones((), y.dtype)),
                                                                                      y])])])])
_pointwise("Tanh", 1, lambda at, a, T: f"tanh({a[0]})", lambda at, x: np.tanh(x),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, b.op("Sub", [b.const(np.ones((), y.dtype)),
                                                                 b.op("Mul", [y, y])])])])
_pointwise("HardSigmoid", 1, lambda at, a, T: _clamp01(f"({lit(at['alpha'], T)} * {a[0]} + {lit(at['beta'], T)})", T),
           lambda at, x: np.clip(at["alpha"] * x + at["beta"], 0, 1), attrs={"alpha": 0.2, "beta": 0.5})
_pointwise("HardSwish", 1, lambda at, a, T: f"({a[0]} * {_clamp01(f'({a[0]} / ({T})6 + ({T})0.5)', T)})",
           lambda at, x: x * np.clip(x / 6 + 0.5, 0, 1))
_pointwise("Elu", 1, lambda at, a, T: f"({a[0]} > 0 ? {a[0]} : {lit(at['alpha'], T)} * (exp({a[0]}) - ({T})1))",
           lambda at, x: np.where(x > 0, x, at["alpha"] * (np.exp(x) - 1)), attrs={"alpha": 1.0})
_pointwise("Selu", 1, lambda at, a, T: f"({lit(at['gamma'], T)} * ({a[0]} > 0 ? {a[0]} : "
                                       f"{lit(at['alpha'], T)} * (exp({a[0]}) - ({T})1)))",
           lambda at, x: at["gamma"] * np.where(x > 0, x, at["alpha"] * (np.exp(x) - 1)),
           attrs={"alpha": 1.6732632423543772, "gamma": 1.0507009873554805})
_pointwise("Celu", 1, lambda at, a, T: f"({a[0]} > 0 ? {a[0]} : {lit(at['alpha'], T)} * "
                                       f"(exp({a[0]} / {lit(at['alpha'], T)}) - ({T})1))",
           lambda at, x: np.maximum(0, x) + np.minimum(0, at["alpha"] * (np.exp(x / at["alpha"]) - 1)),
           attrs={"alpha": 1.0})
_pointwise("ThresholdedRelu", 1, lambda at, a, T: f"({a[0]} > {lit(at['alpha'], T)} ? {a[0]} : ({T})0)",
           lambda at, x: np.where(x > at["alpha"], x, 0), attrs={"alpha": 1.0})
_pointwise("Softplus", 1, lambda at, a, T: f"({a[0]} > ({T})20 ? {a[0]} : log1p(exp({a[0]})))",
           lambda at, x: np.logaddexp(0, x),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, b.op("Sigmoid", [x])])])
_pointwise("Softsign", 1, lambda at, a, T: f"({a[0]} / (({T})1 + fabs({a[0]})))", lambda at, x: x / (1 + np.abs(x)))


def _shrink_c(at, a, T):
    lambd, bias = lit(at["lambd"], T), lit(at["bias"], T)
    return f"({a[0]} < -{lambd} ? {a[0]} + {bias} : ({a[0]} > {lambd} ? {a[0]} - {bias} : ({T})0))"


_pointwise("Shrink", 1, _shrink_c,
           lambda at, x: np.where(x < -at["lambd"], x + at["bias"], np.where(x > at["lambd"], x - at["bias"], 0)),
           attrs={"lambd": 0.5, "bias": 0.0})
_pointwise("Exp", 1, lambda at, a, T: f"exp({a[0]})", lambda at, x: np.exp(x),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, y])])
_pointwise("Log", 1, lambda at, a, T: f"log({a[0]})", lambda at, x: np.log(x),
           lambda b, n, dy, x, y: [b.op("Div", [dy, x])])
_pointwise("Sqrt", 1, lambda at, a, T: f"sqrt({a[0]})", lambda at, x: np.sqrt(x),
           lambda b, n, dy, x, y: [b.op("Div", [dy, b.op("Mul", [y, b.const(np.asarray(2, y.dtype))])])])
_pointwise("Abs", 1, lambda at, a, T: f"({a[0]} < 0 ? -{a[0]} : {a[0]})", lambda at, x: np.abs(x),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, b.op("Sign", [x])])])
_pointwise("Neg", 1, lambda at, a, T: f"(-{a[0]})", lambda at, x: -x, lambda b, n, dy, x, y: [b.op("Neg", [dy])])
_pointwise("Reciprocal", 1, lambda at, a, T: f"(({T})1 / {a[0]})", lambda at, x: 1 / x,
           lambda b, n, dy, x, y: [b.op("Neg", [b.op("Mul", [dy, b.op("Mul", [y, y])])])])
_pointwise("Erf", 1, lambda at, a, T: f"erf({a[0]})", lambda at, x: _erf_np(x))


def _gelu_grad(b, node, dy, x, y):
    # d/dx x * Phi(x) = Phi(x) + x * exp(-x^2 / 2) / sqrt(2 pi)
    c = lambda v: b.const(np.asarray(v, x.dtype))  # noqa: E731
    cdf = b.op("Mul", [b.op("Add", [b.op("Erf", [b.op("Mul", [x, c(math.sqrt(0.5))])]), c(1.0)]), c(0.5)])
    pdf = b.op("Mul", [b.op("Exp", [b.op("Mul", [b.op("Mul", [x, x]), c(-0.5)])]), c(1 / math.sqrt(2 * math.pi))])
    return [b.op("Mul", [dy, b.op("Add", [cdf, b.op("Mul", [x, pdf])])])]


# exact GELU, recognised from its op-set 13 decomposition by the normalize pass (x * 0.5 * (1 + erf(x / sqrt 2)))
_pointwise("Gelu", 1, lambda at, a, T: f"({a[0]} * ({T})0.5 * (({T})1 + erf({a[0]} * {lit(math.sqrt(0.5), T)})))",
           lambda at, x: x * 0.5 * (1 + _erf_np(x * math.sqrt(0.5))), _gelu_grad)
_pointwise("Sign", 1, lambda at, a, T: f"({a[0]} != {a[0]} ? {a[0]} : ({T})({a[0]} > 0) - ({T})({a[0]} < 0))",
           lambda at, x: np.sign(x))
_pointwise("Floor", 1, lambda at, a, T: f"floor({a[0]})", lambda at, x: np.floor(x))
_pointwise("Ceil", 1, lambda at, a, T: f"ceil({a[0]})", lambda at, x: np.ceil(x))
_pointwise("Round", 1, lambda at, a, T: f"rint({a[0]})", lambda at, x: np.round(x))  # half to even, as ONNX
for _name, _fn in [("Sin", "sin"), ("Cos", "cos"), ("Tan", "tan"), ("Asin", "asin"), ("Acos", "acos"),
                   ("Atan", "atan"), ("Sinh", "sinh"), ("Cosh", "cosh"), ("Asinh", "asinh"), ("Acosh", "acosh"),
                   ("Atanh", "atanh")]:
    _npf = {"Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan, "Asinh": np.arcsinh, "Acosh": np.arccosh,
            "Atanh": np.arctanh}.get(_name) or getattr(np, _fn)
    _pointwise(_name, 1, (lambda f: lambda at, a, T: f"{f}({a[0]})")(_fn), (lambda f: lambda at, x: f(x))(_npf))
_pointwise("Not", 1, lambda at, a, T: f"(!{a[0]})", lambda at, x: np.logical_not(x), bool_out=True)
_pointwise("IsNaN", 1, lambda at, a, T: f"isnan({a[0]})", lambda at, x: np.isnan(x), bool_out=True)
_pointwise("IsInf", 1, lambda at, a, T: f"(isinf({a[0]}) && ((({a[0]}) > 0 && {int(at['detect_positive'])}) || "
                                        f"(({a[0]}) < 0 && {int(at['detect_negative'])})))",
           lambda at, x: np.isinf(x) & (((x > 0) & bool(at["detect_positive"])) |
                                        ((x < 0) & bool(at["detect_negative"]))), bool_out=True,
           attrs={"detect_positive": 1, "detect_negative": 1})
_pointwise("Identity", 1, lambda at, a, T: a[0], lambda at, x: x, lambda b, n, dy, x, y: [dy])


def _clip_c(at, a, T):
    lo, hi = at["min"], at["max"]
    e = a[0]
    if lo is not None:
        e = f"({e} < {lit(lo, T)} ? {lit(lo, T)} : {e})"
    if hi is not None:
        e = f"({e} > {lit(hi, T)} ? {lit(hi, T)} : {e})"
    return e


_pointwise("Clip", 1, _clip_c, lambda at, x: np.clip(x, at["min"], at["max"]) if x.size else x,
           lambda b, n, dy, x, y: [b.op("Mul", [dy, b.op("Cast", [b.op("Equal", [x, y])], {"to": x.dtype})])],
           attrs={"min": None, "max": None})  # None: unbounded


def _float_mod_c(a, T):
    """Python's x % y: fmod's sign moved to the divisor's, so -3 % inf is inf and 0 % -2 is -0 (as numpy)."""
    r = f"fmod({a[0]}, {a[1]})"
    return (f"({r} != ({T})0 ? ((({r} < 0) != ({a[1]} < 0)) ? {r} + {a[1]} : {r}) : copysign(({T})0, {a[1]}))")


C_BITS = {"char": 8, "uchar": 8, "short": 16, "ushort": 16, "int": 32, "uint": 32, "long": 64, "ulong": 64}


def _bitshift_c(at, a, T):
    """Shifts of the bit width or more (a negative amount read as unsigned is one) give 0, or -1 for x < 0 >> n."""
    big = f"((ulong)(long){a[1]} >= {C_BITS.get(T, 64)})"
    if at["direction"] == "LEFT":
        return f"({big} ? ({T})0 : ({T})({a[0]} << {a[1]}))"
    return f"({big} ? ({a[0]} < 0 ? ({T})-1 : ({T})0) : ({T})({a[0]} >> {a[1]}))"


def _bitshift_np(at, x, y):
    bits = x.dtype.itemsize * 8
    big = y.astype(np.int64).astype(np.uint64) >= bits
    safe = np.where(big, 0, y).astype(y.dtype)
    if at["direction"] == "LEFT":
        return np.where(big, 0, np.left_shift(x, safe)).astype(x.dtype)
    return np.where(big, np.where(x < 0, -1, 0), np.right_shift(x, safe)).astype(x.dtype)


# Binary maths with broadcasting. Gradients are given at the broadcast shape; autodiff sums them back once.
def _int_div_c(at, a, T):
    return f"({a[0]} / {a[1]})"


_pointwise("Add", 2, lambda at, a, T: f"({a[0]} + {a[1]})", lambda at, x, y: x + y,
           lambda b, n, dy, x, y, z: [dy, dy])
_pointwise("Sub", 2, lambda at, a, T: f"({a[0]} - {a[1]})", lambda at, x, y: x - y,
           lambda b, n, dy, x, y, z: [dy, b.op("Neg", [dy])])
_pointwise("Mul", 2, lambda at, a, T: f"({a[0]} * {a[1]})", lambda at, x, y: x * y,
           lambda b, n, dy, x, y, z: [b.op("Mul", [dy, y]), b.op("Mul", [dy, x])])
_pointwise("Div", 2, _int_div_c,
           lambda at, x, y: (x / y) if x.dtype.kind == "f" else np.trunc(x / y).astype(x.dtype),
           lambda b, n, dy, x, y, z: [b.op("Div", [dy, y]), b.op("Neg", [b.op("Div", [b.op("Mul", [dy, z]), y])])])
_pointwise("Pow", 2, lambda at, a, T: f"pow({a[0]}, ({T}){a[1]})" if T in ("float", "double") else
           f"(({T})pow((double){a[0]}, (double){a[1]}))", lambda at, x, y: np.power(_f(x), y).astype(x.dtype))
_pointwise("Max", 2, lambda at, a, T: f"({a[0]} > {a[1]} || isnan((float){a[0]}) ? {a[0]} : {a[1]})",
           lambda at, x, y: np.maximum(x, y))
_pointwise("Min", 2, lambda at, a, T: f"({a[0]} < {a[1]} || isnan((float){a[0]}) ? {a[0]} : {a[1]})",
           lambda at, x, y: np.minimum(x, y))
_pointwise("Mod", 2, lambda at, a, T: (f"fmod({a[0]}, {a[1]})" if at["fmod"] else _float_mod_c(a, T))
           if T in ("float", "double")
           else (f"({a[0]} % {a[1]})" if at["fmod"] else
                 f"((({a[0]} % {a[1]}) + {a[1]}) % {a[1]})"),
           lambda at, x, y: np.fmod(x, y) if at["fmod"] else np.mod(x, y), attrs={"fmod": 0})
_pointwise("PRelu", 2, lambda at, a, T: f"({a[0]} < 0 ? {a[0]} * {a[1]} : {a[0]})",
           lambda at, x, s: np.where(x < 0, x * s, x))
_pointwise("And", 2, lambda at, a, T: f"({a[0]} && {a[1]})", lambda at, x, y: np.logical_and(x, y), bool_out=True)
_pointwise("Or", 2, lambda at, a, T: f"({a[0]} || {a[1]})", lambda at, x, y: np.logical_or(x, y), bool_out=True)
_pointwise("Xor", 2, lambda at, a, T: f"(!{a[0]} != !{a[1]})", lambda at, x, y: np.logical_xor(x, y), bool_out=True)
_pointwise("Equal", 2, lambda at, a, T: f"({a[0]} == {a[1]})", lambda at, x, y: np.equal(x, y), bool_out=True)
_pointwise("Less", 2, lambda at, a, T: f"({a[0]} < {a[1]})", lambda at, x, y: np.less(x, y), bool_out=True)
_pointwise("LessOrEqual", 2, lambda at, a, T: f"({a[0]} <= {a[1]})", lambda at, x, y: np.less_equal(x, y),
           bool_out=True)
_pointwise("Greater", 2, lambda at, a, T: f"({a[0]} > {a[1]})", lambda at, x, y: np.greater(x, y), bool_out=True)
_pointwise("GreaterOrEqual", 2, lambda at, a, T: f"({a[0]} >= {a[1]})", lambda at, x, y: np.greater_equal(x, y),
           bool_out=True)
_pointwise("BitShift", 2, _bitshift_c, _bitshift_np, attrs={"direction": "RIGHT"})  # (ONNX requires it)


@register
class Where(Pointwise):
    """y = cond ? a : b;  da = dy * cond, db = dy * !cond"""
    name = "Where"
    arity = 3

    def out_dtype(self, node):
        return node.inputs[1].dtype

    def expr(self, node, args, T):
        return f"({args[0]} ? {args[1]} : {args[2]})"

    def numpy(self, node, c, x, y):
        return [np.where(c, x, y)]


@register
class Cast(Pointwise):
    """y = (to) x;  dx = cast(dy) back"""
    name = "Cast"
    attrs = {"to": REQUIRED}

    def out_dtype(self, node):
        return np.dtype(node.attrs["to"]).name

    def expr(self, node, args, T):
        src = node.inputs[0].dtype
        if src in FLOATS and np.dtype(self.out_dtype(node)).kind in "iub":
            if self.out_dtype(node) == "bool":
                return f"({args[0]} != 0)"
            return f"({T})trunc({args[0]})"
        return f"({T})({args[0]})"

    def numpy(self, node, x):
        return [x.astype(self.out_dtype(node))]

    def grad(self, b, node, dys):
        x = node.inputs[0]
        if x.dtype in FLOATS and node.outputs[0].dtype in FLOATS:
            return [b.op("Cast", [dys[0]], {"to": x.dtype})]
        return [None]


def check_float(node, path=None):
    for v in node.inputs:
        if v is not None and v.dtype not in FLOATS:
            raise ModelError(f"node {node.name} ({node.op}): expects float tensors, got {v.dtype}")
