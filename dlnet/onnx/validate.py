"""An untrusted ONNX model, read and checked before anything is built or allocated.

`read_model(source, base_dir)` takes a path (str or os.PathLike), bytes or an onnx.ModelProto and returns
`(model, name, files)`:
- `name` is what messages show: the path, or `<model 'graph name'>` for a proto or bytes. Nothing the model says
  is ever used as a path.
- External data is read from inside one folder only: the model file's own, or `base_dir` for a proto or bytes
  (required then). Paths go through onnx's own checks (onnx.checker's `_open_external_data`: relative, inside the
  folder, no symlink, no hard link, a regular file); each tensor's offset and length are checked against the file
  and against the bytes its dims and dtype need, and a file's tensors may not read more bytes than it holds. After
  this every tensor of the model holds its own bytes: nothing later reads a file.
- `files`: the real paths read (the model file, its external data), which `Net.save_onnx` will not overwrite.

`check_model` checks what onnxruntime checks before it runs anything: the IR version and the op-sets it knows, each
value defined once (SSA), dims >= 0; and the caps of dlnet/limits.py (file size, node count, subgraph depth,
elements per tensor), each error naming the file and what was exceeded.
"""
import math
import mmap
import os
import stat
from collections import defaultdict

import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

from ..errors import InputError, ModelError
from ..limits import MAX_DEPTH, MAX_ELEMENTS, MAX_MODEL_BYTES, MAX_NODES, elements, over_cap
from .common import BFLOAT16, HOST_DTYPES, ONNX_DTYPES, onnx_dtype

NEWEST_OPSET = onnx.defs.onnx_opset_version()  # of the default domain, as the onnx package dlnet pins knows it
NEWEST_IR = onnx.IR_VERSION


def read_model(source, base_dir=None):
    """(model, name, files) of a path, bytes or a ModelProto, checked and with its external data read (above)."""
    files = []
    if isinstance(source, onnx.ModelProto):
        model = source
        name = model_name(model)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        model = _parse_bytes(source)
        name = model_name(model)
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not isinstance(path, str):
            raise InputError(f"load_onnx: a path must be a str or os.PathLike of str, got {type(path).__name__}")
        if base_dir is not None:
            raise InputError(f"{path}: base_dir is for a ModelProto or bytes; a model file's external data is read "
                             "from the file's own folder")
        model = _parse_file(path)
        name = path
        base_dir = os.path.dirname(os.path.abspath(path))
        files.append(os.path.realpath(path))
    else:
        raise InputError(f"load_onnx takes a path, bytes or an onnx.ModelProto, got {type(source).__name__}")
    if base_dir is not None and not os.path.isdir(base_dir):
        raise InputError(f"{name}: base_dir {os.fspath(base_dir)!r} is not a folder")
    graphs, external = check_model(model, name)
    if external:
        if model is source:  # the caller's proto stays as it was
            model = onnx.ModelProto()
            model.CopyFrom(source)
            graphs, _ = _check_graphs(model, name)
        files += _read_external(graphs, base_dir, name)
    return model, name, files


def model_name(model):
    """How messages name a model that came as a proto or bytes: never a path."""
    name = model.graph.name
    if isinstance(name, bytes):  # (not UTF-8: protobuf hands such a string over as bytes)
        name = name.decode(errors="replace")
    if not name:
        return "<model>"
    return f"<model {name[:60] + ('...' if len(name) > 60 else '')!r}>"


def tensor_array(tensor, where):
    """numpy_helper.to_array of a TensorProto whose data is its own (read_model read any external data): never
    reads a file; dims checked first (no allocation of a shape the caps refuse)."""
    if _is_external(tensor):
        raise ModelError(f"{where}: keeps its data in an external file that was not read at load")
    if over_cap(tensor.dims):
        raise ModelError(f"{where}: dims {list(tensor.dims)} {over_cap(tensor.dims)}")
    try:
        return numpy_helper.to_array(tensor)
    except Exception as e:  # onnx's own conversion of malformed data: wrong lengths, bad UTF-8, unknown types
        raise ModelError(f"{where} cannot be read ({type(e).__name__}: {str(e)[:160]})") from None


