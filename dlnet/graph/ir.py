"""The typed SSA graph: Value, Node, Graph, and a Builder that infers types and folds constants as it goes."""
import numpy as np

from ..errors import ModelError
from ..limits import MAX_FOLD_ELEMENTS, elements, over_cap


class NeedsHost(ModelError):
    """A node that must run on the host at run time: its output shapes depend on input values, or it reads strings.

    The importer catches it and ends the device graph before that ONNX node (see dlnet/stages.py); anywhere else
    (a training graph) it reaches the user as the ModelError it is.
    """


class NeedsValue(ModelError):
    """A handler needs the data of `value` (a Reshape's shape, a Slice's starts, TopK's k, ...) and it is not known
    at import. The importer binds the small graph inputs it comes from, one plan per value they take (dlnet/net.py),
    or ends the device graph before the node and imports the rest once the value is known at run time
    (dlnet/plan.py); in a training graph it reaches the user as the ModelError it is."""

    def __init__(self, message, value):
        super().__init__(message)
        self.value = value


HALF_NOTE = "fp16: "  # the note of a graph whose float32 values may be stored in half (passes/half.py, the parser)


def stored_as(graph, inferred, stored):
    """Does a value whose inference gives dtype `inferred` hold `stored` in `graph`: the same, or float32 stored in half
    where precision "fp16" stored it so (graph.stored_half, passes/half.py)?"""
    return inferred == stored or (getattr(graph, "stored_half", False) and {inferred, stored} <= {"float32", "float16"})


class Value:
    """An SSA value: dtype (numpy name) and static shape; `const` holds the data of a constant."""
    __slots__ = ("id", "name", "dtype", "shape", "const", "producer", "users", "param")

    def __init__(self, vid, name, dtype, shape, const=None):
        self.id = vid
        self.name = name
        self.dtype = np.dtype(dtype).name
        self.shape = tuple(int(d) for d in shape)
        self.const = const
        self.producer = None
        self.users = []
        self.param = False  # a trainable weight: constant at inference, never folded away by training passes

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self):
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def rank(self):
        return len(self.shape)

    def type_str(self):
        short = {"object": "str", "float32": "f32", "float64": "f64", "float16": "f16", "int64": "i64", "int32": "i32",
                 "int8": "i8", "uint8": "u8", "bool": "bool", "int16": "i16", "uint16": "u16", "uint32": "u32",
                 "uint64": "u64"}
        return f"{short.get(self.dtype, self.dtype)}[{','.join(str(d) for d in self.shape)}]"

    def __repr__(self):
        return f"%{self.id}: {self.type_str()}"


class BatchSlice(Value):
    """Images [first, first + n) of a value, for lowering a node over one slice of the batch: the value's own id (so
    the memory plan's entries for it apply) with a shape of n images; Lowerer.loc adds the slice's offset."""
    __slots__ = ("first",)

    def __init__(self, v, first, n):
        super().__init__(v.id, v.name, v.dtype, (n,) + v.shape[1:])
        self.first = first
        self.producer, self.users, self.param = v.producer, v.users, v.param


class Node:
    """One operation. `op` is the registry key (ONNX CamelCase name where the op is an ONNX op).

    `attrs` holds every attribute the op declares with a default (Op.attrs), the defaults filled in here where absent.
    """
    __slots__ = ("op", "inputs", "outputs", "attrs", "name", "schedule")

    def __init__(self, op, inputs, outputs, attrs, name="", schedule=None):
        from .ops import OPS
        self.op = op
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        spec = OPS.get(op)
        self.attrs = spec.filled_attrs(attrs, self.inputs) if spec is not None else dict(attrs)
        self.name = name
        # how the device runs it, chosen once before memory planning (kernels/schedule.py): {"algo": "winograd4",
        # "tile": "128x64"}; printed after the attributes, never read by graph passes
        self.schedule = dict(schedule or {})

    @property
    def spec(self):
        from .ops import get_op
        return get_op(self.op)

    def __repr__(self):
        return f"Node({self.op} {self.name})"


