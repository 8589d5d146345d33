"""Data-movement ops: views (Reshape), strided copies (Transpose, Slice, Expand, Concat), Gather, Pad."""
import numpy as np

from .base import REQUIRED, Op, register


@register
class Reshape(Op):
    """y = x viewed with another shape (no copy);  dx = reshape(dy, x.shape)"""
    name = "Reshape"
    kind = "alias"
    attrs = {"shape": REQUIRED}

    def infer(self, node):
        shape = tuple(node.attrs["shape"])
        if int(np.prod(shape, dtype=np.int64)) != node.inputs[0].size:
            raise ValueError(f"cannot reshape {list(node.inputs[0].shape)} to {list(shape)}")
        return [(node.inputs[0].dtype, shape)]

    def numpy(self, node, x):
        return [x.reshape(node.attrs["shape"])]

    def lower(self, node, lw):
        lw.alias(node.outputs[0], node.inputs[0])

    def grad(self, b, node, dys):
        return [b.op("Reshape", [dys[0]], {"shape": node.inputs[0].shape})]


@register
class SliceView(Op):
    """y = x's elements [offset, offset + y.size) with `shape` (no copy: a Slice or Gather whose result is contiguous
    in x, made a view by layout.slices_as_views);  dx = zeros with that range = dy"""
    name = "SliceView"
    kind = "alias"
    attrs = {"offset": REQUIRED, "shape": REQUIRED}

    def infer(self, node):
        x, shape, offset = node.inputs[0], tuple(node.attrs["shape"]), node.attrs["offset"]
        if offset < 0 or offset + int(np.prod(shape, dtype=np.int64)) > x.size:
            raise ValueError(f"a view of {list(shape)} at {offset} lies outside {list(x.shape)}")
        return [(x.dtype, shape)]

    def numpy(self, node, x):
        shape = node.attrs["shape"]
        return [x.reshape(-1)[node.attrs["offset"]:][:int(np.prod(shape, dtype=np.int64))].reshape(shape)]

    def lower(self, node, lw):
        lw.alias(node.outputs[0], node.inputs[0])

    def view_offset(self, node):
        return node.attrs["offset"]

    def grad(self, b, node, dys):
        x, n = node.inputs[0], node.outputs[0].size
        flat = b.op("Reshape", [dys[0]], {"shape": (n,)})
        dx = b.op("SliceGrad", [flat], {"starts": (node.attrs["offset"],), "counts": (n,), "steps": (1,),
                                         "in_shape": (x.size,)})
        return [b.op("Reshape", [dx], {"shape": x.shape})]


@register
class Transpose(Op):
    """y = x.transpose(perm);  dx = dy.transpose(argsort(perm))"""
    name = "Transpose"
    attrs = {"perm": REQUIRED}

    def infer(self, node):
        x = node.inputs[0]
        perm = node.attrs["perm"]
        return [(x.dtype, tuple(x.shape[p] for p in perm))]

    def numpy(self, node, x):
        return [np.transpose(x, node.attrs["perm"])]

    def lower(self, node, lw):
        x = node.inputs[0]
        strides = lw.strides(x)
        lw.copy(node.outputs[0], x, 0, [strides[p] for p in node.attrs["perm"]])

    def grad(self, b, node, dys):
        return [b.op("Transpose", [dys[0]], {"perm": tuple(int(i) for i in np.argsort(node.attrs["perm"]))})]


@register
class TransposeView(Op):
    """y = x.transpose(perm) read in place (no copy): only products read it, through its strides
    (transformer.element_strides); made after autodiff (transposes.transposes_into_product_views): no rule"""
    name = "TransposeView"
    kind = "alias"
    attrs = {"perm": REQUIRED}

    def infer(self, node):
        return Transpose.infer(self, node)

    def numpy(self, node, x):
        return [np.transpose(x, node.attrs["perm"])]

    def lower(self, node, lw):
        lw.alias(node.outputs[0], node.inputs[0])


