"""ModelProto -> Graph. Handlers per (op_type, since_version) live in opsets.py; they only build IR."""
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ModelError
from ..graph.ir import Builder, Graph
from .opsets import HANDLERS

ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}


def onnx_dtype(code, where=""):
    dt = ONNX_DTYPES.get(code)
    if dt is None:
        name = onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else code
        raise ModelError(f"{where}dtype {name} is not supported (supported: {sorted(set(ONNX_DTYPES.values()))})")
    return dt


def load_model(path):
    """Parse an ONNX file, with a DlnetError naming the file when it is not ONNX."""
    if not os.path.exists(path):
        raise ModelError(f"{path}: no such file")
    try:
        model = onnx.load(str(path))
    except Exception as e:  # protobuf raises DecodeError, RuntimeWarning, ...
        raise ModelError(f"{path}: not an ONNX model ({type(e).__name__}: {str(e)[:120]})") from None
    if not model.graph.node and not model.graph.output:
        raise ModelError(f"{path}: not an ONNX model (no graph found)")
    return model


def model_opset(model):
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 1


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


def check_supported(model, path=""):
    """Every unsupported (op, op-set, node name) at once, before anything else happens."""
    opset = model_opset(model)
    missing = []
    for i, node in enumerate(model.graph.node):
        fn, reason = resolve_handler(node.op_type, opset, node.domain)
        if fn is None:
            missing.append(f"{node.op_type} (op-set {opset}, node {node.name or '#' + str(i)}): {reason}")
    if missing:
        raise ModelError(f"{path}: {len(missing)} unsupported node(s):\n  " + "\n  ".join(missing))


def graph_io(model):
    """(inputs, outputs): lists of (name, [dims as int or str], dtype); initializers are not inputs."""
    inits = {i.name for i in model.graph.initializer}

    def info(vi, where):
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise ModelError(f"{where} {vi.name!r}: only tensor inputs/outputs are supported")
        dims = []
        for k, d in enumerate(t.shape.dim):
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or f"d{k}")
        return vi.name, dims, onnx_dtype(t.elem_type, f"{where} {vi.name!r}: ") if t.elem_type else "float32"

    ins = [info(v, "input") for v in model.graph.input if v.name not in inits]
    outs = [info(v, "output") for v in model.graph.output]
    return ins, outs


class Importer:
    """Builds the IR for concrete input shapes."""

    def __init__(self, model, path="model"):
        self.model = model
        self.path = path
        self.opset = model_opset(model)
        self.values = {}
        self.graph = Graph(model.graph.name or os.path.basename(str(path)))
        self.b = Builder(self.graph, path)

    def attrs(self, node):
        out = {}
        for a in node.attribute:
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, onnx.TensorProto):
                v = numpy_helper.to_array(v)
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [s.decode() for s in v]
            out[a.name] = v
        return out

    def build(self, input_shapes, training=False):
        """input_shapes: {name: tuple}. Returns the Graph with inputs, outputs and output names set."""
        self.training = training
        self.state_updates = []  # training: (running-statistic value, its new value), e.g. BatchNormalization
        self.dropout_seed = None  # training: the uint32[1] graph input Dropout nodes read
        for init in self.model.graph.initializer:
            try:
                arr = numpy_helper.to_array(init, base_dir=os.path.dirname(str(self.path)))
            except Exception as e:
                raise ModelError(f"{self.path}: initializer {init.name!r} cannot be read ({e})") from None
            v = self.graph.constant(arr.astype(onnx_dtype(init.data_type, f"initializer {init.name!r}: ")),
                                    init.name)
            v.param = training and v.dtype in ("float32", "float64", "float16")  # trainable: never folded
            self.values[init.name] = v
        ins, _ = graph_io(self.model)
        for name, _, dtype in ins:
            self.values[name] = self.graph.add_input(name, dtype, input_shapes[name])
        for i, node in enumerate(self.model.graph.node):
            fn, reason = resolve_handler(node.op_type, self.opset, node.domain)
            label = node.name or f"#{i}"
            if fn is None:
                raise ModelError(f"{self.path}: node {label} ({node.op_type}): {reason}")
            inputs = []
            for n in node.input:
                if n == "":
                    inputs.append(None)
                    continue
                if n not in self.values:
                    raise ModelError(f"{self.path}: node {label} ({node.op_type}) reads {n!r}, which nothing defines")
                inputs.append(self.values[n])
            self.b.node_name = label
            try:
                outs = fn(self, node, inputs, self.attrs(node))
            except ModelError as e:
                msg = str(e)
                if msg.startswith(f"{self.path}:"):
                    raise
                raise ModelError(f"{self.path}: node {label} ({node.op_type}): {msg}") from None
            except (ValueError, IndexError, KeyError, TypeError) as e:
                raise ModelError(f"{self.path}: node {label} ({node.op_type}): {type(e).__name__}: {e}") from None
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            for name, v in zip(node.output, outs):
                if name and v is not None:
                    self.values[name] = v
            for name in list(node.output)[len(outs):]:
                if name:
                    raise ModelError(f"{self.path}: node {label} ({node.op_type}): output {name!r} "
                                     "(an optional output) is not supported")
        g = self.graph
        for o in self.model.graph.output:
            if o.name not in self.values:
                raise ModelError(f"{self.path}: graph output {o.name!r} is never computed")
            g.outputs.append(self.values[o.name])
            g.output_names.append(o.name)
        return g
