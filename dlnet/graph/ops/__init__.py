"""The op registry. Each op is one class: inputs/attributes, type inference, numpy folding, lowering, gradient."""
from . import elementwise, fused, grad_nn, host, linalg, nn, reduce, roi, shape  # noqa: F401  (registration)
from .base import OPS, REQUIRED, Op, get_op, ones, register, zero_pads

__all__ = ["OPS", "REQUIRED", "Op", "get_op", "ones", "register", "zero_pads"]
