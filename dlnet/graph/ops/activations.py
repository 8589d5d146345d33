"""Pointwise ops of the newer op-sets: GELU's tanh form (Gelu-20 approximate="tanh"), Mish (18), Swish (24), and the
bitwise integer ops (18). Rows of elementwise.py's table: C expression, numpy maths (folding); no gradients yet."""
import math

import numpy as np

from .elementwise import FLOATS, _pointwise, lit

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


_floats = [
    # y = x Phi(x) with Phi by tanh (op-set 20 approximate="tanh"); the exact form is elementwise.py's Gelu
    _pointwise("GeluTanh", 1, _gelu_tanh_c, _gelu_tanh_np),
    # y = x tanh(softplus(x))
    _pointwise("Mish", 1, lambda at, a, T: f"({a[0]} * tanh({_softplus_c(a[0], T)}))",
               lambda at, x: x * np.tanh(np.logaddexp(0, x))),
    # y = x sigmoid(alpha x)
    _pointwise("Swish", 1, lambda at, a, T: f"({a[0]} / (({T})1 + exp(-{lit(at['alpha'], T)} * {a[0]})))",
               lambda at, x: x / (1 + np.exp(-at["alpha"] * x)), attrs={"alpha": 1.0}),
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
