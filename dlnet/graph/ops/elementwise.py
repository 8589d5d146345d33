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


def _pointwise(name, arity, c, np_fn, grad=None, bool_out=False, attrs=None, doc=None, differentiable=True):
    cls = type(name, (Pointwise,), {"name": name, "arity": arity, "bool_out": bool_out, "attrs": attrs or {},
                                    "c": staticmethod(c), "np": staticmethod(np_fn), "__doc__": doc,
                                    "differentiable": differentiable})
    if grad is not None:
        cls.grad = lambda self, b, node, dys: grad(b, node, dys[0], *node.inputs, node.outputs[0])
    register(cls)
    return cls


def _f(v):
    return v.astype(np.float64) if v.dtype.kind == "f" else v


# Gradient helpers: constants of a value's dtype, masks, selections (all pointwise: a rule fuses into one kernel)
def _k(b, like, v):
    return b.const(np.asarray(v, like.dtype))


def _cmp(b, op, x, v):
    """x `op` v as bool, v a number or a value"""
    return b.op(op, [x, v if not isinstance(v, (int, float)) else _k(b, x, v)])


def _sel(b, cond, a, c, like):
    """cond ? a : c with numbers made constants of like's dtype"""
    a, c = [_k(b, like, v) if isinstance(v, (int, float)) else v for v in (a, c)]
    return b.op("Where", [cond, a, c])


def _scaled(b, dy, factor):
    return [b.op("Mul", [dy, factor])]


def _leaky_relu_grad(b, n, dy, x, y):
    return _scaled(b, dy, _sel(b, _cmp(b, "Greater", x, 0), 1, n.attrs["alpha"], x))


def _hard_sigmoid_grad(b, n, dy, x, y):
    inside = b.op("And", [_cmp(b, "Greater", y, 0), _cmp(b, "Less", y, 1)])  # 0 < y < 1 exactly where unclamped
    return _scaled(b, dy, _sel(b, inside, n.attrs["alpha"], 0, x))


def _hard_swish_grad(b, n, dy, x, y):
    middle = _sel(b, _cmp(b, "Less", x, 3), b.op("Add", [b.op("Mul", [x, _k(b, x, 1 / 3)]), _k(b, x, 0.5)]), 1, x)
    return _scaled(b, dy, _sel(b, _cmp(b, "LessOrEqual", x, -3), 0, middle, x))


def _elu_grad(b, n, dy, x, y):
    # x <= 0: alpha * exp(x) = y + alpha
    return _scaled(b, dy, _sel(b, _cmp(b, "Greater", x, 0), 1, b.op("Add", [y, _k(b, x, n.attrs["alpha"])]), x))


def _selu_grad(b, n, dy, x, y):
    # x <= 0: gamma * alpha * exp(x) = y + gamma * alpha
    gamma, alpha = n.attrs["gamma"], n.attrs["alpha"]
    return _scaled(b, dy, _sel(b, _cmp(b, "Greater", x, 0), gamma, b.op("Add", [y, _k(b, x, gamma * alpha)]), x))


def _celu_grad(b, n, dy, x, y):
    # x <= 0: exp(x / alpha) = y / alpha + 1
    neg = b.op("Add", [b.op("Mul", [y, _k(b, x, 1 / n.attrs["alpha"])]), _k(b, x, 1)])
    return _scaled(b, dy, _sel(b, _cmp(b, "Greater", x, 0), 1, neg, x))


def _softsign_grad(b, n, dy, x, y):
    t = b.op("Add", [b.op("Abs", [x]), _k(b, x, 1)])
    return [b.op("Div", [dy, b.op("Mul", [t, t])])]


def _shrink_grad(b, n, dy, x, y):
    outside = b.op("Or", [_cmp(b, "Less", x, -n.attrs["lambd"]), _cmp(b, "Greater", x, n.attrs["lambd"])])
    return _scaled(b, dy, b.op("Cast", [outside], {"to": x.dtype}))


def _erf_grad(b, n, dy, x, y):
    gauss = b.op("Exp", [b.op("Neg", [b.op("Mul", [x, x])])])
    return _scaled(b, dy, b.op("Mul", [gauss, _k(b, x, 2 / math.sqrt(math.pi))]))


