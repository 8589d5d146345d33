"""Sampling at computed positions: GridSample (16, 20, 22) and AffineGrid (20)."""
import numpy as np

from ..errors import ModelError
from .common import HANDLERS, const, handler, reshape

FLOATS = ("float32", "float64", "float16")


def _f32(b, v):
    return v if v.dtype == "float32" else b.op("Cast", [v], {"to": "float32"})


@handler("GridSample", 16, 20, 22)
def _grid_sample(imp, node, xs, at):
    """Op-set 16 names the modes bilinear / bicubic and takes 4-D input only; 20 names them linear / cubic and takes
    any spatial rank (dlnet: 1 to 3); 22 adds types. Computed in float32."""
    b = imp.b
    x, grid = xs
    mode = at.get("mode", "bilinear" if imp.opset < 20 else "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode) if imp.opset < 20 else mode
    padding = at.get("padding_mode", "zeros")
    if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise ModelError(f"mode {at.get('mode')!r} / padding_mode {padding!r}: expected nearest, linear or cubic "
                         "(bilinear or bicubic before op-set 20) and zeros, border or reflection")
    if imp.opset < 20 and x.rank != 4:
        raise ModelError(f"op-set {imp.opset} takes 4-D input only, got {list(x.shape)}")
    for v in (x, grid):
        if v.dtype not in FLOATS:
            raise ModelError(f"dtype {v.dtype} is not supported (supported: {', '.join(FLOATS)})")
    y = b.op("GridSample", [_f32(b, x), _f32(b, grid)], {"mode": mode, "padding_mode": padding,
                                                        "align_corners": at.get("align_corners", 0)})
    return [y if x.dtype == "float32" else b.op("Cast", [y], {"to": x.dtype})]


def _base_grid(sizes, align_corners):
    """[prod(sizes), r + 1]: each position's normalised coordinates, innermost dim first, then 1."""
    axes = []
    for n in sizes:
        if align_corners:
            axes.append(np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1))  # (-1 alone where n = 1)
        else:
            axes.append((2.0 * np.arange(n) + 1.0) / n - 1.0)
    mesh = np.meshgrid(*axes, indexing="ij")
    coords = [m.reshape(-1) for m in mesh[::-1]]
    return np.stack(coords + [np.ones_like(coords[0])], axis=1).astype(np.float32)


@handler("AffineGrid", 20)
def _affine_grid(imp, node, xs, at):
    """grid[n, o] = theta[n] @ (the normalised position of o, 1): a product with a constant grid of positions."""
    b = imp.b
    theta = xs[0]
    size = [int(s) for s in np.asarray(const(xs[1], "AffineGrid's size")).reshape(-1)]
    sizes = size[2:]
    r = len(sizes)
    if r not in (2, 3) or theta.shape != (size[0], r, r + 1):
        raise ModelError(f"theta {list(theta.shape)} for size {size}: expected [N, 2, 3] and [N, C, H, W], or "
                         "[N, 3, 4] and [N, C, D, H, W]")
    if theta.dtype not in FLOATS:
        raise ModelError(f"dtype {theta.dtype} is not supported (supported: {', '.join(FLOATS)})")
    base = b.const(_base_grid(sizes, at.get("align_corners", 0)))
    theta_t = b.op("Transpose", [_f32(b, theta)], {"perm": (0, 2, 1)})
    grid = HANDLERS["MatMul"][13](imp, None, [base, theta_t], {})[0]
    grid = reshape(b, grid, (size[0], *sizes, r))
    return [grid if theta.dtype == "float32" else b.op("Cast", [grid], {"to": theta.dtype})]
