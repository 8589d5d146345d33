"""The device schedule (dlnet/kernels/schedule.py): every algorithm of the Conv, Gemm, Attention and AttentionGrad
tables that this device can run is chosen where it applies, written on the node, printed, and matches a float64
reference."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.graph.ir import Builder, Graph
from dlnet.graph.parser import parse_graph
from dlnet.kernels import schedule
from dlnet.plan import Plan

from ..conftest import context, make_model, rel_l2

rng = np.random.default_rng(11)
WINO = {"winograd_min_channels": 8, "winograd_min_layer_tiles": 0}


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def conv_case(xs, ws, **attrs):
    x, w, b = f32(*xs), f32(*ws), f32(ws[0])
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], {"x": x}, ["y"], {"w": w, "b": b})
    return model, {"x": x}


def gemm_case(m, k, n):
    a, b, c = f32(m, k), f32(n, k), f32(n)
    model = make_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1)], {"a": a}, ["y"], {"b": b, "c": c})
    return model, {"a": a}


def by_rows_case(m, k, n):
    """Gemm(a, b) with b [K, N] a graph input, as a fully connected layer's gradients read their weight and input."""
    a, b = f32(m, k), f32(k, n)
    return make_model([helper.make_node("Gemm", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"]), {"a": a, "b": b}


def attention_case(b, h, t, d):
    q, k, v = f32(b, h, t, d), f32(b, h, t, d), f32(b, h, t, d)
    model = make_model([helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)], {"q": q, "k": k, "v": v},
                       ["y"], opset=23)
    return model, {"q": q, "k": k, "v": v}


# (algorithm, device kind it runs on or None for any, options, case)
CASES = [
    ("winograd2", None, dict(WINO, matrix_core="portable"), lambda: conv_case((2, 16, 14, 14), (16, 16, 3, 3),
                                                                              pads=[1] * 4)),
    ("depthwise_planes_cpu", "cpu", {}, lambda: conv_case((2, 8, 9, 9), (8, 1, 3, 3), group=8, pads=[1] * 4)),
    ("depthwise_cpu", "cpu", {"dw_cpu_planes": False},
     lambda: conv_case((2, 8, 9, 9), (8, 1, 3, 3), group=8, pads=[1] * 4)),
    ("depthwise", "gpu", {}, lambda: conv_case((2, 8, 9, 9), (8, 1, 3, 3), group=8, pads=[1] * 4)),
    ("cpu_winograd", "cpu", {}, lambda: conv_case((1, 16, 16, 16), (24, 16, 3, 3), pads=[1] * 4)),
    ("cpu_direct", "cpu", {"conv_cpu_winograd": False},
     lambda: conv_case((1, 16, 12, 12), (24, 16, 3, 3), pads=[1] * 4)),
    ("cpu_local", "cpu", {}, lambda: conv_case((2, 16, 7, 7), (24, 16, 1, 1))),
    ("cpu_pixels", "cpu", {}, lambda: conv_case((1, 16, 5, 5), (128, 16, 3, 3), pads=[1] * 4)),
    ("cpu_im2col", "cpu", {"conv_cpu_direct": False, "conv_cpu_winograd": False},
     lambda: conv_case((1, 5, 9, 9), (7, 5, 3, 3), strides=[2, 2])),
    ("implicit_gemm", None, {"matrix_core": "portable", "winograd_min_channels": 0},
     lambda: conv_case((2, 6, 9, 9), (10, 6, 3, 3), pads=[1] * 4)),
    ("gemm_cpu", "cpu", {}, lambda: gemm_case(5, 40, 30)),
    ("gemv", None, {"matrix_core": "portable"}, lambda: gemm_case(4, 64, 40)),
    ("gemv_rows", None, {"matrix_core": "portable", "gemv_mma": None}, lambda: gemm_case(16, 64, 40)),
    ("gemv_cols", None, {"matrix_core": "portable"}, lambda: by_rows_case(16, 100, 40)),
    ("gemm_outer", None, {"matrix_core": "portable"}, lambda: by_rows_case(64, 16, 40)),
    ("gemm", None, {"matrix_core": "portable"}, lambda: gemm_case(64, 48, 40)),
    ("flash_cpu", "cpu", {}, lambda: attention_case(2, 3, 40, 16)),
    ("flash", None, {"matrix_core": "portable"}, lambda: attention_case(2, 3, 40, 16)),
]


def reference(model, feeds):
    """onnx's reference evaluator (float32 in, numpy's float32 arithmetic: ~1e-7 against float64)."""
    import onnx.reference
    return onnx.reference.ReferenceEvaluator(model).run(None, feeds)[0].astype(np.float64)


@pytest.mark.parametrize("algo,kind,options,case", CASES, ids=[c[0] for c in CASES])
def test_each_algorithm_where_it_applies(algo, kind, options, case):
    ctx = context()
    if kind is not None and ctx.dev.kind != kind:
        pytest.skip(f"{algo} runs on {kind} devices")
    ctx = ctx.with_options(**options)
    model, feeds = case()
    net = dlnet.Net(ctx).load_onnx(model)
    y = net.run(feeds)["y"]
    node = next(n for n in net._last.graph.nodes if n.op in ("Conv", "Gemm", "Attention"))
    assert node.schedule["algo"] == algo
    assert node.schedule.get("tile"), "the lowering records the tile it took"
    text = str(net.graph)
    assert f"algo={algo} tile={node.schedule['tile']}" in text
    assert parse_graph(text, {v.id: v.const for n in net._last.graph.nodes for v in n.inputs
                              if v is not None and v.const is not None}).nodes[-1].schedule == node.schedule
    assert rel_l2(y, reference(model, feeds)) < 1e-5
    net.release()


# AttentionGrad's table, which training graphs reach: (algorithm, precision, options off NVIDIA)
GRAD_CASES = [("flash_grad", "fp32", {}), ("flash_grad_mma", "tf32", {"mma_emulate": True})]


@pytest.mark.parametrize("algo,precision,options", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_attention_gradient_algorithms(algo, precision, options):
    """AttentionGrad by attention_grad.cl (flash_grad) and on the tensor cores (flash_grad_mma: tf32 on NVIDIA, else
    with its PTX emulated): the choice written on the node, printed and parsed back, the gradients against float64."""
    base = context()
    ctx = dlnet.Context(base.info, precision=precision,
                        options=base.with_options(**({} if base.dev.is_nvidia else options)).options)
    arrays = [f32(1, 2, 20, 16) for _ in range(5)]
    g = Graph()
    outs = Builder(g).op("AttentionGrad", [g.add_input(f"x{i}", "float32", a.shape) for i, a in enumerate(arrays)],
                         {"scale": 0.25, "causal": 1}, n_out=4)
    g.outputs, g.output_names = outs, ["dq", "dk", "dv", "stats"]
    node = outs[0].producer
    ref = node.spec.numpy(node, *arrays)
    plan = Plan(ctx, g)
    try:
        got = plan.run(arrays)
    finally:
        plan.release()
    assert node.schedule["algo"] == algo and node.schedule.get("tile")
    text = str(plan.graph)
    assert f"algo={algo} tile={node.schedule['tile']}" in text
    assert parse_graph(text, {}).nodes[-1].schedule == node.schedule
    for a, r in zip(got[:3], ref[:3], strict=True):
        assert rel_l2(a, r) < (1e-5 if precision == "fp32" else 5e-3)


def test_the_cases_cover_the_tables():
    """Every algorithm the tables can choose has a case above (the CPU conv paths and gemv's variants by name)."""
    names = {c[0] for c in CASES} | {c[0] for c in GRAD_CASES}
    table = {a.name for algos in schedule.ALGOS.values() for a in algos}
    expanded = (table - {"winograd", "cpu"}) | {"winograd2", "cpu_winograd", "cpu_direct", "cpu_local",
                                               "cpu_im2col", "cpu_pixels", "gemv_rows", "gemv_cols"}
    assert expanded - {"gemv_mma"} <= names, sorted(expanded - names)


def test_the_first_algorithm_that_applies_wins():
    """A Conv that is depthwise on a CPU is depthwise_planes_cpu, not ConvCpu, though both apply."""
    ctx = context()
    if not ctx.dev.is_cpu:
        pytest.skip("the CPU device's table")
    model, feeds = conv_case((2, 8, 9, 9), (8, 1, 3, 3), group=8, pads=[1] * 4)
    net = dlnet.Net(ctx).load_onnx(model)
    node = next(n for n in net._last.graph.nodes if n.op == "Conv")
    applies = [a.name for a in schedule.ALGOS["Conv"] if a.applies(node, ctx.dev, ctx.options)]
    assert applies[0] == "depthwise_planes_cpu" and "cpu" in applies
    net.release()