# the trigonometric ops: d/dx from (b, x, y, x^2, 1), each with its line of maths
TRIG = {
    "Sin": (lambda b, x, y, xx, one: b.op("Cos", [x]), "y = sin x;  dx = dy cos x"),
    "Cos": (lambda b, x, y, xx, one: b.op("Neg", [b.op("Sin", [x])]), "y = cos x;  dx = -dy sin x"),
    "Tan": (lambda b, x, y, xx, one: b.op("Add", [b.op("Mul", [y, y]), one]), "y = tan x;  dx = dy (1 + y^2)"),
    "Asin": (lambda b, x, y, xx, one: b.op("Reciprocal", [b.op("Sqrt", [b.op("Sub", [one, xx])])]),
             "y = asin x;  dx = dy / sqrt(1 - x^2)"),
    "Acos": (lambda b, x, y, xx, one: b.op("Neg", [b.op("Reciprocal", [b.op("Sqrt", [b.op("Sub", [one, xx])])])]),
             "y = acos x;  dx = -dy / sqrt(1 - x^2)"),
    "Atan": (lambda b, x, y, xx, one: b.op("Reciprocal", [b.op("Add", [xx, one])]), "y = atan x;  dx = dy / (1 + x^2)"),
    "Sinh": (lambda b, x, y, xx, one: b.op("Cosh", [x]), "y = sinh x;  dx = dy cosh x"),
    "Cosh": (lambda b, x, y, xx, one: b.op("Sinh", [x]), "y = cosh x;  dx = dy sinh x"),
    "Asinh": (lambda b, x, y, xx, one: b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [xx, one])])]),
              "y = asinh x;  dx = dy / sqrt(x^2 + 1)"),
    "Acosh": (lambda b, x, y, xx, one: b.op("Reciprocal", [b.op("Sqrt", [b.op("Sub", [xx, one])])]),
              "y = acosh x;  dx = dy / sqrt(x^2 - 1)"),
    "Atanh": (lambda b, x, y, xx, one: b.op("Reciprocal", [b.op("Sub", [one, xx])]),
              "y = atanh x;  dx = dy / (1 - x^2)"),
}


def _trig_grad(b, n, dy, x, y):
    return _scaled(b, dy, TRIG[n.op][0](b, x, y, b.op("Mul", [x, x]), _k(b, x, 1)))


# Unary maths:  name, C expression of a, numpy, gradient (b, node, dy, x, y) -> [dx], one line of maths
# NaN propagates as IEEE says: comparisons are written so that a NaN takes the branch that returns it (OpenCL's
# max/min/clamp return the non-NaN operand, so none of them touch data)
# Relu's gradient tests y > 0 (true exactly where x > 0): y is kept for the next layer anyway, so x is read once and
# its producer (BatchNormalization's affine, a residual Add) fuses with the Relu
_pointwise("Relu", 1, lambda at, a, T: f"({a[0]} < 0 ? ({T})0 : {a[0]})", lambda at, x: np.maximum(x, 0),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, b.op("Cast", [b.op("Greater", [y, b.const(np.zeros((), y.dtype))])],
                                                        {"to": y.dtype})])],
           doc="y = max(x, 0);  dx = dy * (x > 0)  (0 at x = 0, as PyTorch)")
_pointwise("LeakyRelu", 1, lambda at, a, T: f"({a[0]} >= 0 ? {a[0]} : {a[0]} * {lit(at['alpha'], T)})",
           lambda at, x: np.where(x >= 0, x, x * at["alpha"]), _leaky_relu_grad, attrs={"alpha": 0.01},
           doc="y = x >= 0 ? x : alpha x;  dx = dy * (x > 0 ? 1 : alpha)  (alpha at x = 0, as PyTorch)")
_pointwise("Sigmoid", 1, lambda at, a, T: f"(({T})1 / (({T})1 + exp(-{a[0]})))", lambda at, x: 1 / (1 + np.exp(-x)),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, b.op("Mul", [y, b.op("Sub", [b.const(np.ones((), y.dtype)),
                                                                                      y])])])],
           doc="y = 1 / (1 + exp(-x));  dx = dy y (1 - y)")
_pointwise("Tanh", 1, lambda at, a, T: f"tanh({a[0]})", lambda at, x: np.tanh(x),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, b.op("Sub", [b.const(np.ones((), y.dtype)),
                                                                 b.op("Mul", [y, y])])])],
           doc="y = tanh x;  dx = dy (1 - y^2)")
_pointwise("HardSigmoid", 1, lambda at, a, T: _clamp01(f"({lit(at['alpha'], T)} * {a[0]} + {lit(at['beta'], T)})", T),
           lambda at, x: np.clip(at["alpha"] * x + at["beta"], 0, 1), _hard_sigmoid_grad,
           attrs={"alpha": 0.2, "beta": 0.5},
           doc="y = clip(alpha x + beta, 0, 1);  dx = dy * (0 < y < 1 ? alpha : 0)  (0 at both kinks, as PyTorch)")
