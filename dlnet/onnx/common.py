"""What the ONNX handler modules share: the registry of handlers per (op_type, since_version), ONNX dtypes, and the
small IR-building helpers (constants, reshapes, axes, slices, pads, spatial attributes) several op families use;
and Cut, where an imported graph stops before a node that runs on the host (dlnet/stages.py reads it).

`@handler("Relu", 6, 13, 14)` registers one function for every listed schema version whose semantics it covers:
a version bump that only added types is listed with the same function; one that changed meaning gets its own.
Handlers only build IR; numbers are computed by folding.
"""
import functools
from dataclasses import dataclass, field

import onnx

from ..errors import ModelError
from ..graph.ir import NeedsValue

HANDLERS = {}


def handler(op_type, *versions):
    def deco(fn):
        for v in versions:
            HANDLERS.setdefault(op_type, {})[v] = fn
        return fn
    return deco


@functools.cache
def _schema_version(op_type, opset, domain=""):
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except Exception:
        return None


def resolve_handler(op_type, opset, domain=""):
    """The handler for this op at this op-set, or (None, reason)."""
    if domain not in ("", "ai.onnx"):
        return None, f"domain {domain!r} is not supported"
    versions = HANDLERS.get(op_type)
    if not versions:
        return None, "op is not supported"
    since = _schema_version(op_type, opset)
    if since is None:
        return None, f"op does not exist at op-set {opset}"
    if since not in versions:
        known = sorted(versions)
        return None, f"version {since} is not supported (dlnet has versions {known})"
    return versions[since], None


# ---------------------------------------------------------------- dtypes ------------------------------------------
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 8: "object"}  # 8: STRING, host ops only


def onnx_dtype(code, where=""):
    dt = ONNX_DTYPES.get(code)
    if dt is None:
        name = onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else code
        supported = sorted(set(ONNX_DTYPES.values()) - {"object"}) + ["string"]
        raise ModelError(f"{where}dtype {name} is not supported (supported: {supported})")
    return dt


def widen_float16(fn):
    """A handler whose kernels are float32's (Gemm, Softmax, Conv) taking float16 too: its float16 inputs widened to
    float32 (Casts that fuse with their neighbours), its float32 outputs narrowed back. float64 stays refused by the
    kernels' dtype check: narrowing it would lose what it is for."""
    @functools.wraps(fn)
    def widened(imp, node, xs, at):
        if not any(x is not None and x.dtype == "float16" for x in xs):
            return fn(imp, node, xs, at)
        wide = [imp.b.op("Cast", [x], {"to": "float32"}) if x is not None and x.dtype == "float16" else x for x in xs]
        return [y if y is None or y.dtype != "float32" else imp.b.op("Cast", [y], {"to": "float16"})
                for y in fn(imp, node, wide, at)]
    return widened


# ---------------------------------------------------------------- values, shapes and axes -------------------------
def const(v, what):
    """The data of `v`, a value that decides a shape or a choice: a NeedsValue where it is known only at run time
    (the importer then plans per value, dlnet/onnx/importer.py)."""
    if v is None:
        raise ModelError(f"{what} must be given")
    if v.const is None:
        raise NeedsValue(f"{what} must be a constant (computed at load time)", v)
    return v.const


def reshape(b, x, shape):
    shape = tuple(int(d) for d in shape)
    return x if x.shape == shape else b.op("Reshape", [x], {"shape": shape})


def norm_axis(axis, rank):
    if not -rank <= axis < max(rank, 1):
        raise ModelError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def slice_axes(imp, x, starts, ends, axes, steps):
    """x[starts:ends:steps] along `axes` (all leading axes when None), with ONNX's clamping; x itself when whole."""
    rank = x.rank
    axes = list(range(len(starts))) if axes is None else [norm_axis(int(a), rank) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    st, cnt, sp = [0] * rank, list(x.shape), [1] * rank
    for a, s, e, k in zip(axes, starts, ends, steps, strict=False):
        if k == 0:
            raise ModelError("Slice step 0")
        s, e = int(max(min(s, 2**62), -2**62)), int(max(min(e, 2**62), -2**62))
        r = range(x.shape[a])[slice(s, e, k)]
        st[a], cnt[a], sp[a] = (r.start if len(r) else 0), len(r), k
    if cnt == list(x.shape) and all(s == 0 for s in st) and all(k == 1 for k in sp):
        return x
    return imp.b.op("Slice", [x], {"starts": tuple(st), "steps": tuple(sp), "counts": tuple(cnt)})


def pad(imp, x, pads, mode, value):
    """x padded by `pads` (begins + ends); negative pads crop."""
    pads = [int(p) for p in pads]
    if not any(pads):
        return x
    if any(p < 0 for p in pads):  # negative pads crop: a Slice, then the positive part
        starts = [max(0, -p) for p in pads[:x.rank]]
        ends = [d - max(0, -p) for d, p in zip(x.shape, pads[x.rank:], strict=False)]
        x = slice_axes(imp, x, starts, ends, None, None)
        pads = [max(0, p) for p in pads]
        if not any(pads):
            return x
    return imp.b.op("Pad", [x], {"pads": tuple(pads), "mode": mode, "value": float(value)})


# ---------------------------------------------------------------- Conv- and pool-like attributes -----------------
def spatial_attrs(at, nsp):
    """(strides, pads, dilations) of a Conv- or pool-like node over `nsp` spatial dims, each a list with the ONNX
    default filled in: strides 1, pads 0 (begins + ends, as written; auto_pads resolves auto_pad), dilations 1."""
    strides = list(at.get("strides") or [1] * nsp)
    pads = list(at.get("pads") or [0] * 2 * nsp)
    dilations = list(at.get("dilations") or [1] * nsp)
    return strides, pads, dilations


def auto_pads(at, pads, in_spatial, kernel, strides, dilations):
    """Explicit pads (begins + ends) from auto_pad, `pads` (spatial_attrs') where it is NOTSET; SAME_UPPER puts the
    odd cell at the end, SAME_LOWER first."""
    nsp = len(in_spatial)
    auto = at.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return pads
    if auto == "VALID":
        return [0] * 2 * nsp
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ModelError(f"auto_pad {auto!r}: expected NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    begins, ends = [], []
    for size, k, s, d in zip(in_spatial, kernel, strides, dilations, strict=False):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins + ends


# ---------------------------------------------------------------- where an imported graph stops ----------------
@dataclass
class Cut:
    """Where a graph stops: ONNX node `index` runs on the host; why; what the rest reads that is known already
    (`consts`, by ONNX name) or that is one of this graph's inputs under another name (`aliases`). Where `needs`
    names values (a shape the node's handler must know), the node does not run on the host: the rest is imported
    from it with those values as constants, once per value."""
    index: int
    reason: str
    consts: dict = field(default_factory=dict)
    aliases: dict = field(default_factory=dict)
    needs: tuple = ()
