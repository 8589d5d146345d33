"""A fully connected layer's two gradient products at a small batch, as a training step runs them (B a [K, N]
tensor stored by rows): dX = dy W on gemv_cols.cl's gemv_cols and dW = dy^T x on its gemm_outer, against the GEMM
core and cuBLAS (torch.matmul), at configs of their tiles.

    python3 bench/probes/fc_grads.py [--cols LN,LK,KC,per_cu ...] [--outer LN,RM ...]

Shapes: alexnet's and vgg16's classifiers at batch 16. Kernel time from OpenCL profiling events and CUDA events,
median of 10, a 256 MiB buffer written before each (the operands come from memory); the last column: GB/s of the
larger operand (W, or dW) for the best dlnet config. Runs on the GPU machine; asserts nothing but prints errors over
1e-5.
"""
import argparse
import statistics

import numpy as np
import torch
from onnx import TensorProto, helper

import dlnet
from dlnet.kernels import rules

SHAPES = [(16, 4096, 9216), (16, 4096, 4096), (16, 1000, 4096), (16, 4096, 25088), (32, 4096, 9216)]
FLUSH = None


def model(a_shape, b_shape, trans_a):
    g = helper.make_graph([helper.make_node("Gemm", ["a", "b"], ["y"], transA=trans_a)], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def launches_ms(net, queue, keep=lambda launch: True):
    """Median kernel ms of net's launches that `keep` (profiling events), 10 of 12 runs, FLUSH written before each."""
    times = []
    for _ in range(12):
        FLUSH.zero_()
        torch.cuda.synchronize()
        events = [(launch, launch.enqueue(queue)) for launch in net.launches]
        queue.finish()
        times.append(sum(e.profile.end - e.profile.start for launch, e in events if keep(launch)) * 1e-6)
    return statistics.median(times[2:])


def dlnet_ms(ctx, feeds, trans_a, ref):
    net = dlnet.Net(ctx).load_onnx(model(feeds["a"].shape, feeds["b"].shape, trans_a))
    y = net.run(feeds)["y"]
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    ms = launches_ms(net, ctx.queue)
    labels = " ".join(sorted({w for launch in net.launches for w in launch.label.split("Gemm")[-1].split()[:1]}))
    net.release()
    return ms, err, labels


def torch_ms(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(12):
        FLUSH.zero_()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def main():
    global FLUSH
    ap = argparse.ArgumentParser()
    ap.add_argument("--cols", nargs="*", default=[], help="gemv_cols configs LN,LK,KC,per_cu")
    ap.add_argument("--outer", nargs="*", default=[], help="gemm_outer configs LN,RM")
    args = ap.parse_args()
    FLUSH = torch.empty(64 << 20, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    ctx = dlnet.Context("gpu", profile=True)
    cols0, outer0 = dict(rules.GEMV_COLS_TILES), dict(rules.OUTER_TILES)
    configs = [("core", dict(gemv_cols_max_rows=0, outer_max_k=0), None, None), ("rule", {}, None, None)]
    configs += [(f"cols {c}", {}, dict(zip(["LN", "LK", "KC", "per_cu"], map(int, c.split(",")))), None)
                for c in args.cols]
    configs += [(f"outer {c}", {}, None, dict(zip(["LN", "RM"], map(int, c.split(","))))) for c in args.outer]
    print("| product | M x N x K | cuBLAS | " + " | ".join(c[0] for c in configs) + " | GB/s |")
    print("|---" * (len(configs) + 4) + "|")
    for m, out, inp in SHAPES:
        rng = np.random.default_rng(0)
        dy, w, x = (rng.standard_normal(s).astype(np.float32) for s in ((m, out), (out, inp), (m, inp)))
        td, tw, tx = (torch.from_numpy(v).cuda() for v in (dy, w, x))
        for what, feeds, ta, ref, fn, nbytes, mnk in [
                ("dX = dy W", {"a": dy, "b": w}, 0, (td.double() @ tw.double()).cpu().numpy(),
                 lambda: td @ tw, 4 * out * inp, (m, inp, out)),
                ("dW = dy^T x", {"a": dy, "b": x}, 1, (td.double().T @ tx.double()).cpu().numpy(),
                 lambda: td.T @ tx, 4 * out * inp, (out, inp, m))]:
            row = []
            for name, opts, cols, outer in configs:
                rules.GEMV_COLS_TILES.clear()
                rules.GEMV_COLS_TILES.update(cols or cols0)
                rules.OUTER_TILES.clear()
                rules.OUTER_TILES.update(outer or outer0)
                if (cols and ta) or (outer and not ta):
                    row.append(None)
                    continue
                t, err, labels = dlnet_ms(ctx.with_options(**opts), feeds, ta, ref)
                if err > 1e-5:
                    print(f"  {what} {mnk} {name}: rel err {err:.1e}")
                row.append((t, labels))
            best = min(t for t, _ in filter(None, row))
            print(f"| {what} | {'x'.join(map(str, mnk))} | {torch_ms(fn):.4f} | " +
                  " | ".join(f"{t:.4f} ({lab})" if t else "-" for t, lab in (r or (None, None) for r in row)) +
                  f" | {nbytes / best / 1e6:.0f} |")
    rules.GEMV_COLS_TILES.update(cols0)
    rules.OUTER_TILES.update(outer0)


if __name__ == "__main__":
    main()