_pointwise("HardSwish", 1, lambda at, a, T: f"({a[0]} * {_clamp01(f'({a[0]} / ({T})6 + ({T})0.5)', T)})",
           lambda at, x: x * np.clip(x / 6 + 0.5, 0, 1), _hard_swish_grad,
           doc="y = x clip(x / 6 + 1/2, 0, 1);  dx = dy * (x <= -3 ? 0 : x < 3 ? x / 3 + 1/2 : 1)  (PyTorch's kinks)")
_pointwise("Elu", 1, lambda at, a, T: f"({a[0]} > 0 ? {a[0]} : {lit(at['alpha'], T)} * (exp({a[0]}) - ({T})1))",
           lambda at, x: np.where(x > 0, x, at["alpha"] * (np.exp(x) - 1)), _elu_grad, attrs={"alpha": 1.0},
           doc="y = x > 0 ? x : alpha (exp x - 1);  dx = dy * (x > 0 ? 1 : alpha exp x)  (alpha at 0, as PyTorch)")
_pointwise("Selu", 1, lambda at, a, T: f"({lit(at['gamma'], T)} * ({a[0]} > 0 ? {a[0]} : "
                                       f"{lit(at['alpha'], T)} * (exp({a[0]}) - ({T})1)))",
           lambda at, x: at["gamma"] * np.where(x > 0, x, at["alpha"] * (np.exp(x) - 1)), _selu_grad,
           attrs={"alpha": 1.6732632423543772, "gamma": 1.0507009873554805},
           doc="y = gamma (x > 0 ? x : alpha (exp x - 1));  dx = dy gamma (x > 0 ? 1 : alpha exp x)  (as PyTorch)")
_pointwise("Celu", 1, lambda at, a, T: f"({a[0]} > 0 ? {a[0]} : {lit(at['alpha'], T)} * "
                                       f"(exp({a[0]} / {lit(at['alpha'], T)}) - ({T})1))",
           lambda at, x: np.maximum(0, x) + np.minimum(0, at["alpha"] * (np.exp(x / at["alpha"]) - 1)), _celu_grad,
           attrs={"alpha": 1.0},
           doc="y = max(0, x) + min(0, alpha (exp(x / alpha) - 1));  dx = dy * (x > 0 ? 1 : exp(x / alpha))  "
               "(1 at 0, as PyTorch)")
_pointwise("ThresholdedRelu", 1, lambda at, a, T: f"({a[0]} > {lit(at['alpha'], T)} ? {a[0]} : ({T})0)",
           lambda at, x: np.where(x > at["alpha"], x, 0),
           lambda b, n, dy, x, y: _scaled(b, dy, b.op("Cast", [_cmp(b, "Greater", x, n.attrs["alpha"])],
                                                        {"to": x.dtype})),
           attrs={"alpha": 1.0}, doc="y = x > alpha ? x : 0;  dx = dy * (x > alpha)  (0 at alpha, as PyTorch's "
                                     "threshold)")
_pointwise("Softplus", 1, lambda at, a, T: f"({a[0]} > ({T})20 ? {a[0]} : log1p(exp({a[0]})))",
           lambda at, x: np.logaddexp(0, x),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, b.op("Sigmoid", [x])])],
           doc="y = log(1 + exp x);  dx = dy sigmoid x")
_pointwise("Softsign", 1, lambda at, a, T: f"({a[0]} / (({T})1 + fabs({a[0]})))", lambda at, x: x / (1 + np.abs(x)),
           _softsign_grad, doc="y = x / (1 + |x|);  dx = dy / (1 + |x|)^2")


def _shrink_c(at, a, T):
    lambd, bias = lit(at["lambd"], T), lit(at["bias"], T)
    return f"({a[0]} < -{lambd} ? {a[0]} + {bias} : ({a[0]} > {lambd} ? {a[0]} - {bias} : ({T})0))"


_pointwise("Shrink", 1, _shrink_c,
           lambda at, x: np.where(x < -at["lambd"], x + at["bias"], np.where(x > at["lambd"], x - at["bias"], 0)),
           _shrink_grad, attrs={"lambd": 0.5, "bias": 0.0},
           doc="y = x < -lambd ? x + bias : x > lambd ? x - bias : 0;  dx = dy * (|x| > lambd)  (0 at +-lambd, as "
               "PyTorch's hard/softshrink)")