# ------------------------------------------------------------------ parsing ----------------------------------------
def _parse_file(path):
    """The model in a regular file, parsed from the file mapped into memory rather than read into a copy first
    (resnet50's 100 MB: 0.12-0.27 s -> 0.07 s). A FIFO, device or folder is refused before anything is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot be opened ({getattr(e, 'strerror', None) or e})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ModelError(f"{path}: not a regular file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_MODEL_BYTES:
            raise ModelError(f"{path}: {st.st_size} bytes, more than an ONNX model file holds ({MAX_MODEL_BYTES}: "
                             "protobuf's limit; larger weights live in external data files)")
        if st.st_size == 0:
            raise ModelError(f"{path}: not an ONNX model (an empty file)")
        model = onnx.ModelProto()
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
                model.ParseFromString(view)
        except Exception as e:  # protobuf raises DecodeError, RuntimeWarning, ...
            raise ModelError(f"{path}: not an ONNX model ({type(e).__name__}: {str(e)[:120]})") from None
    if not model.graph.node and not model.graph.output:
        raise ModelError(f"{path}: not an ONNX model (no graph found)")
    return model


def _parse_bytes(data):
    if len(data) > MAX_MODEL_BYTES:
        raise ModelError(f"<model>: {len(data)} bytes, more than an ONNX model holds ({MAX_MODEL_BYTES})")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(bytes(data))
    except Exception as e:  # DecodeError names the message type, never the bytes
        raise ModelError(f"<model>: not an ONNX model ({type(e).__name__}: {str(e)[:120]})") from None
    if not model.graph.node and not model.graph.output:
        raise ModelError("<model>: not an ONNX model (no graph found)")
    return model


# ------------------------------------------------------------------ checks -----------------------------------------
def check_model(model, name):
    """What onnxruntime refuses, and the caps; returns (every graph of the model, its subgraphs included, whether
    a tensor keeps its data in an external file)."""
    if not 1 <= model.ir_version <= NEWEST_IR:
        raise ModelError(f"{name}: IR version {model.ir_version} is not supported (1 to {NEWEST_IR})")
    seen = set()
    for imp in model.opset_import:
        domain = "" if imp.domain == "ai.onnx" else imp.domain
        if domain in seen:
            raise ModelError(f"{name}: op-set of domain {imp.domain!r} imported twice")
        seen.add(domain)
        if domain == "" and not 1 <= imp.version <= NEWEST_OPSET:
            raise ModelError(f"{name}: op-set {imp.version} of the default domain is not supported (the newest is "
                             f"{NEWEST_OPSET})")
    return _check_graphs(model, name)


def _check_graphs(model, name):
    """Every graph of the model (its subgraphs depth first), each checked, the node count and nesting capped."""
    out, stack, nodes, external = [], [(model.graph, 0)], 0, False
    while stack:
        graph, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ModelError(f"{name}: subgraphs nested more than {MAX_DEPTH} deep")
        nodes += len(graph.node)
        if nodes > MAX_NODES:
            raise ModelError(f"{name}: more than {MAX_NODES} nodes (dlnet's cap, dlnet/limits.py)")
        out.append(graph)
        subgraphs, ext = _check_graph(graph, name, depth == 0)
        stack.extend((g, depth + 1) for g in subgraphs)
        external = external or ext
    return out, external


def _check_graph(graph, name, main):
    """SSA within the graph's scope, dims >= 0 and within the caps; returns (the graph's subgraphs, whether a tensor
    of it keeps its data in an external file)."""
    where = name if main else f"{name}: subgraph {graph.name!r}"
    initializers, external = set(), False
    _utf8([t.name for t in graph.initializer] + [vi.name for vi in list(graph.input) + list(graph.output)], where)
    for t in graph.initializer:
        if t.name in initializers:
            raise ModelError(f"{where}: initializer {t.name!r} is defined twice")
        initializers.add(t.name)
        external = _check_tensor(t, f"{where}: initializer {t.name!r}") or external
    defined = set(initializers)  # (an input may name an initializer: its default value, IR < 4)
    for vi in graph.input:
        if vi.name in initializers:
            continue
        if vi.name in defined:
            raise ModelError(f"{where}: input {vi.name!r} is listed twice")
        _check_value_info(vi, f"{where}: input {vi.name!r}")
        defined.add(vi.name)
    for vi in graph.output:
        _check_value_info(vi, f"{where}: output {vi.name!r}")
    subgraphs = []
    for i, node in enumerate(graph.node):
        _utf8([node.op_type, node.domain, node.name, *node.input, *node.output, *(a.name for a in node.attribute)],
              f"{where}: node #{i}")
        for out in node.output:
            if out in defined and out:
                raise ModelError(f"{where}: node {node.name or '#' + str(i)} ({node.op_type}) defines {out!r}, "
                                 "which is already defined (a value is defined once: SSA)")
            defined.add(out)
        for a in node.attribute:
            if a.HasField("g"):
                subgraphs.append(a.g)
            subgraphs.extend(a.graphs)
            for t in ([a.t] if a.HasField("t") else []) + list(a.tensors):
                where_t = f"{where}: node {node.name or '#' + str(i)} ({node.op_type}) attribute {a.name!r}"
                external = _check_tensor(t, where_t) or external
    return subgraphs, external


def _check_value_info(vi, where):
    if not vi.type.HasField("tensor_type"):
        return  # (graph_io names it)
    dims = vi.type.tensor_type.shape.dim
    _utf8([d.dim_param for d in dims], where)
    fixed = [d.dim_value for d in dims if d.HasField("dim_value")]
    if fixed and (min(fixed) <= 0 or math.prod(fixed) > MAX_ELEMENTS) and over_cap(fixed):
        shown = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
        raise ModelError(f"{where}: dims {shown} {over_cap(fixed)}")


def _utf8(strings, where):
    """Names are text: protobuf hands a string that is not UTF-8 over as bytes, which nothing downstream expects."""
    for s in strings:
        if type(s) is not str:
            raise ModelError(f"{where}: a name that is not UTF-8 text ({bytes(s)[:40]!r})")


def _check_tensor(t, where):
    """A dtype dlnet holds, dims >= 0 within the cap; True where the tensor keeps its data in an external file."""
    if t.data_type not in ONNX_DTYPES and t.data_type not in HOST_DTYPES:
        onnx_dtype(t.data_type, f"{where}: ")  # (raises, naming the dtypes there are)
    dims = t.dims
    if dims and (min(dims) <= 0 or math.prod(dims) > MAX_ELEMENTS) and over_cap(dims):
        raise ModelError(f"{where}: dims {list(dims)} {over_cap(dims)}")
    return t.data_location == onnx.TensorProto.EXTERNAL


# ------------------------------------------------------------------ external data ----------------------------------
def _is_external(t):
    return t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL


def _tensors(graph):
    """The tensors a graph holds itself: initializers and node attributes (subgraphs are graphs of their own)."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors


