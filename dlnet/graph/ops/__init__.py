"""The op registry. Each op is one class: inputs/attributes, type inference, numpy folding, lowering, gradient."""
from . import (  # noqa: F401  (registration)
    activations,
    attention,
    elementwise,
    fused,
    grad_nn,
    host,
    linalg,
    nn,
    normalization,
    reduce,
    roi,
    sampling,
    shape,
    transformer,
)
from .base import OPS, REQUIRED, Op, get_op, ones, register, zero_pads

__all__ = ["OPS", "REQUIRED", "Op", "get_op", "ones", "register", "zero_pads"]
