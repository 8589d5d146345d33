"""Pointwise ops of the newer op-sets: GELU's tanh form (Gelu-20 approximate="tanh"), Mish (18), Swish (24), and the
bitwise integer ops (18). Rows of elementwise.py's table: C expression, numpy maths (folding), gradient (pointwise
nodes: a rule fuses into one kernel)."""
import math

import numpy as np

from .elementwise import FLOATS, _k, _pointwise, lit

INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")

_TANH_C = math.sqrt(2.0 / math.pi)  # GELU's tanh form: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))


def _gelu_tanh_c(at, a, T):
    x = a[0]
    return (f"({x} * ({T})0.5 * (({T})1 + tanh({lit(_TANH_C, T)} * ({x} + {lit(0.044715, T)} * {x} * {x} * {x}))))")


def _gelu_tanh_np(at, x):
    return x * 0.5 * (1 + np.tanh(_TANH_C * (x + 0.044715 * x ** 3)))


def _softplus_c(x, T):
    """log(1 + e^x), x itself past 20 (where float32's log1p(exp(x)) is x already; exp would overflow past 88)."""
    return f"({x} > ({T})20 ? {x} : log1p(exp({x})))"


def _gelu_tanh_grad(b, n, dy, x, y):
    # t = tanh(u), u = c (x + 0.044715 x^3):  d/dx = (1 + t) / 2 + x / 2 (1 - t^2) c (1 + 3 * 0.044715 x^2)
    xx = b.op("Mul", [x, x])
    u = b.op("Mul", [b.op("Add", [x, b.op("Mul", [b.op("Mul", [xx, x]), _k(b, x, 0.044715)])]), _k(b, x, _TANH_C)])
    t = b.op("Tanh", [u])
    du = b.op("Add", [b.op("Mul", [xx, _k(b, x, 3 * 0.044715 * _TANH_C)]), _k(b, x, _TANH_C)])
    sech2 = b.op("Sub", [_k(b, x, 1), b.op("Mul", [t, t])])
    slope = b.op("Add", [b.op("Mul", [b.op("Add", [t, _k(b, x, 1)]), _k(b, x, 0.5)]),
                         b.op("Mul", [b.op("Mul", [b.op("Mul", [x, _k(b, x, 0.5)]), sech2]), du])])
    return [b.op("Mul", [dy, slope])]


def _mish_grad(b, n, dy, x, y):
    # t = tanh(softplus x):  d/dx = t + x (1 - t^2) sigmoid(x)
    t = b.op("Tanh", [b.op("Softplus", [x])])
    sech2 = b.op("Sub", [_k(b, x, 1), b.op("Mul", [t, t])])
    return [b.op("Mul", [dy, b.op("Add", [t, b.op("Mul", [b.op("Mul", [x, sech2]), b.op("Sigmoid", [x])])])])]


def _swish_grad(b, n, dy, x, y):
    # s = sigmoid(alpha x):  d/dx = s + alpha x s (1 - s) = s + alpha y (1 - s)
    s = b.op("Sigmoid", [b.op("Mul", [x, _k(b, x, n.attrs["alpha"])])])
    tail = b.op("Mul", [b.op("Mul", [y, _k(b, x, n.attrs["alpha"])]), b.op("Sub", [_k(b, x, 1), s])])
    return [b.op("Mul", [dy, b.op("Add", [s, tail])])]


_floats = [
    # exact form: elementwise.py's Gelu
    _pointwise("GeluTanh", 1, _gelu_tanh_c, _gelu_tanh_np, _gelu_tanh_grad,
               doc="y = x / 2 (1 + tanh u), u = sqrt(2 / pi) (x + 0.044715 x^3)  (Gelu-20 approximate='tanh');  "
                   "dx = dy ((1 + tanh u) / 2 + x / 2 (1 - tanh^2 u) du/dx)"),
    _pointwise("Mish", 1, lambda at, a, T: f"({a[0]} * tanh({_softplus_c(a[0], T)}))",
               lambda at, x: x * np.tanh(np.logaddexp(0, x)), _mish_grad,
               doc="y = x tanh(softplus x);  dx = dy (t + x (1 - t^2) sigmoid x), t = tanh(softplus x)"),
    _pointwise("Swish", 1, lambda at, a, T: f"({a[0]} / (({T})1 + exp(-{lit(at['alpha'], T)} * {a[0]})))",
               lambda at, x: x / (1 + np.exp(-at["alpha"] * x)), _swish_grad, attrs={"alpha": 1.0},
               doc="y = x sigmoid(alpha x);  dx = dy (s + alpha y (1 - s)), s = sigmoid(alpha x)"),
]
_ints = [
    _pointwise("BitwiseAnd", 2, lambda at, a, T: f"({a[0]} & {a[1]})", lambda at, x, y: np.bitwise_and(x, y)),
    _pointwise("BitwiseOr", 2, lambda at, a, T: f"({a[0]} | {a[1]})", lambda at, x, y: np.bitwise_or(x, y)),
    _pointwise("BitwiseXor", 2, lambda at, a, T: f"({a[0]} ^ {a[1]})", lambda at, x, y: np.bitwise_xor(x, y)),
    _pointwise("BitwiseNot", 1, lambda at, a, T: f"(({T})~{a[0]})", lambda at, x: np.bitwise_not(x)),
]
for _cls in _floats:
    _cls.dtypes = FLOATS  # a kernel of any other dtype would not compile: the Builder names node and dtype
for _cls in _ints:
    _cls.dtypes = INTS