@register
class Slice(Op):
    """y = x[starts[d] : : steps[d]] taking counts[d] elements per axis (normalised by the importer)."""
    name = "Slice"
    attrs = {"starts": REQUIRED, "counts": REQUIRED, "steps": REQUIRED}

    def infer(self, node):
        return [(node.inputs[0].dtype, tuple(node.attrs["counts"]))]

    def numpy(self, node, x):
        idx = tuple(slice(s, s + c * st if s + c * st >= 0 else None, st)
                    for s, c, st in zip(node.attrs["starts"], node.attrs["counts"], node.attrs["steps"]))
        return [x[idx]]

    def lower(self, node, lw):
        x = node.inputs[0]
        strides = lw.strides(x)
        offset = sum(s * st for s, st in zip(node.attrs["starts"], strides))
        lw.copy(node.outputs[0], x, offset, [st * step for st, step in zip(strides, node.attrs["steps"])])

    def grad(self, b, node, dys):
        return [b.op("SliceGrad", [dys[0]], dict(node.attrs, in_shape=node.inputs[0].shape))]


@register
class SliceGrad(Op):
    """dx = zeros(in_shape) with dx[slice] = dy  (the gradient of Slice, a strided scatter)"""
    name = "SliceGrad"
    attrs = dict(Slice.attrs, in_shape=REQUIRED)

    def infer(self, node):
        return [(node.inputs[0].dtype, tuple(node.attrs["in_shape"]))]

    def lower(self, node, lw):
        y = node.outputs[0]
        lw.fill(y, 0)
        strides = lw.strides(y)
        offset = sum(s * st for s, st in zip(node.attrs["starts"], strides))
        lw.copy_into(y, offset, [st * step for st, step in zip(strides, node.attrs["steps"])], node.inputs[0])


@register
class Expand(Op):
    """y = broadcast_to(x, shape);  dx = sum of dy over the broadcast axes (autodiff)"""
    name = "Expand"
    attrs = {"shape": REQUIRED}

    def infer(self, node):
        return [(node.inputs[0].dtype, tuple(node.attrs["shape"]))]

    def numpy(self, node, x):
        return [np.broadcast_to(x, node.attrs["shape"]).copy()]

    def lower(self, node, lw):
        lw.pointwise_single("Identity", node.outputs[0], [node.inputs[0]])

    def grad(self, b, node, dys):
        return [dys[0]]  # autodiff reduces broadcast gradients to the input shape


@register
class Concat(Op):
    """y = concat(xs, axis);  dx_i = slice of dy"""
    name = "Concat"
    attrs = {"axis": REQUIRED}

    def infer(self, node):
        axis = node.attrs["axis"]
        first = node.inputs[0]
        shape = list(first.shape)
        shape[axis] = sum(v.shape[axis] for v in node.inputs)
        for v in node.inputs:
            if v.rank != first.rank or any(a != b for d, (a, b) in enumerate(zip(v.shape, first.shape)) if d != axis):
                raise ValueError(f"Concat inputs {[list(v.shape) for v in node.inputs]} differ off axis {axis}")
        return [(first.dtype, tuple(shape))]

    def numpy(self, node, *xs):
        return [np.concatenate(xs, axis=node.attrs["axis"])]

    def lower(self, node, lw):
        y = node.outputs[0]
        axis = node.attrs["axis"]
        ystrides = lw.strides(y)
        start = 0
        for x in node.inputs:
            if not lw.written_in_place(x, y):
                lw.copy_into(y, start * ystrides[axis], ystrides, x)
            start += x.shape[axis]

    def grad(self, b, node, dys):
        axis = node.attrs["axis"]
        grads, start = [], 0
        y = node.outputs[0]
        for x in node.inputs:
            starts = [0] * y.rank
            starts[axis] = start
            grads.append(b.op("Slice", [dys[0]], {"starts": tuple(starts), "steps": (1,) * y.rank,
                                                  "counts": x.shape}))
            start += x.shape[axis]
        return grads