_pointwise("Exp", 1, lambda at, a, T: f"exp({a[0]})", lambda at, x: np.exp(x),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, y])])
_pointwise("Log", 1, lambda at, a, T: f"log({a[0]})", lambda at, x: np.log(x),
           lambda b, n, dy, x, y: [b.op("Div", [dy, x])])
_pointwise("Sqrt", 1, lambda at, a, T: f"sqrt({a[0]})", lambda at, x: np.sqrt(x),
           lambda b, n, dy, x, y: [b.op("Div", [dy, b.op("Mul", [y, b.const(np.asarray(2, y.dtype))])])])
_pointwise("Abs", 1, lambda at, a, T: f"({a[0]} < 0 ? -{a[0]} : {a[0]})", lambda at, x: np.abs(x),
           lambda b, n, dy, x, y: [b.op("Mul", [dy, b.op("Sign", [x])])], doc="y = |x|;  dx = dy sign x  (0 at 0)")
_pointwise("Neg", 1, lambda at, a, T: f"(-{a[0]})", lambda at, x: -x, lambda b, n, dy, x, y: [b.op("Neg", [dy])])
_pointwise("Reciprocal", 1, lambda at, a, T: f"(({T})1 / {a[0]})", lambda at, x: 1 / x,
           lambda b, n, dy, x, y: [b.op("Neg", [b.op("Mul", [dy, b.op("Mul", [y, y])])])])
_pointwise("Erf", 1, lambda at, a, T: f"erf({a[0]})", lambda at, x: _erf_np(x), _erf_grad,
           doc="y = erf x;  dx = dy 2 / sqrt(pi) exp(-x^2)")


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
           lambda at, x: np.sign(x),
           differentiable=False, doc="y = sign x;  piecewise constant: no gradient path (PyTorch: 0)")
_pointwise("Floor", 1, lambda at, a, T: f"floor({a[0]})", lambda at, x: np.floor(x),
           differentiable=False, doc="y = floor x;  piecewise constant")
_pointwise("Ceil", 1, lambda at, a, T: f"ceil({a[0]})", lambda at, x: np.ceil(x),
           differentiable=False, doc="y = ceil x;  piecewise constant")
_pointwise("Round", 1, lambda at, a, T: f"rint({a[0]})", lambda at, x: np.round(x),  # half to even, as ONNX
           differentiable=False, doc="y = round x;  piecewise constant")
def _round_bfloat16_c(at, a, T):
    """float32 -> the nearest bfloat16 (ties to even), still float32: the low 16 bits rounded off; NaN kept."""
    x = f"((float)({a[0]}))"
    return f"({x} != {x} ? {x} : as_float((as_uint({x}) + 0x7fffu + ((as_uint({x}) >> 16) & 1u)) & 0xffff0000u))"


def _round_bfloat16_np(at, x):
    import ml_dtypes  # (numpy's bfloat16: onnx's dependency)
    return x.astype(ml_dtypes.bfloat16).astype(x.dtype)


_pointwise("RoundBfloat16", 1, _round_bfloat16_c, _round_bfloat16_np, lambda b, n, dy, x, y: [dy],
           doc="y = x rounded to bfloat16 (a float32 holding a bfloat16 value);  dx = dy (straight through)")
for _name, _fn in [("Sin", "sin"), ("Cos", "cos"), ("Tan", "tan"), ("Asin", "asin"), ("Acos", "acos"),
                   ("Atan", "atan"), ("Sinh", "sinh"), ("Cosh", "cosh"), ("Asinh", "asinh"), ("Acosh", "acosh"),
                   ("Atanh", "atanh")]:
    _npf = {"Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan, "Asinh": np.arcsinh, "Acosh": np.arccosh,
            "Atanh": np.arctanh}.get(_name) or getattr(np, _fn)
    _pointwise(_name, 1, (lambda f: lambda at, a, T: f"{f}({a[0]})")(_fn), (lambda f: lambda at, x: f(x))(_npf),
               _trig_grad, doc=TRIG[_name][1])
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
           attrs={"min": None, "max": None},  # None: unbounded
           doc="y = min(max(x, lo), hi);  dx = dy * (lo <= x <= hi)  (1 at the bounds, as PyTorch's clamp)")


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


