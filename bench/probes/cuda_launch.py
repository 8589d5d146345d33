"""Can a plan's OpenCL kernels run in torch's CUDA context? NVIDIA's OpenCL program binaries are PTX. First one
small kernel: its PTX saved (simple.ptx), its special registers listed (OpenCL's group and global offsets come from
%envreg0-5), loaded with cuModuleLoadData and launched with cuLaunchKernel on torch's stream. Then a whole inference
plan through dlnet.cuda_share.CudaLaunches (what the PyTorch bridge runs): outputs against the OpenCL queue's, and
the host and wall time of its launches both ways.

    python3 bench/probes/cuda_launch.py [--net alexnet] [--batch 16] [--ptx] [--set name=value,...]

GPU machine (torchvision). --ptx: the small kernel only. Asserts nothing.
"""
import argparse
import ctypes
import statistics
import time

import numpy as np
import torch

import dlnet
import dlnet.torch  # noqa: F401
from dlnet import cuda_share
from dlnet.kernels.runtime import cl

SIMPLE = """__kernel void ids(__global int* out, ulong off, int n) {
    const int i = get_global_id(0);
    if (i < n) out[off + i] = i * 1000 + get_local_id(0) * 10 + get_group_id(0) % 10;
}"""


def simple(ctx, share):
    """One small kernel through CUDA: its ids written to a torch tensor; the PTX saved to simple.ptx."""
    prog = cl.Program(ctx.cl, SIMPLE).build()
    ptx = prog.get_info(cl.program_info.BINARIES)[0]
    with open("simple.ptx", "wb") as f:
        f.write(ptx)
    print("envreg in PTX:", b"envreg" in ptx, "| lines with special registers:",
          [ln.strip() for ln in ptx.decode().splitlines() if "%envreg" in ln or "%ctaid" in ln or "%ntid" in ln][:8])
    cu = share.cu
    mod, f = ctypes.c_void_p(), ctypes.c_void_p()
    assert cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(bytes(ptx) + b"\0")) == 0
    assert cu.cuModuleGetFunction(ctypes.byref(f), mod, b"ids") == 0
    out = torch.full((1000,), -1, dtype=torch.int32, device="cuda")
    args = [ctypes.c_uint64(out.data_ptr()), ctypes.c_uint64(0), ctypes.c_int32(1000)]
    params = (ctypes.c_void_p * 3)(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
    rc = cu.cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                           params, None)
    torch.cuda.synchronize()
    print("launch rc", rc, "values", out[:3].tolist(), out[255:258].tolist(), out[997:].tolist())


def main():
    import torchvision
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="alexnet")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ptx", action="store_true")
    ap.add_argument("--set", default="", help="dlnet.Options, name=value,...")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    ctx = dlnet.Context("gpu")
    if args.set:
        ctx = dlnet.Context("gpu", options=ctx.options.parse(args.set, "--set"))
    share = cuda_share.share_with_torch(ctx)
    simple(ctx, share)
    if args.ptx:
        return
    model = getattr(torchvision.models, args.net)(weights=None).eval()
    x = torch.randn(args.batch, 3, 224, 224)
    net = dlnet.torch.from_module(model, (x,), ctx=ctx, dynamic_batch=False)
    ref = list(net.run({net.inputs[0].name: x.numpy()}).values())[0]
    plan = net._last
    t0 = time.perf_counter()
    cp = cuda_share.CudaLaunches(share, plan)
    print(f"{len(plan.launches)} launches; {len(share.modules)} modules loaded in {time.perf_counter() - t0:.2f} s")
    buf, off = plan.input_locs[0]
    v = plan.graph.inputs[0]
    share.view(buf, off * 4, v.shape, v.dtype).copy_(x.cuda())
    stream = torch.cuda.current_stream().cuda_stream
    torch.cuda.synchronize()
    cp.run(0, len(cp.calls), stream)
    torch.cuda.synchronize()
    obuf, ooff = plan.output_locs[0]
    out = plan.graph.outputs[0]
    y = share.view(obuf, ooff * 4, out.shape, out.dtype).cpu().numpy()
    print("rel diff CUDA vs OpenCL:", np.linalg.norm(y - ref) / np.linalg.norm(ref))
    ocl, cuda, host_ocl, host_cuda = [], [], [], []
    for _ in range(20):
        torch.cuda.synchronize()
        t = time.perf_counter()
        plan.run_launches(0, len(plan.launches))
        host_ocl.append(time.perf_counter() - t)
        ctx.queue.finish()
        ocl.append(time.perf_counter() - t)
        t = time.perf_counter()
        cp.run(0, len(cp.calls), stream)
        host_cuda.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        cuda.append(time.perf_counter() - t)
    med = lambda v: statistics.median(v[3:]) * 1e3  # noqa: E731
    print(f"| {args.net} b{args.batch} | launches | host enqueue ms | wall ms |")
    print(f"| OpenCL queue | {len(plan.launches)} | {med(host_ocl):.3f} | {med(ocl):.3f} |")
    print(f"| cuLaunchKernel | {len(cp.calls)} | {med(host_cuda):.3f} | {med(cuda):.3f} |")


if __name__ == "__main__":
    main()