@register
class Gather(Op):
    """y = take(x, indices, axis)  (negative indices count from the end)"""
    name = "Gather"
    attrs = {"axis": REQUIRED}

    def infer(self, node):
        x, idx = node.inputs
        axis = node.attrs["axis"]
        return [(x.dtype, x.shape[:axis] + idx.shape + x.shape[axis + 1:])]

    def numpy(self, node, x, idx):
        return [np.take(x, idx.astype(np.int64), axis=node.attrs["axis"])]

    def lower(self, node, lw):
        lw.gather(node)

    def grad(self, b, node, dys):
        return [b.op("GatherGrad", [dys[0], node.inputs[1]], {"axis": node.attrs["axis"],
                                                               "in_shape": node.inputs[0].shape}), None]


@register
class GatherGrad(Op):
    """dx = zeros(in_shape); dx[idx] += dy along axis (scatter-add)"""
    name = "GatherGrad"
    attrs = {"axis": REQUIRED, "in_shape": REQUIRED}

    def infer(self, node):
        return [(node.inputs[0].dtype, tuple(node.attrs["in_shape"]))]

    def lower(self, node, lw):
        lw.gather_grad(node)


@register
class Pad(Op):
    """y = pad(x, pads, mode, value)  with pads = begins + ends, modes constant/reflect/edge"""
    name = "Pad"
    attrs = {"pads": REQUIRED, "mode": "constant", "value": 0}  # pads: begins, then ends

    def infer(self, node):
        x = node.inputs[0]
        pads = node.attrs["pads"]
        r = x.rank
        return [(x.dtype, tuple(d + pads[i] + pads[i + r] for i, d in enumerate(x.shape)))]

    def numpy(self, node, x):
        r = x.ndim
        pads = node.attrs["pads"]
        width = [(pads[i], pads[i + r]) for i in range(r)]
        mode = node.attrs["mode"]
        if mode == "constant":
            return [np.pad(x, width, mode="constant", constant_values=node.attrs["value"])]
        return [np.pad(x, width, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])]

    def lower(self, node, lw):
        lw.pad(node)

    def grad(self, b, node, dys):
        x = node.inputs[0]
        r = x.rank
        pads = node.attrs["pads"]
        if node.attrs["mode"] != "constant" or any(p < 0 for p in pads):
            return [None]
        return [b.op("Slice", [dys[0]], {"starts": tuple(pads[:r]), "steps": (1,) * r, "counts": x.shape})]


def _norm_idx(idx, n):
    idx = idx.astype(np.int64)
    return np.where(idx < 0, idx + n, idx)


def _element_index(idx, shape, axis):
    """The full index tuple of every element of idx: its own coordinates with the axis one replaced by idx."""
    coords = list(np.indices(idx.shape))
    coords[axis] = _norm_idx(idx, shape[axis])
    return tuple(coords)


@register
class GatherElements(Op):
    """y[i] = x[i with axis coordinate idx[i]];  dx = GatherElementsGrad(dy, idx) (scatter-add)"""
    name = "GatherElements"
    attrs = {"axis": REQUIRED}

    def infer(self, node):
        return [(node.inputs[0].dtype, node.inputs[1].shape)]

    def numpy(self, node, x, idx):  # idx may be shorter than x off the axis (take_along_axis would broadcast it)
        return [x[_element_index(idx, x.shape, node.attrs["axis"])]]

    def lower(self, node, lw):
        lw.gather_elements(node)

    def grad(self, b, node, dys):
        x, idx = node.inputs
        return [b.op("GatherElementsGrad", [dys[0], idx], {"axis": node.attrs["axis"] % x.rank,
                                                            "in_shape": x.shape}), None]


@register
class GatherElementsGrad(Op):
    """dx = zeros(in_shape); dx[i with axis coordinate idx[i]] += dy[i]  (GatherElements' gradient; deterministic:
    each element of dx sums its own column of idx in order)"""
    name = "GatherElementsGrad"
    attrs = {"axis": REQUIRED, "in_shape": REQUIRED}

    def infer(self, node):
        dy, idx = node.inputs
        if dy.shape != idx.shape:
            raise ValueError(f"dy {list(dy.shape)} and indices {list(idx.shape)} differ")
        return [(dy.dtype, tuple(node.attrs["in_shape"]))]

    def numpy(self, node, dy, idx):
        dx = np.zeros(node.attrs["in_shape"], dy.dtype)
        np.add.at(dx, _element_index(idx, dx.shape, node.attrs["axis"]), dy)
        return [dx]

    def lower(self, node, lw):
        lw.gather_elements_grad(node)