def _pow_grad(b, n, dy, x, p, y):
    pf = p if p.dtype == x.dtype else b.op("Cast", [p], {"to": x.dtype})
    slope = b.op("Mul", [pf, b.op("Pow", [x, b.op("Sub", [pf, _k(b, x, 1)])])])
    if p.const is None or np.any(p.const == 0):  # PyTorch: 0 where p = 0 (not 0 * 0^-1 at x = 0)
        slope = _sel(b, _cmp(b, "Equal", pf, 0), 0, slope, x)
    dp = None
    if p.dtype in FLOATS:
        dlog = b.op("Mul", [y, b.op("Log", [x])])
        if x.const is None or np.any(x.const == 0):  # PyTorch: 0 where x = 0 and p >= 0
            dlog = _sel(b, b.op("And", [_cmp(b, "Equal", x, 0), _cmp(b, "GreaterOrEqual", pf, 0)]), 0, dlog, x)
        dp = b.op("Mul", [dy, dlog])
    return [b.op("Mul", [dy, slope]), dp]


def _extremum_grad(b, n, dy, x, z, y):
    """Max / Min: dy to the input that wins; ties split it in halves (PyTorch's maximum / minimum)"""
    wins = _cmp(b, "Greater" if n.op == "Max" else "Less", x, z)
    share = _sel(b, wins, 1, _sel(b, _cmp(b, "Equal", x, z), 0.5, 0, x), x)
    return [b.op("Mul", [dy, share]), b.op("Mul", [dy, b.op("Sub", [_k(b, x, 1), share])])]


def _mod_grad(b, n, dy, x, z, y):
    q = b.op("Div", [x, z])
    if n.attrs["fmod"]:  # trunc(x / z)
        q = _sel(b, _cmp(b, "Less", q, 0), b.op("Ceil", [q]), b.op("Floor", [q]), x)
    else:
        q = b.op("Floor", [q])
    return [dy, b.op("Neg", [b.op("Mul", [dy, q])])]


def _prelu_grad(b, n, dy, x, s, y):
    positive = _cmp(b, "Greater", x, 0)
    return [b.op("Mul", [dy, _sel(b, positive, 1, s, x)]), b.op("Mul", [dy, _sel(b, positive, 0, x, x)])]


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
           f"(({T})pow((double){a[0]}, (double){a[1]}))", lambda at, x, y: np.power(_f(x), y).astype(x.dtype),
           _pow_grad, doc="y = x^p;  dx = dy p x^(p - 1) (0 where p = 0), dp = dy y log x (0 where x = 0 and p >= 0; "
                          "as PyTorch)")
_pointwise("Max", 2, lambda at, a, T: f"({a[0]} > {a[1]} || isnan((float){a[0]}) ? {a[0]} : {a[1]})",
           lambda at, x, y: np.maximum(x, y), _extremum_grad,
           doc="y = max(a, b);  da = dy * (a > b ? 1 : a = b ? 1/2 : 0), db = dy - da  (ties split, as PyTorch)")
_pointwise("Min", 2, lambda at, a, T: f"({a[0]} < {a[1]} || isnan((float){a[0]}) ? {a[0]} : {a[1]})",
           lambda at, x, y: np.minimum(x, y), _extremum_grad,
           doc="y = min(a, b);  da = dy * (a < b ? 1 : a = b ? 1/2 : 0), db = dy - da  (ties split, as PyTorch)")
_pointwise("Mod", 2, lambda at, a, T: (f"fmod({a[0]}, {a[1]})" if at["fmod"] else _float_mod_c(a, T))
           if T in ("float", "double")
           else (f"({a[0]} % {a[1]})" if at["fmod"] else
                 f"((({a[0]} % {a[1]}) + {a[1]}) % {a[1]})"),
           lambda at, x, y: np.fmod(x, y) if at["fmod"] else np.mod(x, y), _mod_grad, attrs={"fmod": 0},
           doc="y = x - z * floor(x / z) (fmod: trunc);  dx = dy, dz = -dy floor(x / z) (trunc)  (PyTorch's "
               "remainder / fmod)")
_pointwise("PRelu", 2, lambda at, a, T: f"({a[0]} < 0 ? {a[0]} * {a[1]} : {a[0]})",
           lambda at, x, s: np.where(x < 0, x * s, x), _prelu_grad,
           doc="y = x < 0 ? s x : x;  dx = dy * (x > 0 ? 1 : s), ds = dy * (x > 0 ? 0 : x)  (slope s at 0, as "
               "PyTorch)")
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

    def grad(self, b, node, dys):
        cond, dy = node.inputs[0], dys[0]
        zero = _k(b, dy, 0)
        return [None, b.op("Where", [cond, dy, zero]), b.op("Where", [cond, zero, dy])]


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
