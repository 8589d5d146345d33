"""Reductions: Reduce* (axes an attribute, then an input from op-set 13/18), ArgMax, ArgMin."""
from .common import const, handler, norm_axis

REDUCE_MODES = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
                "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceLogSum": "logsum",
                "ReduceLogSumExp": "logsumexp", "ReduceSumSquare": "sumsquare"}


# noop_with_empty_axes with no axes reduces over no axis: what remains is each mode's per-element part (as
# onnx.reference and onnxruntime compute it; log(exp(x)) taken as x)
NOOP = {"ReduceL1": "Abs", "ReduceL2": "Abs", "ReduceSumSquare": "Square", "ReduceLogSum": "Log"}


def _reduce(imp, node, x, axes, keepdims, noop_empty=0):
    if axes is None or len(axes) == 0:
        if noop_empty:
            op = NOOP.get(node.op_type, "Identity")
            return imp.b.op("Mul", [x, x]) if op == "Square" else imp.b.op(op, [x])
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
