"""gemv.cl's and gemv_rows.cl's work-group configs (and the GEMM core) against cuBLAS (torch F.linear) on fully
connected layers' shapes.

    python3 bench/gpu_gemv.py [--rows [--prefetch | --mma]]

Kernel time from OpenCL profiling events and CUDA events, median; prints a table (the last column: B's bytes per
second for the best config). --rows: only the shapes of more than GEMV_REG_ROWS rows, against gemv_rows.cl's configs
(and gemv.cl at its default config taking those rows too). Runs on the GPU machine; asserts nothing. A config that
does not apply to a shape (gemv.cl beyond its rows, gemv_rows.cl within them) prints '-'. --prefetch: gemv_rows.cl's
configs with the next chunk of A read ahead (PREFETCH_A). --mma: gemv_mma.cl's configs (tf32 mode, tensor cores)
against gemv_rows.cl's table (fp32). A 256 MiB buffer is written before each repetition, so B comes from
memory as it does in a net.
"""
import statistics
import sys

import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper

import dlnet
from dlnet.kernels.rules import GEMV_REG_ROWS, GEMV_ROWS_TILES


def model(m, n, k, w):
    g = helper.make_graph([helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1)], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(n, np.float32), "c")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


SHAPES = [(1, 4096, 25088), (1, 4096, 9216), (1, 4096, 4096), (1, 1000, 4096), (16, 4096, 25088), (16, 4096, 9216),
          (16, 4096, 4096), (16, 1000, 4096), (4, 4096, 9216)]
# LK,LN,NC of gemv.cl (taking 16 rows too); gemv_rows.cl's table (more than GEMV_REG_ROWS rows); the GEMM core
CONFIGS = ["gemv", "table", "core"]
# batch 9..32: vgg16's (25088) and alexnet's (9216) classifiers, their 4096 -> 4096 and -> 1000 layers
ROW_SHAPES = [(16, 4096, 25088), (16, 4096, 9216), (16, 4096, 4096), (16, 1000, 4096), (32, 4096, 25088),
              (32, 4096, 9216), (32, 4096, 4096), (32, 1000, 4096), (12, 4096, 9216)]
# gemv_rows.cl as 'rows:LK,LN,NC,KC,per_cu[/splits]' (splits: GEMV_ROWS_SPLITS, at most what 4 MiB of partial sums
# hold here; none: picked); 'table': its GEMV_ROWS_TILES as they are; '64,2,2': gemv.cl taking these rows; the core
ROW_CONFIGS = ["table", "rows:8,32,4,512,2", "rows:8,16,4,512,3", "rows:8,16,4,256,3", "rows:8,32,2,512,3",
               "rows:16,16,4,256,2", "rows:8,64,4,512,1", "rows:8,32,4,512,2/4", "rows:8,32,4,512,2/12", "64,2,2",
               "core"]
if "--prefetch" in sys.argv:  # gemv_rows.cl with the next chunk of A read ahead into registers (6th field 1)
    ROW_CONFIGS = ["table", "rows:8,16,4,256,3,1", "rows:8,16,4,512,2,1", "rows:8,16,4,128,3,1", "rows:8,16,4,128,4,1",
                   "rows:8,32,4,256,2,1", "rows:8,32,4,512,2,1", "rows:8,16,2,256,4,1", "rows:16,16,4,256,2,1",
                   "rows:8,8,4,128,6,1"]
if "--mma" in sys.argv:  # tf32 mode: gemv_mma.cl as 'mma:WARPS,NBW,KC,per_cu' against the fp32 table
    ROW_CONFIGS = ["table", "mma:8,1,128,2", "mma:8,1,64,2", "mma:8,1,64,3", "mma:8,2,64,2", "mma:4,2,64,4",
                   "mma:4,1,128,4", "mma:8,1,32,4", "mma:8,2,32,3"]
TABLE = dict(GEMV_ROWS_TILES)


FLUSH = None


def cublas_ms(a, w):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(15):
        FLUSH.zero_()
        start.record()
        torch.nn.functional.linear(a, w)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[3:])