@register
class ScatterElements(Op):
    """y = copy(x); y[j] (op)= upd[i] for j = i with axis coordinate idx[i], in index order;
    none: dx = dy where nothing is written, dupd = dy[j]  (PyTorch's scatter: each of repeated indices gets it);
    add: dx = dy, dupd = dy[j];  max/min: dy shared by x and the updates equal to y[j] (scatter_reduce amax);
    mul: dx = dy prod(upd to j), dupd = dy[j] x[j] prod(the other upd to j)  (no division by a zero update)"""
    name = "ScatterElements"
    attrs = {"axis": REQUIRED, "reduction": "none"}

    def infer(self, node):
        return [(node.inputs[0].dtype, node.inputs[0].shape)]

    def numpy(self, node, x, idx, upd):
        axis = node.attrs["axis"]
        y = x.copy()
        idx = _norm_idx(idx, x.shape[axis])
        red = node.attrs["reduction"]
        for i in np.ndindex(*idx.shape):
            j = list(i)
            j[axis] = idx[i]
            j = tuple(j)
            y[j] = {"none": lambda a, b: b, "add": np.add, "mul": np.multiply, "max": np.maximum,
                    "min": np.minimum}[red](y[j], upd[i])
        return [y]

    def lower(self, node, lw):
        lw.scatter_elements(node)

    def grad(self, b, node, dys):
        x, idx, upd = node.inputs
        dy = dys[0]
        axis = node.attrs["axis"] % x.rank
        red = node.attrs["reduction"]

        def k(v):
            return b.const(np.asarray(v, x.dtype))

        def gather(v):
            return b.op("GatherElements", [v, idx], {"axis": axis})

        def count(v):  # per element of x: the sum of v over the updates written there
            return b.op("GatherElementsGrad", [v, idx], {"axis": axis, "in_shape": x.shape})

        if red == "add":
            return [dy, None, gather(dy)]
        if red == "none":
            hit = count(b.const(np.ones(idx.shape, x.dtype)))
            return [b.op("Where", [b.op("Greater", [hit, k(0)]), k(0), dy]), None, gather(dy)]
        if red in ("max", "min"):
            y = node.outputs[0]
            won = b.op("Cast", [b.op("Equal", [upd, gather(y)])], {"to": x.dtype})
            kept = b.op("Cast", [b.op("Equal", [x, y])], {"to": x.dtype})
            share = b.op("Div", [dy, b.op("Add", [kept, count(won)])])
            return [b.op("Mul", [share, kept]), None, b.op("Mul", [gather(share), won])]
        return self._mul_grad(b, node, dy, k, gather, count)

    def _mul_grad(self, b, node, dy, k, gather, count):
        x, idx, upd = node.inputs
        attrs = dict(node.attrs, reduction="mul")
        zero = b.op("Equal", [upd, k(0)])
        # per element of x: how many zero updates, and x times the product of the non-zero ones
        zeros = gather(count(b.op("Cast", [zero], {"to": x.dtype})))
        rest = gather(b.op("Mul", [dy, b.op("ScatterElements", [x, idx, b.op("Where", [zero, k(1), upd])], attrs)]))
        dupd = b.op("Where", [b.op("Equal", [zeros, k(0)]), b.op("Div", [rest, upd]),
                              b.op("Where", [b.op("And", [zero, b.op("Equal", [zeros, k(1)])]), rest, k(0)])])
        dx = b.op("Mul", [dy, b.op("ScatterElements", [b.const(np.ones(x.shape, x.dtype)), idx, upd], attrs)])
        return [dx, None, dupd]
