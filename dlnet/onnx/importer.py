"""ModelProto -> Graph. Handlers per (op_type, since_version) live in one module per op family (elementwise, tensor,
indexing, linalg, nn, normalization, reduce, softmax, attention, composed, resize, sampling, recurrent, control,
dynamic, text, spectral), registered in common.HANDLERS when imported here; they only build IR."""
import functools
import os

import numpy as np
import onnx
from onnx import helper

from ..errors import InputError, ModelError
from ..graph.ir import Builder, Graph, NeedsHost, NeedsValue
from ..limits import over_cap
from . import (  # noqa: F401  (imported for their @handler registrations)
    attention,
    composed,
    control,
    dynamic,
    elementwise,
    indexing,
    linalg,
    nn,
    normalization,
    recurrent,
    reduce,
    resize,
    rotary,
    sampling,
    sequence,
    softmax,
    spectral,
    tensor,
    text,
)
from .common import (
    BFLOAT16,
    HANDLERS,
    HOST_DTYPES,
    ONNX_DTYPES,
    Cut,
    host_array,
    host_dtype_node,
    model_dtype,
    onnx_dtype,
    resolve_handler,
    round_bfloat16_outputs,
)
from .validate import read_model, tensor_array

__all__ = ["HANDLERS", "ONNX_DTYPES", "BindInputs", "Importer", "check_supported", "graph_io", "load_model",
           "model_opset", "onnx_dtype", "resolve_handler"]


BIND_MAX_ELEMENTS = 4096  # a graph input this small that decides a shape is bound per value; a larger one is not


class BindInputs(Exception):  # noqa: N818  (a signal to Net._plan, never a user's error)
    """Importer.build(values=...) found a shape decided by small graph inputs not yet bound: `names`. The net plans
    once per value they take (Net._plan), so the whole model stays one device plan."""

    def __init__(self, names):
        super().__init__(", ".join(sorted(names)))
        self.names = frozenset(names)


def load_model(source, base_dir=None):
    """The ModelProto of a path, bytes or a ModelProto, checked, with its external data read from inside one folder
    (validate.read_model); a DlnetError naming the file where it is not a model dlnet can read."""
    return read_model(source, base_dir)[0]


def model_opset(model):
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 1


def check_supported(model, path=""):
    """Every unsupported (op, op-set, node name) at once, before anything else happens."""
    opset = model_opset(model)
    missing = []
    for i, node in enumerate(model.graph.node):
        fn, reason = resolve_handler(node.op_type, opset, node.domain)
        if fn is None:
            missing.append(f"{node.op_type} (op-set {opset}, node {node.name or '#' + str(i)}): {reason}")
    if missing:
        more = [f"... and {len(missing) - 20} more"] if len(missing) > 20 else []
        raise ModelError(f"{path}: {len(missing)} unsupported node(s):\n  " + "\n  ".join(missing[:20] + more))