class Graph:
    def __init__(self, name="graph"):
        self.name = name
        self.nodes = []
        self.inputs = []
        self.outputs = []
        self.output_names = []
        self._next_id = 0
        self.notes = []  # header lines for the printer
        self.cut = None  # a stages.Cut when the graph stops before an ONNX node that runs on the host
        self.stored_half = False  # precision "fp16" stored float32 values in half (passes/half.py)

    # values -------------------------------------------------------------
    def new_value(self, dtype, shape, name="", const=None):
        v = Value(self._next_id, name, dtype, shape, const)
        self._next_id += 1
        return v

    def constant(self, array, name=""):
        array = np.asarray(array)
        return self.new_value(array.dtype, array.shape, name, const=array)

    def add_input(self, name, dtype, shape):
        v = self.new_value(dtype, shape, name)
        self.inputs.append(v)
        return v

    # nodes --------------------------------------------------------------
    def add_node(self, node, index=None):
        for v in node.inputs:
            if v is not None:
                v.users.append(node)
        for v in node.outputs:
            v.producer = node
        if index is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(index, node)
        return node

    def remove_node(self, node):
        for v in node.inputs:
            if v is not None and node in v.users:
                v.users.remove(node)
        self.nodes.remove(node)

    def replace_all_uses(self, old, new):
        """Every reader of `old` reads `new` instead (graph outputs too)."""
        for user in list(old.users):
            user.inputs = [new if v is old else v for v in user.inputs]
            new.users.append(user)
        old.users = []
        self.outputs = [new if v is old else v for v in self.outputs]

    def set_input(self, node, index, value):
        old = node.inputs[index]
        if old is not None and node in old.users:
            old.users.remove(node)
        node.inputs[index] = value
        if value is not None:
            value.users.append(node)

    def values(self):
        seen = {}
        for v in self.inputs:
            seen[v.id] = v
        for n in self.nodes:
            for v in n.inputs + n.outputs:
                if v is not None:
                    seen[v.id] = v
        for v in self.outputs:
            seen[v.id] = v
        return list(seen.values())

    # checks -------------------------------------------------------------
    def verify(self):
        """Types, topological order and ownership; raises ModelError naming the first problem."""
        from .ops import get_op
        defined = {v.id for v in self.inputs}
        for n in self.nodes:
            for v in n.inputs:
                if v is None:
                    continue
                if v.const is None and v.id not in defined:
                    raise ModelError(f"verify: node {n.name} ({n.op}) reads %{v.id} before it is defined")
                if n not in v.users:
                    raise ModelError(f"verify: %{v.id} does not list its user {n.name} ({n.op})")
            for v in n.outputs:
                if v.producer is not n:
                    raise ModelError(f"verify: %{v.id} is not owned by its producer {n.name} ({n.op})")
                if v.id in defined:
                    raise ModelError(f"verify: %{v.id} defined twice")
                defined.add(v.id)
            spec = get_op(n.op)
            types = spec.infer(n)
            for v, (dt, shape) in zip(n.outputs, types):
                dt = np.dtype(dt).name
                if not stored_as(self, dt, v.dtype) or tuple(shape) != v.shape:
                    raise ModelError(f"verify: node {n.name} ({n.op}) output %{v.id} is {v.type_str()}, "
                                     f"inference says {dt}{list(shape)}")
        for v in self.outputs:
            if v.const is None and v.id not in defined:
                raise ModelError(f"verify: graph output %{v.id} is never defined")
        return True

    def __str__(self):
        from .printer import format_graph
        return format_graph(self)


class Builder:
    """Adds nodes to a graph: infers output types, and folds a node at once when all its inputs are constant."""

    def __init__(self, graph, path=None):
        self.graph = graph
        self.path = path
        self.node_name = ""

    def const(self, array, dtype=None):
        a = np.asarray(array, dtype=dtype)
        return self.graph.constant(a)

    def _check_sizes(self, node, types):
        """Refuse an output over MAX_ELEMENTS (dlnet/limits.py) before anything is allocated; True where one is too
        big to fold on the host (MAX_FOLD_ELEMENTS)."""
        shapes = [shape for _, shape in types if shape is not None]
        for shape in shapes:
            problem = over_cap(shape)
            if problem:
                loc = f"{self.path}: " if self.path else ""
                raise ModelError(f"{loc}node {node.name or '?'} ({node.op}): output shape {list(shape)} {problem}")
        return any(elements(shape) > MAX_FOLD_ELEMENTS for shape in shapes)

    def op(self, op, inputs, attrs=None, n_out=1, name=None, fold=True):
        """Build `op` and return its output value (or the list when n_out != 1)."""
        from .ops import get_op
        spec = get_op(op)
        attrs = attrs or {}
        node = Node(op, inputs, [], attrs, name if name is not None else self.node_name)
        try:
            types = spec.infer(node)
        except ModelError:
            raise
        except Exception as e:  # shape errors from numpy and friends
            loc = f"{self.path}: " if self.path else ""
            raise ModelError(f"{loc}node {node.name or '?'} ({op}): {e}") from e
        n_out = len(types) if n_out is None else n_out
        big = self._check_sizes(node, types)
        known = all(v is None or v.const is not None for v in inputs) and not any(v is not None and v.param
                                                                                 for v in inputs)
        strings = [v for v in inputs if v is not None and v.const is None and v.dtype == "object"]
        if spec.kind == "host" or strings:
            if not (known and fold):
                loc = f"{self.path}: " if self.path else ""
                why = "reads strings" if strings else "has output shapes that depend on its input values"
                raise NeedsHost(f"{loc}node {node.name or '?'} ({op}) {why}: it runs on the host at run time")
            if spec.kind == "host":  # the shapes come from the values
                results = spec.numpy(node, *[None if v is None else v.const for v in inputs])
                outs = [self.graph.constant(np.asarray(r, dtype=dt)) for r, (dt, _) in zip(results, types)]
                return outs[0] if n_out == 1 else outs[:n_out]
        folds = fold and spec.numpy is not None and all(v is None or v.const is not None for v in inputs) and \
            not any(v is not None and v.param for v in inputs) and not big  # (too big to fold: on the device)
        if folds:
            arrays = [None if v is None else v.const for v in inputs]
            results = spec.numpy(node, *arrays)
            outs = [self.graph.constant(np.asarray(r, dtype=dt).reshape(shape))
                    for r, (dt, shape) in zip(results, types)]
        else:  # a device node: its kernels must take the dtype (folding on the host takes any)
            if spec.dtypes is not None and inputs and inputs[0] is not None and inputs[0].dtype not in spec.dtypes:
                loc = f"{self.path}: " if self.path else ""
                raise ModelError(f"{loc}node {node.name or '?'} ({op}): dtype {inputs[0].dtype} is not supported "
                                 f"(supported: {', '.join(spec.dtypes)})")
            outs = [self.graph.new_value(dt, shape) for dt, shape in types]
            node.outputs = outs
            self.graph.add_node(node)
        return outs[0] if n_out == 1 else outs[:n_out]
