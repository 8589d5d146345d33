"""dlnet (OpenCL) against PyTorch CUDA on the GPU machine, in one process and one run.

    python bench/gpu.py [--nets alexnet,resnet18,...] [--batches 16,1] [--iters 20] [--gemm] [--startup] [--tune]

Protocol (shared/GPU.md): torchvision definitions with their random initialisation, exported to ONNX; the time of one
inference includes copying the input to the device and the output back; warm-up, then the median of --iters runs;
fp32 compared with PyTorch TF32 off. Each net is timed twice: with the input in an ordinary numpy array / CPU tensor,
and with both engines' inputs in pinned host memory (torch pin_memory(), dlnet Net.input_array). Prints tables; asserts nothing.
"""
import argparse
import copy
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import torch
import torchvision

import dlnet

NETS = ["alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2"]
# the transformers of bench/cpu_transformers.py, in plain torch: name -> (vocabulary, tokens). gpt2 is the
# GPT-2-small-shaped decoder over 256 tokens, giving the next token's logits; bert the BERT-base-shaped encoder.
TOKEN_NETS = {"gpt2": (50257, 256), "bert": (30522, 128)}


def rel_l2(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


def make_model(name):
    """(eval-mode torch module, inputs(batch) -> numpy array) of a torchvision name or a TOKEN_NETS transformer."""
    if name in TOKEN_NETS:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import cpu_transformers
        vocab, tokens = TOKEN_NETS[name]
        return cpu_transformers.build(name)[0].eval(), \
            lambda b: np.random.default_rng(b).integers(0, vocab, (b, tokens)).astype(np.int64)
    return getattr(torchvision.models, name)(weights=None).eval(), \
        lambda b: np.random.default_rng(b).standard_normal((b, 3, 224, 224)).astype(np.float32)


def export(model, batch, inputs=None):
    buf = io.BytesIO()
    x = torch.from_numpy(inputs(batch)) if inputs else torch.randn(batch, 3, 224, 224)
    torch.onnx.export(model, (x,), buf, opset_version=17, dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return onnx.load_from_string(buf.getvalue())


def median_ms(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def set_tf32(on):
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cuda.matmul.allow_tf32 = on


def bench_nets(ctx, nets, batches, iters, rows, tune=False):
    """fp32: against PyTorch with TF32 off; tf32: against PyTorch with TF32 on; fp16: against PyTorch's model.half()
    (dlnet: half storage, fp32 arithmetic, kernels/half.py). The error is always against
    PyTorch's fp32 (TF32 off) output. tune: dlnet measures each layer's tile first (Net.load_onnx(tune=True)); the
    plan by rule is timed too (pinned), before, and the tuning's report printed."""
    tf32, fp16 = ctx.precision == "tf32", ctx.precision == "fp16"
    for name in nets:
        torch.manual_seed(0)
        model, inputs = make_model(name)
        proto = export(model, 1, inputs)
        net = dlnet.Net(ctx).load_onnx(proto, tune=tune)
        cuda_model = model.cuda()
        timed_model = copy.deepcopy(cuda_model).half() if fp16 else cuda_model
        for batch in batches:
            x = inputs(batch)
            xt = torch.from_numpy(x)

            xt_pinned = xt.pin_memory()
            if tune:
                from dlnet.kernels import tuner
                by_rule = dlnet.Net(ctx).load_onnx(proto)
                x_rule = by_rule.input_array("x", x.shape)
                x_rule[...] = x
                with tuner.by_rule(ctx):
                    by_rule.run({"x": x_rule})  # (plans it)
                t_rule = median_ms(lambda: by_rule.run({"x": x_rule}), iters)
                by_rule.release()
                start = time.perf_counter()
            x_pinned = net.input_array("x", x.shape)
            x_pinned[...] = x
            if tune:
                net.run({"x": x_pinned})  # (plans this batch, measuring its layers first)
                report = net._last.tuning or {"seconds": 0.0, "before": 0.0, "after": 0.0, "layers": {}}
                changed = sum(v["tile"] != v["was"] for v in report["layers"].values())
                print(f"{name:13s} b{batch:<3d} tuned {len(report['layers'])} layer kinds ({changed} changed) in "
                      f"{time.perf_counter() - start:.1f} s: their kernel ms {report['before']:.3f} by rule -> "
                      f"{report['after']:.3f}; whole run pinned by rule {t_rule:.2f} ms", flush=True)

            def run_torch(src=xt, m=timed_model):
                with torch.no_grad():
                    src = src.cuda(non_blocking=src.is_pinned())
                    half_in = m is not cuda_model and src.is_floating_point()  # (token ids stay integers)
                    y = m(src.half() if half_in else src).float().cpu()
                torch.cuda.synchronize()
                return y

            set_tf32(False)
            y_fp32 = run_torch(m=cuda_model).numpy()
            set_tf32(tf32)
            t_torch = median_ms(run_torch, iters)
            t_dlnet = median_ms(lambda: net.run({"x": x}), iters)
            t_torch_p = median_ms(lambda: run_torch(xt_pinned), iters)
            t_dlnet_p = median_ms(lambda: net.run({"x": x_pinned}), iters)
            err = rel_l2(net.run({"x": x})["y"], y_fp32)
            torch.cuda.reset_peak_memory_stats()
            run_torch()
            torch_mem = torch.cuda.max_memory_allocated()
            mem = net.memory
            rows.append((name, batch, t_torch, t_dlnet, t_torch / t_dlnet, err, mem.total / 2**20, torch_mem / 2**20,
                         len(net.launches), t_torch_p, t_dlnet_p, t_torch_p / t_dlnet_p, t_rule if tune else None))
            print(f"{name:13s} b{batch:<3d} torch {t_torch:8.2f} ms  dlnet {t_dlnet:8.2f} ms  ratio {t_torch / t_dlnet:5.2f}"
                  f"  pinned: torch {t_torch_p:8.2f} dlnet {t_dlnet_p:8.2f} ratio {t_torch_p / t_dlnet_p:5.2f}"
                  f"  err {err:.1e}  mem {mem.total / 2**20:.0f}/{torch_mem / 2**20:.0f} MiB (dlnet: activations "
                  f"{mem.activations / 2**20:.0f}, weights {mem.weights / 2**20:.0f}, workspace "
                  f"{mem.workspace / 2**20:.0f})", flush=True)
        net.release()
        del cuda_model, timed_model
        torch.cuda.empty_cache()


def matmul_model(n):
    """An ONNX model y = a @ b of two n x n float inputs."""
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")], "mm",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def bench_gemm(ctx, sizes):
    """y = a @ b at n x n: kernel time of both (dlnet from OpenCL profiling events on a profiling context of its own,
    cuBLAS from CUDA events), and the wall time of a call with its wait (enqueue, then finish / synchronize)."""
    set_tf32(ctx.precision == "tf32")
    tf32 = "on" if ctx.precision == "tf32" else "off"
    pctx = dlnet.Context("gpu", precision=ctx.precision, profile=True)
    print(f"\nGEMM {ctx.precision} (median of 10; cuBLAS with TF32 {tf32}): kernel time, and a call's wall time")
    print(f"{'n':>6} {'cuBLAS TFLOP/s':>15} {'dlnet TFLOP/s':>14} {'ratio':>6} {'wall: cuBLAS ms':>16} {'dlnet ms':>9} "
          f"{'ratio':>6}")
    for n in sizes:
        net = dlnet.Net(pctx).load_onnx(matmul_model(n))
        a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
        out = net.run({"a": a, "b": a})["y"]
        ta = torch.from_numpy(a).cuda()
        err = rel_l2(out, (ta.double() @ ta.double()).cpu().numpy())
        plan = net._last

        def run_dlnet():
            events = [launch.enqueue(pctx.queue) for launch in plan.launches]
            pctx.queue.finish()
            return sum(e.profile.end - e.profile.start for e in events) * 1e-6
        for _ in range(3):
            run_dlnet()
        k_d = statistics.median(run_dlnet() for _ in range(10))
        w_d = median_ms(run_dlnet, 10)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def run_torch():
            start.record()
            torch.mm(ta, ta)
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)
        for _ in range(3):
            run_torch()
        k_t = statistics.median(run_torch() for _ in range(10))
        w_t = median_ms(lambda: (torch.mm(ta, ta), torch.cuda.synchronize()), 10)
        flops = 2 * n ** 3
        print(f"{n:6d} {flops / k_t / 1e9:15.1f} {flops / k_d / 1e9:14.1f} {k_t / k_d:6.2f} {w_t:16.3f} {w_d:9.3f} "
              f"{w_t / w_d:6.2f}  (err {err:.1e})", flush=True)
        net.release()


STARTUP = """
import time, sys, torch, torchvision, io, onnx
if {prof}:
    import cProfile, pstats
    pr = cProfile.Profile(); pr.enable()
t0 = time.perf_counter()
import dlnet, numpy as np
sys.path.insert(0, {root!r})
t1 = time.perf_counter()
ctx = dlnet.Context('gpu')
t2 = time.perf_counter()
net = dlnet.Net(ctx).load_onnx({path!r}, batch=1)
t3 = time.perf_counter()
net.run({{'x': np.ones((1, 3, 224, 224), np.float32)}})
t4 = time.perf_counter()
print(f'{{t4 - t0:.3f}} (import {{t1 - t0:.2f}}, context {{t2 - t1:.2f}}, load + plan + build {{t3 - t2:.2f}}, '
      f'first run {{t4 - t3:.2f}})')
if {prof}:
    pr.disable()
    pstats.Stats(pr, stream=sys.stderr).sort_stats('tottime').print_stats(25)
    pstats.Stats(pr, stream=sys.stderr).sort_stats('cumtime').print_stats('dlnet|pyopencl', 45)
"""


def bench_startup(profile=False):
    """Time to first inference of resnet50 at batch 1 in fresh processes, as a user's script does it (import dlnet,
    Context, load_onnx(path), run): cold (dlnet's and the driver's caches empty), warm; with profile, a third (warm)
    start under cProfile (dlnet's part only), sorted by own time. dlnet's modules and pyopencl's are byte-compiled
    first, as `pip install` leaves them (where PYTHONDONTWRITEBYTECODE is set, each start, a compile worker's too,
    would compile them again: 0.1-0.5 s)."""
    import pyopencl
    import pytools
    for package in (dlnet, pyopencl, pytools):  # (what a compile worker imports too)
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(package.__file__)],
                       capture_output=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "resnet50.onnx")
        onnx.save(export(model, 1), path)
        env = dict(os.environ, DLNET_CACHE=os.path.join(d, "cache"), CUDA_CACHE_PATH=os.path.join(d, "nvcache"))
        code = STARTUP.format(root=os.getcwd(), path=path, prof=False)
        cold = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        warm = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        print(f"\ntime to first inference, resnet50 batch 1: cold {cold.stdout.strip() or cold.stderr[-300:]} s, "
              f"warm {warm.stdout.strip() or warm.stderr[-300:]} s")
        if profile:
            code = STARTUP.format(root=os.getcwd(), path=path, prof=True)
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            print(out.stdout.strip(), out.stderr[-20000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--batches", default="16,1")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--gemm", default="")
    ap.add_argument("--startup", action="store_true")
    ap.add_argument("--startup-profile", action="store_true", help="also profile a warm start (cProfile)")
    ap.add_argument("--precision", default="fp32", help="fp32, tf32, fp16 or several: fp32,tf32,fp16")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="PyTorch in cuDNN's benchmark mode (it measures "
                    "each convolution's algorithms on first use), not its default")
    ap.add_argument("--tune", action="store_true", help="dlnet measures each layer's tile first (and the plan by "
                    "rule is timed too)")
    ap.add_argument("--tiles", default="", help="GEMM sweep over GPU fp32 tile configs 'TM,TN,TK,WM,WN;...'")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    for precision in args.precision.split(","):
        ctx = dlnet.Context("gpu", precision=precision)
        print(f"\n== {precision} == device: {ctx.info}; torch {torch.__version__} on {torch.cuda.get_device_name()}"
              f"{' (cudnn.benchmark on)' if args.cudnn_benchmark else ''}{'; dlnet tunes each layer' if args.tune else ''}")
        rows = []
        if args.nets:
            bench_nets(ctx, args.nets.split(","), [int(b) for b in args.batches.split(",")], args.iters, rows,
                       args.tune)
            torch_mode = "model.half()" if precision == "fp16" else f"TF32 {'on' if precision == 'tf32' else 'off'}"
            print(f"\n{precision}: PyTorch with {torch_mode}; rel err against PyTorch fp32")
            print("plain: both copy the input from an ordinary (pageable) host array; pinned: both from page-locked "
                  "memory (torch pin_memory(), dlnet Net.input_array)")
            print(f"{'net':13s} {'batch':>5} {'torch ms':>9} {'dlnet ms':>9} {'ratio':>6} {'pinned: torch':>14} "
                  f"{'dlnet':>7} {'ratio':>6} {'rel err':>8} {'mem MiB (dlnet/torch)':>22} {'launches':>8}" +
                  (f" {'pinned by rule: dlnet':>21} {'ratio':>6}" if args.tune else ""))
            for r in rows:
                print(f"{r[0]:13s} {r[1]:5d} {r[2]:9.2f} {r[3]:9.2f} {r[4]:6.2f} {r[9]:14.2f} {r[10]:7.2f} "
                      f"{r[11]:6.2f} {r[5]:8.1e} {r[6]:10.0f}/{r[7]:<11.0f} {r[8]:8d}" +
                      (f" {r[12]:21.2f} {r[9] / r[12]:6.2f}" if r[12] else ""))
        if args.gemm:
            from dlnet.kernels import rules
            for cfg in args.tiles.split(";") if args.tiles else [""]:
                if cfg:
                    tm, tn, tk, wm, wn = (int(v) for v in cfg.split(","))
                    tiles = dict(TM=tm, TN=tn, TK=tk, WM=wm, WN=wn)
                    for shape in ("huge", "mid", "big"):
                        rules.GEMM_TILES["gpu"][shape] = tiles
                    print(f"\ntiles {cfg}")
                bench_gemm(ctx, [int(n) for n in args.gemm.split(",")])
    if args.startup or args.startup_profile:
        bench_startup(args.startup_profile)


if __name__ == "__main__":
    main()