def graph_io(model, path=""):
    """(inputs, outputs): lists of (name, [dims as int or str], dtype); initializers are not inputs."""
    loc = f"{path}: " if path else ""
    inits = {i.name for i in model.graph.initializer}

    def info(vi, where):
        kind = vi.type
        if kind.HasField("optional_type") and kind.optional_type.elem_type.HasField("tensor_type"):
            kind = kind.optional_type.elem_type  # an optional tensor: fed (and given back) as the tensor it holds
        t = kind.tensor_type
        if not kind.HasField("tensor_type"):
            raise ModelError(f"{loc}{where} {vi.name!r}: only tensor inputs/outputs are supported")
        dims = []
        for k, d in enumerate(t.shape.dim):
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or f"d{k}")
        return vi.name, dims, model_dtype(t.elem_type, f"{loc}{where} {vi.name!r}: ") if t.elem_type else "float32"

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
        self.bfloat16 = set()  # ONNX names of the values that are bfloat16 (float32 in the IR, rounded)

    def attrs(self, node):
        """{name: value} of the node's attributes, the node checked against its op's schema first (every handler
        asks, a subgraph's too): inputs it requires given, no more inputs than it takes, each attribute of the type
        it declares (handlers and kernels read them so). A ModelError otherwise."""
        out = {}
        types, required, most = _schema(node.op_type, self.opset, node.domain)
        if len(node.input) > most:
            raise ModelError(f"{len(node.input)} inputs given, the op takes at most {most}")
        missing = [k for k in required if k >= len(node.input) or not node.input[k]]
        if missing:
            raise ModelError(f"input #{missing[0]} is required")
        for a in node.attribute:
            want = types.get(a.name)
            if want is not None and a.type != want:
                raise ModelError(f"attribute {a.name!r} is of type {_type_name(a.type)}, expected {_type_name(want)}")
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, onnx.TensorProto):
                v = host_array(tensor_array(v, f"attribute {a.name!r}"))
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [s.decode() for s in v]
            out[a.name] = v
        return out

    def build(self, input_shapes, training=False, values=None):
        """input_shapes: {name: tuple}. Returns the Graph with inputs, outputs and output names set.

        Where an ONNX node must run on the host (NeedsHost), the graph stops before it and `graph.cut` says how
        to go on (dlnet/plan.py); a training graph cannot stop, and says so. values: {input name: array} of inputs
        bound as constants for this plan; where it is given (not None), a shape decided by small inputs not in it
        raises BindInputs (the caller binds them and builds again) instead of stopping the graph there.
        """
        self.training = training
        self.bound = values
        self.state_updates = []  # training: (running-statistic value, its new value), e.g. BatchNormalization
        self.dropout_seed = None  # training: the uint32[1] graph input Dropout nodes read
        for init in self.model.graph.initializer:
            v = self.initializer(init, f"{self.path}: initializer {init.name!r}")
            v.param = training and v.dtype in ("float32", "float64", "float16")  # trainable: never folded
        ins, _ = graph_io(self.model, self.path)
        for name, _, dtype in ins:
            if values is not None and name in values:
                self.bfloat16.update([name] if dtype == "bfloat16" else [])
                self.values[name] = self.graph.constant(host_array(np.asarray(values[name])), name)
                continue
            if dtype == "bfloat16":
                self.bfloat16.add(name)
                dtype = "float32"
            shape = input_shapes[name]
            if over_cap(shape):  # (a shape from the model was checked at load: this one came at run time)
                raise InputError(f"{self.path}: input {name!r} of shape {list(shape)} {over_cap(shape)}")
            self.values[name] = self.graph.add_input(name, dtype, shape)
        return self._import_from(0)

    def initializer(self, init, where):
        """The constant of TensorProto `init` (of the graph or of a subgraph), bound to its name: bfloat16 widened
        and its name noted, HOST_DTYPES as they are, the rest as their IR dtype."""
        arr = tensor_array(init, where)  # (never reads a file: validate.read_model read external data at load)
        if init.data_type == BFLOAT16:
            self.bfloat16.add(init.name)
        # (no copy where the dtype is already right: the array is a read-only view of the protobuf's bytes)
        dtype = HOST_DTYPES.get(init.data_type) or onnx_dtype(init.data_type, f"{where}: ")
        v = self.values[init.name] = self.graph.constant(host_array(arr).astype(dtype, copy=False), init.name)
        return v

    def build_stage(self, start, inputs, consts):
        """The graph of ONNX nodes `start`... after a host step: `inputs` {name: (dtype, shape)} arrive at run time,
        `consts` {name: array} are known (initializers and values folded before the cut)."""
        self.training = False
        self.bound = None
        self.state_updates = []
        self.dropout_seed = None
        self.bfloat16 = self._bfloat16_before(start)  # (values from before the cut come as float32)
        for name, array in consts.items():
            self.values[name] = self.graph.constant(array, name)
        for name, (dtype, shape) in inputs.items():
            self.values[name] = self.graph.add_input(name, dtype, shape)
        g = self._import_from(start)
        if g.cut is None:  # the model ends here: outputs known already come from the host, not from this graph
            g.outputs, g.output_names = [], []
            self._cut(None, "")
        return g

    def run_host(self, index, arrays):
        """Run ONNX node `index` on the host: its handler, with every input a constant, folds to the outputs."""
        self.training = False
        node = self.model.graph.node[index]
        self.values = {name: self.graph.constant(a, name) for name, a in arrays.items()}
        self.import_node(index, node)
        label = node.name or f"#{index}"
        out = {}
        for name in node.output:
            if not name:
                continue
            v = self.values[name]
            if v.const is None:
                ops = sorted({n.op for n in self.graph.nodes})
                raise ModelError(f"{self.path}: node {label} ({node.op_type}) runs on the host, but its output "
                                 f"{name!r} needs device kernels ({', '.join(ops)}) that have no host form")
            out[name] = v.const
        return out

    def _import_from(self, start):
        nodes = self.model.graph.node
        for i in range(start, len(nodes)):
            mark = len(self.graph.nodes)
            try:
                self.import_node(i, nodes[i])
            except NeedsHost as e:
                if self.training:
                    raise ModelError(f"{e}; a training graph has no host steps") from None
                for n in reversed(self.graph.nodes[mark:]):  # what the handler built before it found out
                    self.graph.remove_node(n)
                return self._cut(i, str(e))
            except NeedsValue as e:
                if self.training:
                    raise ModelError(f"{e}; a training graph is planned for one shape (bind it at load: "
                                     "constants=)") from None
                needs = self._needed_inputs(nodes[i], e.value)
                for n in reversed(self.graph.nodes[mark:]):
                    self.graph.remove_node(n)
                if not needs or (i == start and all(self.values[n].const is not None for n in needs)):
                    raise ModelError(str(e)) from None  # (known, and still not a constant: no way on)
                self._bind_signal(needs)
                return self._cut(i, str(e), needs)
        g = self.graph
        for o in self.model.graph.output:
            if o.name not in self.values:
                raise ModelError(f"{self.path}: graph output {o.name!r} is never computed")
            g.outputs.append(self.values[o.name])
            g.output_names.append(o.name)
        return g

    def import_node(self, i, node):
        """ONNX `node` (the graph's i-th, or a subgraph's node labelled i) into the IR: its outputs bound to their
        names."""
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
            at = self.attrs(node)
            host = host_dtype_node(node, inputs, self.bfloat16, self.opset)
            outs = fn(self, node, inputs, at) if host is None else [self.graph.constant(y) for y in host]
        except NeedsHost:
            raise
        except NeedsValue as e:
            if str(e).startswith(f"{self.path}:"):
                raise
            raise NeedsValue(f"{self.path}: node {label} ({node.op_type}): {e}", e.value) from None
        except ModelError as e:
            msg = str(e)
            if msg.startswith(f"{self.path}:"):
                raise
            raise ModelError(f"{self.path}: node {label} ({node.op_type}): {msg}") from None
        except (ValueError, IndexError, KeyError, TypeError, ArithmeticError, MemoryError) as e:
            # what numpy and the ops raise on values a model should not hold (a stride of 0, a shape of 2**70)
            raise ModelError(f"{self.path}: node {label} ({node.op_type}): {type(e).__name__}: {e}") from None
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        outs = self._round_bfloat16(node, outs)
        for name, v in zip(node.output, outs, strict=False):
            if name and v is not None:
                self.values[name] = v
        for name in list(node.output)[len(outs):]:
            if name:
                raise ModelError(f"{self.path}: node {label} ({node.op_type}): output {name!r} "
                                 "(an optional output) is not supported")

    def _round_bfloat16(self, node, outs):
        """The handler's outputs, those ONNX types bfloat16 rounded to it (the kernels computed them in float32) and
        their names noted, except where the op only moves or selects its bfloat16 inputs' values."""
        is_bf16 = [n in self.bfloat16 for n in node.input]
        if not any(is_bf16) and not any(a.name in ("to", "dtype", "output_dtype", "value") for a in node.attribute):
            return outs
        marks = round_bfloat16_outputs(node, is_bf16, self.opset)
        outs = list(outs)
        for k, (name, v) in enumerate(zip(node.output, outs, strict=False)):
            if not (name and v is not None and k < len(marks) and marks[k]):
                continue
            self.bfloat16.add(name)
            if v.dtype == "float32" and node.op_type not in EXACT_ON_BFLOAT16:
                outs[k] = self.b.op("RoundBfloat16", [v])
        return outs

    def _bfloat16_before(self, start):
        """The ONNX names of bfloat16 values that ONNX nodes before `start` make or read, by the rule of
        _round_bfloat16 (for a graph that starts after a host step)."""
        g = self.model.graph
        names = {i.name for i in g.initializer if i.data_type == BFLOAT16}
        names |= {i.name for i in g.input if i.type.tensor_type.elem_type == BFLOAT16}
        for node in g.node[:start]:
            marks = round_bfloat16_outputs(node, [n in names for n in node.input], self.opset)
            names |= {n for n, bf in zip(node.output, marks) if n and bf}
        return names

    def _needed_inputs(self, node, value):
        """The names of `node`'s inputs (and the outer values its subgraphs read) that `value` (what its handler asked
        to be constant) is computed from."""
        given = {self.values[n].id: n for n in sorted(_names_read([node])) if n in self.values}
        found, seen, stack = set(), set(), [value]
        while stack:
            v = stack.pop()
            if v.id in seen:
                continue
            seen.add(v.id)
            if v.id in given:
                found.add(given[v.id])
            elif v.producer is not None:
                stack.extend(u for u in v.producer.inputs if u is not None)
        if not found:  # (a value made inside a subgraph: every input the node reads that is not known)
            found = {n for n in given.values() if self.values[n].const is None}
        return sorted(found)

    def _bind_signal(self, needs):
        """BindInputs where build(values=...) may bind the small graph inputs the needed values come from, and some
        of them are not bound yet; otherwise nothing (the graph stops before the node)."""
        if self.bound is None:
            return
        inputs = {v.id: v for v in self.graph.inputs}
        reached, seen, stack = {}, set(), [self.values[n] for n in needs]
        while stack:
            v = stack.pop()
            if v.id in seen:
                continue
            seen.add(v.id)
            if v.id in inputs:
                reached[v.name] = v
            elif v.producer is not None:
                stack.extend(u for u in v.producer.inputs if u is not None)
        direct = set(needs)
        small = all(v.size <= BIND_MAX_ELEMENTS and (v.dtype in ("bool", "int8", "int16", "int32", "int64", "uint8",
                                                                   "uint16", "uint32", "uint64") or n in direct)
                    for n, v in reached.items())
        if reached and small:
            raise BindInputs(reached)

    def _cut(self, index, reason, needs=()):
        """End the graph before ONNX node `index` (None: the model's end): its outputs are the values computed here
        that later nodes or the model's outputs read. needs: names whose values the node's handler must know (the
        rest is then imported from the node itself, once they are; otherwise the node runs on the host)."""
        g = self.graph
        later = {o.name for o in self.model.graph.output}
        if index is not None:
            later |= _names_read(self.model.graph.node[index:])
        inputs = {v.id for v in g.inputs}
        consts, aliases = {}, {}
        for name in sorted(later):
            v = self.values.get(name)
            if v is None:
                continue
            if v.const is not None:
                consts[name] = v.const
            elif v.id in inputs:
                aliases[name] = v.name
            else:
                g.outputs.append(v)
                g.output_names.append(name)
        read = {v.id for n in g.nodes for v in n.inputs if v is not None}
        g.inputs = [v for v in g.inputs if v.id in read]  # the rest stay on the host (strings, values read later)
        g.cut = Cut(index, reason, consts, aliases, tuple(needs))
        if index is not None:
            g.notes.append(f"stops before ONNX node #{index}: {reason}")
        return g


