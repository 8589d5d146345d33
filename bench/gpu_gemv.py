"""gemv.cl's work-group configs (and the GEMM core) against cuBLAS (torch F.linear) on fully connected layers' shapes.

    python3 bench/gpu_gemv.py

Kernel time from OpenCL profiling events and CUDA events, median; prints a table (the last column: B's bytes per
second for the best config). Runs on the GPU machine; asserts nothing.
"""
import statistics

import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper

import dlnet
from dlnet.kernels import lowering


def model(m, n, k, w):
    g = helper.make_graph([helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1)], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(n, np.float32), "c")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


SHAPES = [(1, 4096, 25088), (1, 4096, 9216), (1, 4096, 4096), (1, 1000, 4096), (16, 4096, 25088), (16, 4096, 9216),
          (16, 4096, 4096), (16, 1000, 4096), (4, 4096, 9216)]
CONFIGS = ["32,4,2", "32,8,1", "64,4,1", "32,4,4", "32,2,2", "64,2,2", "core"]  # LK,LN,NC of gemv.cl; the GEMM core


def cublas_ms(a, w):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(15):
        start.record()
        torch.nn.functional.linear(a, w)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[3:])


def dlnet_ms(ctx, cfg, a, w, ref):
    if cfg == "core":
        lowering.GEMV_MAX_ROWS = 0
    else:
        lowering.GEMV_MAX_ROWS = 16
        lowering.GEMV_TILES = tuple(int(v) for v in cfg.split(","))
    net = dlnet.Net(ctx).load_onnx(model(a.shape[0], w.shape[0], w.shape[1], w))
    y = net.run({"a": a})["y"]
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    if err > 1e-5:
        print(f"  {cfg}: rel err {err:.1e}")
    times = []
    for _ in range(12):
        events = [launch.enqueue(ctx.queue) for launch in net.launches]
        ctx.queue.finish()
        times.append(sum(e.profile.end - e.profile.start for e in events) * 1e-6)
    net.release()
    return statistics.median(times[2:])


def main():
    ctx = dlnet.Context("gpu", profile=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"{'M':>3} {'N':>5} {'K':>6} {'cuBLAS ms':>9} " + " ".join(f"{c:>9}" for c in CONFIGS) +
          "   (GB/s of B for the best)")
    for m, n, k in SHAPES:
        rng = np.random.default_rng(0)
        w = rng.standard_normal((n, k)).astype(np.float32)
        a = rng.standard_normal((m, k)).astype(np.float32)
        wt, at = torch.from_numpy(w).cuda(), torch.from_numpy(a).cuda()
        ref = (at.double() @ wt.double().T).cpu().numpy()
        row = [dlnet_ms(ctx, cfg, a, w, ref) for cfg in CONFIGS]
        print(f"{m:3d} {n:5d} {k:6d} {cublas_ms(at, wt):9.4f} " + " ".join(f"{t:9.4f}" for t in row) +
              f"   {4 * n * k / min(row) / 1e6:.0f}")


if __name__ == "__main__":
    main()

