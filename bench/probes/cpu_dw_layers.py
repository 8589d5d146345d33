"""Probe: one-layer CPU models of shufflenet's depthwise and grouped 1x1 convolutions, dlnet's kernel time (OpenCL
profiling events, median of 50) and wall time against onnxruntime's wall time (ORT_ENABLE_ALL), one process.
Asserts nothing.

    python bench/probes/cpu_dw_layers.py
"""
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import dlnet

# (name, channels, size, kernel, stride, groups (None: depthwise), Relu after)
LAYERS = [("depthwise 3x3, 136 x 28 x 28", 136, 28, 3, 1, None, False),
          ("depthwise 3x3, 272 x 14 x 14", 272, 14, 3, 1, None, False),
          ("depthwise 3x3 stride 2, 112 x 56 x 56", 112, 56, 3, 2, None, False),
          ("depthwise 3x3, 544 x 7 x 7", 544, 7, 3, 1, None, False),
          ("1x1 group 4, 136 -> 136 at 28 x 28, + Relu", 136, 28, 1, 1, 4, True)]


def model(c, size, k, stride, groups, relu):
    groups = groups or c
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((c, c // groups, k, k)) * 0.3).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], group=groups, pads=[k // 2] * 4,
                              strides=[stride, stride])]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    out = (size + 2 * (k // 2) - k) // stride + 1
    graph = helper.make_graph(nodes, "layer",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, out, out])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def median_ms(fn, n=50):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ctx = dlnet.Context("cpu", profile=True)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    print("| layer | dlnet kernel ms | dlnet wall ms | onnxruntime wall ms | tile |")
    print("|---|---|---|---|---|")
    for name, c, size, k, stride, groups, relu in LAYERS:
        m = model(c, size, k, stride, groups, relu)
        x = np.random.default_rng(1).standard_normal((1, c, size, size)).astype(np.float32)
        net = dlnet.Net(ctx).load_onnx(m)
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for _ in range(20):
            net.run({"x": x})
            sess.run(None, {"x": x})
        kernel = []
        for _ in range(50):
            events = [launch.enqueue(ctx.queue) for launch in net.launches]
            ctx.queue.finish()
            kernel.append(sum((e.profile.end - e.profile.start) * 1e-6 for e in events))
        ort_ms = median_ms(lambda: sess.run(None, {"x": x}))  # noqa: B023 (called in this iteration)
        dl_ms = median_ms(lambda: net.run({"x": x}))  # noqa: B023
        tiles = [n.schedule.get("tile") for n in net.graph.nodes if n.schedule]
        print(f"| {name} | {statistics.median(kernel):.3f} | {dl_ms:.3f} | {ort_ms:.3f} | {tiles} |")
        net.release()


if __name__ == "__main__":
    main()