def _read_external(graphs, base_dir, name):
    """Read every external tensor's bytes into it, from inside base_dir only; returns the real paths read."""
    used = defaultdict(int)  # (device, inode) -> bytes its tensors read
    files = []
    for graph in graphs:
        for t in _tensors(graph):
            if _is_external(t):
                files.append(_read_one(t, base_dir, name, used))
    return files


def _read_one(t, base_dir, name, used):
    where = f"{name}: tensor {t.name!r}"
    if base_dir is None:
        raise ModelError(f"{where} keeps its data in an external file; pass base_dir= (the folder that holds it) to "
                         "load_onnx")
    dtype = ONNX_DTYPES.get(t.data_type)
    if dtype is None or dtype == "object":
        raise ModelError(f"{where}: external data of data type {t.data_type} is not supported")
    nbytes = elements(t.dims) * (2 if t.data_type == BFLOAT16 else np.dtype(dtype).itemsize)
    try:
        info = external_data_helper.ExternalDataInfo(t)
    except ValueError as e:  # offset or length not a non-negative integer
        raise ModelError(f"{where}: external data {str(e)[:160]}") from None
    location = info.location[:200]
    if info.length is not None and info.length != nbytes:
        raise ModelError(f"{where}: external data length {info.length} is not the {nbytes} bytes its dims and dtype "
                         "take")
    try:  # onnx's checks: relative, inside base_dir, no symlink, no hard link, a regular file
        fd = external_data_helper._open_external_data_fd(base_dir, info.location, t.name, True)
    except (onnx.checker.ValidationError, OSError, ValueError) as e:
        raise ModelError(f"{where}: external data {location!r} refused ({str(e)[:200]})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        offset = info.offset or 0
        if offset + nbytes > st.st_size:
            raise ModelError(f"{where}: external data {location!r} holds {st.st_size} bytes; the tensor needs "
                             f"{nbytes} from offset {offset}")
        used[st.st_dev, st.st_ino] += nbytes
        if used[st.st_dev, st.st_ino] > st.st_size:
            raise ModelError(f"{where}: the tensors in external data {location!r} read {used[st.st_dev, st.st_ino]} "
                             f"bytes of a {st.st_size}-byte file (a byte is read once)")
        f.seek(offset)
        data = f.read(nbytes)
    if len(data) != nbytes:
        raise ModelError(f"{where}: external data {location!r} ended early")
    t.raw_data = data
    t.data_location = onnx.TensorProto.DEFAULT
    del t.external_data[:]
    return os.path.realpath(os.path.join(base_dir, info.location))
