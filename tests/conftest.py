import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dlnet

_CTX = None


def context():
    global _CTX
    if _CTX is None:
        _CTX = dlnet.Context(os.environ.get("DLNET_TEST_DEVICE") or None)
    return _CTX


def tensor_core_context(precision, **options):
    """The test device in `precision` ("tf32" or "fp16") on the tensor-core kernels (gemm_mma.cl, attention_mma.cl):
    NVIDIA's, or elsewhere the GPU cores with their PTX emulated (Options.matrix_core "mma_emulated", mma_emulate)."""
    ctx = context()
    if not ctx.is_nvidia:
        options.update(matrix_core="mma_emulated", mma_emulate=True)
    ctx = dlnet.Context(ctx.info, precision=precision, options=ctx.options.replace(**options))
    assert ctx.dev.mma
    return ctx


@pytest.fixture(scope="session")
def ctx():
    return context()


def rel_l2(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    den = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (den if den > 0 else 1.0))


NP_TO_ONNX = {np.dtype(k): v for k, v in [("float32", TensorProto.FLOAT), ("float64", TensorProto.DOUBLE),
                                           ("int64", TensorProto.INT64), ("int32", TensorProto.INT32),
                                           ("bool", TensorProto.BOOL), ("uint8", TensorProto.UINT8),
                                           ("int8", TensorProto.INT8), ("float16", TensorProto.FLOAT16)]}


def make_model(nodes, inputs, outputs, initializers=(), opset=13):
    """inputs: {name: ndarray or (dtype, shape)}; outputs: list of names; initializers: {name: ndarray}."""
    def vi(name, spec):
        if isinstance(spec, np.ndarray):
            dt, shape = spec.dtype, spec.shape
        else:
            dt, shape = np.dtype(spec[0]), spec[1]
        return helper.make_tensor_value_info(name, NP_TO_ONNX[np.dtype(dt)], shape)

    graph = helper.make_graph(
        nodes, "test", [vi(n, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in dict(initializers).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


def reference(model, feeds):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model).run(None, feeds)


def run_dlnet(model, feeds, ctx=None):
    net = dlnet.Net(ctx or context()).load_onnx(model)
    return list(net.run(feeds).values())
