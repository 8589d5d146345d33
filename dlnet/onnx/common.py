"""What the ONNX handler modules share: the registry of handlers per (op_type, since_version), ONNX dtypes, and the
small IR-building helpers (constants, reshapes, axes, slices, pads, spatial attributes) several op families use;
and Cut, where an imported graph stops before a node that runs on the host (dlnet/stages.py reads it).

`@handler("Relu", 6, 13, 14)` registers one function for every listed schema version whose semantics it covers:
a version bump that only added types is listed with the same function; one that changed meaning gets its own.
Handlers only build IR; numbers are computed by folding.
"""
import functools
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import onnx

from ..errors import ModelError
from ..graph.ir import NeedsHost, NeedsValue

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
# ONNX type code -> the dtype of its values in the IR (and on the device). 16, BFLOAT16, is held as float32 whose
# values are bfloat16's (rounded after each node that makes one: Importer, RoundBfloat16); the ml_dtypes types
# numpy holds but no kernel reads (HOST_DTYPES) live only as host constants.
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 8: "object",  # 8: STRING, host ops only
               16: "float32"}
BFLOAT16 = 16
HOST_DTYPES = {17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4",
               22: "int4", 23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2"}
HOST_DTYPE_OPS = ("Cast", "CastLike", "QuantizeLinear", "DequantizeLinear")  # what reads or makes HOST_DTYPES


def onnx_dtype(code, where=""):
    """The IR dtype of ONNX type `code` (bfloat16: float32); a ModelError for a type no kernel holds."""
    dt = ONNX_DTYPES.get(code)
    if dt is None:
        name = onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else code
        supported = sorted(set(ONNX_DTYPES.values()) - {"object"}) + ["bfloat16", "string"]
        raise ModelError(f"{where}dtype {name} is not supported (supported: {supported})")
    return dt


def model_dtype(code, where=""):
    """The dtype a user feeds or gets for ONNX type `code`: numpy's or ml_dtypes' name ("bfloat16", "int4", ...)."""
    if code == BFLOAT16:
        return "bfloat16"
    return HOST_DTYPES.get(code) or onnx_dtype(code, where)


def host_array(array):
    """An array of a model's tensor as the IR holds it: bfloat16 widened to float32 (exactly)."""
    return array.astype(np.float32) if array.dtype == ml_dtypes.bfloat16 else array


def round_bfloat16_outputs(node, inputs_bf16, opset):
    """[is bfloat16] for each output of ONNX `node`, from its schema: an output of the type parameter of a bfloat16
    input (T of Add, Relu, MatMul...), or one whose type an attribute sets to BFLOAT16 (Cast's to, EyeLike's dtype,
    Constant's value)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except Exception:
        return [False] * len(node.output)
    params = {p.type_str for p, bf in zip(schema.inputs, inputs_bf16) if bf}
    if schema.inputs and schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic and \
            any(inputs_bf16[len(schema.inputs) - 1:]):
        params.add(schema.inputs[-1].type_str)
    by_attr = False
    for a in node.attribute:
        if a.name in ("to", "dtype", "output_dtype") and a.type == onnx.AttributeProto.INT:
            by_attr = a.i == BFLOAT16
        elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type == BFLOAT16:
            by_attr = True
    out = []
    for k in range(len(node.output)):
        p = schema.outputs[min(k, len(schema.outputs) - 1)] if schema.outputs else None
        bound = p is not None and any(q.type_str == p.type_str for q in schema.inputs)
        out.append(p is not None and (p.type_str in params or (by_attr and not bound)))
    return out


def host_dtype_node(node, inputs, bfloat16, opset):
    """Where ONNX `node` (Cast, CastLike, QuantizeLinear, DequantizeLinear) reads or makes a HOST_DTYPES value: its
    outputs as arrays, computed on the host by onnx's reference implementation of the op (exact: these are
    conversions with the spec's rounding and saturation), once every input is known; NeedsHost before (the node then
    runs on the host at run time). None where it involves no such dtype. A node of any other op reading one: a
    ModelError naming the dtype. bfloat16: the ONNX names of bfloat16 values (float32 in the IR)."""
    exotic = [v.dtype for v in inputs if getattr(v, "dtype", None) in HOST_DTYPES.values()]  # (a Sequence has none)
    if node.op_type not in HOST_DTYPE_OPS:
        if exotic:
            raise ModelError(f"dtype {exotic[0]} is not supported (only {', '.join(HOST_DTYPE_OPS)} take it)")
        return None
    made = [a.i for a in node.attribute if a.name in ("to", "output_dtype") and a.i in HOST_DTYPES]
    if not exotic and not made:
        return None
    if any(v is not None and v.const is None for v in inputs):
        raise NeedsHost(f"dtype {(exotic or [HOST_DTYPES[c] for c in made])[0]} is held on the host only: "
                        "it runs on the host at run time")
    from onnx.reference import ReferenceEvaluator  # (only for these nodes)
    arrays = [None if v is None else v.const.astype(ml_dtypes.bfloat16) if name in bfloat16 else v.const
              for name, v in zip(node.input, inputs)]
    names = [n if n else "" for n in node.input]
    graph = onnx.helper.make_graph([node], "host", [onnx.helper.make_tensor_value_info(n, 0, None) for n in names
                                                    if n], [onnx.helper.make_tensor_value_info(n, 0, None)
                                                            for n in node.output if n])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    outs = ReferenceEvaluator(model).run(None, {n: a for n, a in zip(names, arrays) if n})
    return [host_array(np.asarray(y)) for y in outs]


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
