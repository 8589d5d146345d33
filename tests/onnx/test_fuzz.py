"""Bounded fuzz of the loader (marked `fuzz`; about 30 s on 2 cores): mutated ONNX models, from random byte flips
of two small serialized models and from protobuf field mutations (dims, attribute values and types, op types,
input and output names, op-set and IR versions, initializer bytes), are loaded and run by a worker process
(tests/onnx/fuzz_worker.py). Only a DlnetError may escape Net(...).load_onnx(...) and run(); a crash (the worker
dies) or a hang (no answer in HANG_S) fails the test with the model that caused it. The examples are the same on
every run (derandomized).

A longer run, with fresh examples each time (hours; the same checks):

    python -m tests.onnx.test_fuzz 20000
"""
import json
import os
import select
import struct
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from dlnet.onnx.common import HANDLERS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANG_S = 60  # one model's load and run; the slowest seen was a few seconds (kernels compiled for new shapes)
CI = settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))

pytestmark = pytest.mark.fuzz


def _cnn():
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "shape"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["g"], transB=1, alpha=1.0),
             helper.make_node("Softmax", ["g"], ["y"], axis=1)]
    inits = [numpy_helper.from_array(a, n) for n, a in
             [("w", f(4, 2, 3, 3)), ("b", f(4)), ("shape", np.array([0, -1], np.int64)), ("fc", f(5, 64)),
              ("fb", f(5))]]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def _tensor_ops():
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
             helper.make_node("Concat", ["n1", "tail"], ["shape"], axis=0),
             helper.make_node("ConstantOfShape", ["shape"], ["z"], value=helper.make_tensor("v", 1, [1], [0.5])),
             helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["sl"]),
             helper.make_node("ReduceMean", ["sl"], ["m"], axes=[2], keepdims=1),
             helper.make_node("Expand", ["m", "eshape"], ["e"]),
             helper.make_node("Add", ["e", "z"], ["a"]),
             helper.make_node("Cast", ["a"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Where", ["mask", "c", "a"], ["y"])]
    inits = [numpy_helper.from_array(a, n) for n, a in
             [("i0", np.array(0, np.int64)), ("ax0", np.array([0], np.int64)), ("tail", np.array([4, 3], np.int64)),
              ("starts", np.array([0], np.int64)), ("ends", np.array([3], np.int64)), ("axes", np.array([2], np.int64)),
              ("eshape", np.array([1, 4, 3], np.int64)), ("mask", rng.random((4, 3)) < 0.5)]]
    graph = helper.make_graph(nodes, "ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def _branches():
    """If on a constant condition (inlined at load), each branch with an initializer of its own, reading x."""
    def branch(name, op):
        k = numpy_helper.from_array(np.full((1, 3), 0.5 if op == "Add" else 2.0, np.float32), f"k_{name}")
        return helper.make_graph([helper.make_node(op, ["x", f"k_{name}"], [f"o_{name}"])], name, [],
                                 [helper.make_tensor_value_info(f"o_{name}", TensorProto.FLOAT, None)], [k])
    nodes = [helper.make_node("If", ["cond"], ["b"], then_branch=branch("then", "Add"),
                              else_branch=branch("else", "Mul")),
             helper.make_node("Tanh", ["b"], ["y"])]
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(True), "cond")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


MODELS = [_cnn(), _tensor_ops(), _branches()]
SERIALIZED = [m.SerializeToString() for m in MODELS]
INTS = [0, 1, -1, 2, 3, 7, 64, 255, 2**16, 2**31 - 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 1, -2**31, -2**63]
FLOATS = [0.0, -1.0, 1e-30, 1e30, float("nan"), float("inf"), -float("inf"), 0.5]
OPS = sorted(HANDLERS) + ["NoSuchOp", ""]
OPSETS = [-1, 0, 1, 6, 7, 9, 10, 11, 12, 13, 14, 17, 18, 21, onnx.defs.onnx_opset_version(), 99, 2**40]


class Worker:
    """The fuzz target in its own process; started again after a crash or a hang."""

    def __init__(self):
        self.proc = None

    def start(self):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.onnx.fuzz_worker"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self._reply(120) == {"ready": True}

    def _reply(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        return json.loads(line) if line else None

    def check(self, data):
        """The worker's answer for one model, or {"ok": False, ...} where it crashed or hung."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
        self.proc.stdin.flush()
        reply = self._reply(HANG_S)
        if reply is None:
            self.proc.kill()
            code = self.proc.wait()
            self.proc = None
            what = "hang" if code == -9 else f"crash (exit {code})"
            return {"ok": False, "what": what, "msg": f"no answer within {HANG_S} s" if what == "hang" else ""}
        return reply

    def stop(self):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(30)
            self.proc = None


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.stop()


def _assert_only_dlnet_errors(worker, data, what):
    reply = worker.check(data)
    assert reply["ok"], (f"{what}: {reply['what']} escaped: {reply.get('msg', '')}\n{reply.get('tb', '')}\n"
                         f"model bytes: {data.hex() if len(data) < 4000 else len(data)}")


@given(st.integers(0, len(MODELS) - 1), st.lists(st.tuples(st.integers(0, 2**31), st.integers(1, 255)),
                                                  min_size=1, max_size=6), st.integers(0, 8))
def flipped_bytes(worker, which, flips, cut):
    data = bytearray(SERIALIZED[which])
    for at, bits in flips:
        data[at % len(data)] ^= bits
    _assert_only_dlnet_errors(worker, bytes(data[:len(data) - cut]), f"model {which} with bytes {flips} flipped")


def _mutate(model, data):
    """One protobuf field mutation drawn from `data`; returns its description."""
    g = model.graph
    if data.draw(st.booleans()):  # a subgraph's node or initializer instead, where there is one
        subs = [a.g for n in g.node for a in n.attribute if a.HasField("g")]
        g = subs[data.draw(st.integers(0, len(subs) - 1))] if subs else g
    if not g.node:
        return "nothing (no node left)"
    kind = data.draw(st.sampled_from(["dim", "input_dim", "attr", "attr_type", "op", "input", "output", "opset",
                                      "ir", "raw", "dtype", "drop", "duplicate"]))
    node = g.node[data.draw(st.integers(0, len(g.node) - 1))]
    names = sorted({n for x in g.node for n in list(x.input) + list(x.output)} | {i.name for i in g.initializer})
    if kind == "dim" and g.initializer:
        t = g.initializer[data.draw(st.integers(0, len(g.initializer) - 1))]
        dims = list(t.dims) or [1]
        dims[data.draw(st.integers(0, len(dims) - 1))] = data.draw(st.sampled_from(INTS))
        del t.dims[:]
        t.dims.extend(dims)
        return f"initializer {t.name} dims {dims}"
    if kind == "input_dim" and model.graph.input[0].type.tensor_type.shape.dim:
        dims = model.graph.input[0].type.tensor_type.shape.dim
        dim = dims[data.draw(st.integers(0, len(dims) - 1))]
        dim.dim_value = data.draw(st.sampled_from(INTS))
        return f"input dim {dim.dim_value}"
    if kind in ("attr", "attr_type") and node.attribute:
        a = node.attribute[data.draw(st.integers(0, len(node.attribute) - 1))]
        if kind == "attr_type":
            a.type = data.draw(st.sampled_from(list(onnx.AttributeProto.AttributeType.values())))
        elif a.type == onnx.AttributeProto.INTS:
            del a.ints[:]
            a.ints.extend(data.draw(st.lists(st.sampled_from(INTS), max_size=5)))
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = data.draw(st.sampled_from(FLOATS))
        else:
            a.i = data.draw(st.sampled_from(INTS))
        return f"node {node.op_type} attribute {a.name} -> {a}"
    if kind == "op":
        node.op_type = data.draw(st.sampled_from(OPS))
        return f"op {node.op_type}"
    if kind in ("input", "output"):
        field = node.input if kind == "input" else node.output
        new = data.draw(st.sampled_from(names + ["", "nothing"]))
        if field:
            field[data.draw(st.integers(0, len(field) - 1))] = new
        else:
            field.append(new)
        return f"{kind} {new!r} of {node.op_type}"
    if kind == "opset":
        model.opset_import[0].version = data.draw(st.sampled_from(OPSETS))
        return f"opset {model.opset_import[0].version}"
    if kind == "ir":
        model.ir_version = data.draw(st.sampled_from([0, 3, 7, onnx.IR_VERSION, 99]))
        return f"ir {model.ir_version}"
    if not g.initializer:
        return "nothing"
    t = g.initializer[data.draw(st.integers(0, len(g.initializer) - 1))]
    if kind == "raw":
        t.raw_data = t.raw_data[:data.draw(st.integers(0, len(t.raw_data)))] + data.draw(st.binary(max_size=16))
        return f"initializer {t.name} raw_data of {len(t.raw_data)} bytes"
    if kind == "dtype":
        t.data_type = data.draw(st.sampled_from(list(TensorProto.DataType.values())))
        return f"initializer {t.name} data type {t.data_type}"
    if kind == "drop":
        g.node.remove(node)
        return f"node {node.op_type} dropped"
    g.node.append(node)
    return f"node {node.op_type} twice"


@given(st.integers(0, len(MODELS) - 1), st.data())
def mutated_fields(worker, which, data):
    model = onnx.ModelProto()
    model.CopyFrom(MODELS[which])
    done = [_mutate(model, data) for _ in range(data.draw(st.integers(1, 3)))]
    try:
        serialized = model.SerializeToString()
    except Exception:  # a mutation protobuf itself refuses to write
        return
    _assert_only_dlnet_errors(worker, serialized, f"model {which} mutated: {done}")


def test_fuzz_flipped_bytes(worker):
    CI(flipped_bytes)(worker)


def test_fuzz_mutated_fields(worker):
    CI(mutated_fields)(worker)


def test_worker_reports_a_crash_and_what_escaped(worker):
    """The harness itself: a model dlnet accepts runs; a crash is reported as one, not as a pass."""
    assert worker.check(SERIALIZED[0]) == {"ok": True, "what": "ran"}
    assert worker.check(b"\x00junk")["what"] == "ModelError"
    worker.proc.kill()
    worker.proc.wait()
    assert worker.check(SERIALIZED[1]) == {"ok": True, "what": "ran"}  # started again


if __name__ == "__main__":  # the long run: python -m tests.onnx.test_fuzz [examples]
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    long_run = settings(CI, max_examples=n, derandomize=False)
    w = Worker()
    try:
        long_run(flipped_bytes)(w)
        long_run(mutated_fields)(w)
    finally:
        w.stop()
    print(f"fuzz: {2 * n} models, only DlnetErrors escaped")