def configure(cfg, m):
    """The Options changes that run `cfg` at m rows, or None where cfg's kernel does not take m rows: "core" (the
    GEMM core), "table" (gemv_rows.cl's table), "rows:LK,LN,NC,KC,per_cu,pf[/splits]", "mma:WARPS,NBW,KC,per_cu",
    "gemv" (gemv.cl, at most 8 rows)."""
    base = {"gemv_max_rows": 32, "gemv_rows_splits": 0, "gemv_rows_tiles": TABLE}
    if cfg == "core":
        return dict(base, gemv_max_rows=0)
    if cfg == "gemv":
        return base if m <= GEMV_REG_ROWS else None
    if m <= GEMV_REG_ROWS:
        return None
    if cfg.startswith("mma:"):
        return dict(base, gemv_mma=dict(zip(["WARPS", "NBW", "KC", "per_cu"], (int(v) for v in cfg[4:].split(",")))))
    if cfg == "table":
        return dict(base, gemv_mma=None)
    tiles, _, splits = cfg[5:].partition("/")
    return dict(base, gemv_mma=None, gemv_rows_splits=int(splits or 0),
                gemv_rows_tiles={32: dict(zip(["LK", "LN", "NC", "KC", "per_cu", "pf"], (int(v) for v in tiles.split(","))))})


def dlnet_ms(ctxs, cfg, a, w, ref):
    changes = configure(cfg, a.shape[0])
    if changes is None:
        return None
    ctx = ctxs[cfg.startswith("mma:")].with_options(**changes)
    net = dlnet.Net(ctx).load_onnx(model(a.shape[0], w.shape[0], w.shape[1], w))
    y = net.run({"a": a})["y"]
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    if err > (2e-3 if cfg.startswith("mma:") else 1e-5):
        print(f"  {cfg}: rel err {err:.1e}")
    times = []
    for _ in range(12):
        FLUSH.zero_()  # B comes from memory, not from the L2 cache (50 MiB on an H100), as it does in a net
        torch.cuda.synchronize()
        events = [launch.enqueue(ctx.queue) for launch in net.launches]
        ctx.queue.finish()
        times.append(sum(e.profile.end - e.profile.start for e in events) * 1e-6)
    net.release()
    return statistics.median(times[2:])


def main():
    global FLUSH
    FLUSH = torch.empty(64 << 20, device="cuda")  # 256 MiB written between repetitions
    ctx = dlnet.Context("gpu", profile=True)
    ctxs = (ctx, dlnet.Context(ctx.info, precision="tf32", profile=True))
    torch.backends.cuda.matmul.allow_tf32 = False
    shapes, configs = (ROW_SHAPES, ROW_CONFIGS) if "--rows" in sys.argv else (SHAPES, CONFIGS)
    names = [c if len(c) <= 9 else f"cfg {i}" for i, c in enumerate(configs)]
    print("   ".join(f"{n}: {c}" for n, c in zip(names, configs) if n != c))
    print(f"{'M':>3} {'N':>5} {'K':>6} {'cuBLAS ms':>9} " + " ".join(f"{c:>9}" for c in names) +
          "   (GB/s of B for the best)")
    for m, n, k in shapes:
        rng = np.random.default_rng(0)
        w = rng.standard_normal((n, k)).astype(np.float32)
        a = rng.standard_normal((m, k)).astype(np.float32)
        wt, at = torch.from_numpy(w).cuda(), torch.from_numpy(a).cuda()
        ref = (at.double() @ wt.double().T).cpu().numpy()
        row = [dlnet_ms(ctxs, cfg, a, w, ref) for cfg in configs]
        best = min(t for t in row if t is not None)
        print(f"{m:3d} {n:5d} {k:6d} {cublas_ms(at, wt):9.4f} " +
              " ".join(f"{t:9.4f}" if t is not None else f"{'-':>9}" for t in row) +
              f"   {4 * n * k / best / 1e6:.0f}")


if __name__ == "__main__":
    main()