# ops whose outputs are values of their inputs (moved, selected, sign-flipped): a bfloat16 input gives bfloat16 ones
EXACT_ON_BFLOAT16 = frozenset(
    "Identity Reshape Flatten Squeeze Unsqueeze Transpose Concat Split Slice Gather GatherElements GatherND Expand "
    "Tile Where Max Min Relu Neg Abs MaxPool ReduceMax ReduceMin TopK Sort ScatterElements ScatterND SpaceToDepth "
    "DepthToSpace Compress ReverseSequence Trilu Shape Size Dropout".split())


@functools.cache
def _schema(op_type, opset, domain):
    """({attribute name: AttributeProto type}, indices of the inputs it requires, the most inputs it takes) of the
    op's schema at this op-set; nothing to check where onnx has none."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, "" if domain == "ai.onnx" else domain)
    except Exception:  # (no such op or op-set: resolve_handler has said so already)
        return {}, (), 2**31
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    required = tuple(k for k, p in enumerate(schema.inputs) if p.option == single)
    return {name: int(a.type) for name, a in schema.attributes.items()}, required, schema.max_input


def _type_name(code):
    return onnx.AttributeProto.AttributeType.Name(code) if code in onnx.AttributeProto.AttributeType.values() \
        else str(code)


def _names_read(nodes):
    """Every value name the nodes read, in their subgraphs (If/Loop/Scan bodies) too."""
    names = set()
    for node in nodes:
        names.update(n for n in node.input if n)
        for a in node.attribute:
            for body in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names |= _names_read(body.node)
    return names
