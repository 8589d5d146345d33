"""Data-parallel training throughput: dlnet over MPI against PyTorch DDP (NCCL), on 1 and 2 ranks, one table.

    mpirun -np 2 python bench/gpu_ddp.py                   # the 2-GPU machine: resnet50 and vgg16, 64 images per GPU
    mpirun -np 2 python bench/gpu_ddp.py --sync-bn         # the same with synchronised BatchNorm on both sides
    mpirun -np 2 --oversubscribe python bench/gpu_ddp.py --tiny    # any machine: a small CNN on the CPU, gloo

(as root: add --allow-run-as-root, or export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.)

Protocol: each model is a torchvision definition with its random initialisation (seed 0; --tiny: a small
conv-BatchNorm-ReLU net defined here), exported to ONNX op-set 13 as bench/gpu_train.py does (BatchNormalization
stays a node and trains on each rank's batch statistics; with --sync-bn on the global batch's: dlnet's sync_bn, torch's
SyncBatchNorm on GPUs; Dropout at p=0 on both sides). Every rank trains on its own
random batch of --batch images (the global batch is ranks x --batch), cross-entropy, Adam. Rank r uses GPU r
(dlnet: the r-th OpenCL GPU; torch: cuda:r). "1 rank" is rank 0 alone (dlnet without a communicator, torch without
DDP) while rank 1 waits; "2 ranks" is both, dlnet with `Trainer(comm=dlnet.distributed.MPI())` (25 MiB buckets),
torch with DistributedDataParallel (NCCL on GPUs, gloo on the CPU; its default 25 MiB buckets). Before the models,
rank 0 times one bucket's device-host copies into pageable (numpy) and pinned (Context.pinned, what the trainer
uses) host memory, and the ranks time a bucket's host average on pinned buffers. A step includes the
batch's copy to the device and the loss back on the host; warm-up steps, then the median of --iters steps on rank 0.
Throughput = ranks x batch / median step; scaling efficiency = throughput on 2 / (2 x throughput on 1). dlnet's
row also gives its last step's forward+backward time and its buckets' reduction times (start to done, overlapped
with the backward pass). fp32, TF32 off. Prints tables; asserts nothing.
"""
import argparse
import os
import socket
import statistics
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_train import export, torch_model  # noqa: E402 (bench/ is not a package)

NETS = ["resnet50", "vgg16"]


def tiny_model():
    import torch
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10))


def median_s(step, iters, warmup, comm=None):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    if comm is not None:
        comm.barrier()
    return statistics.median(times)


def batch_for(rank, shape, classes):
    rng = np.random.default_rng(100 + rank)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, classes, shape[0]).astype(np.int64)


def bench_dlnet(proto, x, y, args, comm, transport="auto"):
    """Median step seconds and the last step's timing of one rank (comm None: one process), the gradients between
    ranks through `transport` (Options.gradient_transport)."""
    import dlnet
    from dlnet.distributed import local_rank
    device = "cpu" if args.tiny else f"ocl:{local_rank()}" if args.device == "gpu" else args.device
    options = dlnet.Options.from_env().replace(gradient_transport=transport)
    with dlnet.Net(dlnet.Context(device, options=options)).load_onnx(proto) as net:
        trainer = dlnet.Trainer(net, loss="cross_entropy", optimizer=dlnet.optim.Adam(lr=args.lr), comm=comm,
                                sync_bn=args.sync_bn)
        feeds = {"input": x, "target": y}
        trainer.step(feeds)  # builds and plans the training graph
        seconds = median_s(lambda: trainer.step(feeds), args.iters, args.warmup, comm)
        timing = dict(getattr(trainer._active, "timing", {}) or {})
        trainer.close()
    return seconds, timing


def bench_torch(model, x, y, args, rank, world):
    """Median step seconds of torch on one rank (world 1: no DDP)."""
    import torch
    device = torch.device("cpu" if args.tiny else f"cuda:{rank}")
    model = model.to(device).train()
    if world > 1 and args.sync_bn and not args.tiny:  # (torch's SyncBatchNorm runs on GPUs only)
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=None if args.tiny else [rank])
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(xs.to(device)), ys.to(device))
        loss.backward()
        opt.step()
        loss.item()  # synchronises: the step is done when it returns

    step()
    return median_s(step, args.iters, args.warmup, args.mpi if world > 1 else None)


def init_torch(args, comm):
    """torch.distributed over the MPI job's ranks: rank 0's free port, handed to every rank."""
    import torch
    import torch.distributed as dist
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(comm.bcast(port))
    if not args.tiny:
        torch.cuda.set_device(comm.rank)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    dist.init_process_group("gloo" if args.tiny else "nccl", rank=comm.rank, world_size=comm.size)


def run_model(name, args, comm):
    """{dlnet 1, dlnet 2 <transport> for each, torch 1, torch 2: median step seconds; timing <transport>: dlnet's
    2-rank step}."""
    import onnx
    size = (3, 32, 32) if args.tiny else (3, 224, 224)
    classes = 10 if args.tiny else 1000
    x, y = batch_for(comm.rank, (args.batch, *size), classes)
    model = tiny_model() if args.tiny else torch_model(name)
    proto = comm.bcast(export(model, x[:1]).SerializeToString() if comm.rank == 0 else None)
    proto = onnx.load_from_string(proto)
    out = {}
    if comm.rank == 0:
        out["dlnet 1"], _ = bench_dlnet(proto, x, y, args, None)
    comm.barrier()
    for transport in args.transports:
        out[f"dlnet 2 {transport}"], out[f"timing {transport}"] = bench_dlnet(proto, x, y, args, args.dlnet_comm,
                                                                            transport)
        comm.barrier()
    if comm.rank == 0:
        out["torch 1"] = bench_torch(tiny_model() if args.tiny else torch_model(name), x, y, args, 0, 1)
    comm.barrier()
    out["torch 2"] = bench_torch(model, x, y, args, comm.rank, comm.size)
    return out


def allreduce_ms(comm, mib, ctx, transport="mpi", fp16=False, iters=10):
    """(median, fastest) ms of one bucket's way as the trainer makes it, the ranks aligned by a barrier first: from
    the device to the host (read), the average over the ranks (start, write) and back into the device's buffer."""
    from dlnet.allreduce import make_reducer
    n = int(mib * 2 ** 20) // 4
    reducer = make_reducer(comm, [n], ctx, fp16=fp16, transport=transport)
    buf = ctx.alloc(4 * n)
    ctx.upload(buf, np.random.default_rng(comm.rank).standard_normal(n, dtype=np.float32))
    times = []
    for _ in range(iters + 1):
        comm.barrier()
        t = time.perf_counter()
        reducer.read(ctx.copy_queue, 0, 0, buf, 0, n).wait()
        reducer.start(0)
        reducer.write(0, [(buf, 0, 0, n)], ctx.queue).wait()
        times.append(time.perf_counter() - t)
    reducer.close()
    ctx.free(buf)
    return statistics.median(times[1:]) * 1e3, min(times[1:]) * 1e3


def copy_ms(ctx, mib, pinned, iters=10):
    """Median ms of one bucket's round trip as the trainer makes it: device -> host on the copy queue, then host ->
    device, into and out of the Context's pinned memory (what Trainer uses) or an ordinary numpy array."""
    from dlnet.kernels.runtime import cl
    n = int(mib * 2 ** 20) // 4
    buf = ctx.alloc(4 * n)
    host = ctx.pinned((n,), np.float32) if pinned else np.zeros(n, np.float32)
    down, up = [], []
    for _ in range(iters + 1):
        t = time.perf_counter()
        cl.enqueue_copy(ctx.copy_queue, host, buf, is_blocking=True)
        down.append(time.perf_counter() - t)
        t = time.perf_counter()
        cl.enqueue_copy(ctx.queue, buf, host, is_blocking=True)
        up.append(time.perf_counter() - t)
    ctx.free(buf)
    return statistics.median(down[1:]) * 1e3, statistics.median(up[1:]) * 1e3


def print_copies(args, comm, sizes):
    """Rank 0's device-host copies of one bucket, pageable against pinned host memory (the others wait)."""
    import dlnet
    from dlnet.distributed import local_rank
    device = "cpu" if args.tiny else f"ocl:{local_rank()}" if args.device == "gpu" else args.device
    ctx = dlnet.Context(device)
    if comm.rank == 0:
        print("one bucket's device -> host (copy queue) and host -> device copies, median ms (GB/s):")
        for mib in sizes:
            row = []
            for pinned in (False, True):
                d, u = copy_ms(ctx, mib, pinned)
                gb = mib * 2 ** 20 / 1e6
                row.append(f"{'pinned' if pinned else 'numpy '} {d:7.2f} ({gb / d:5.2f}) / {u:7.2f} ({gb / u:5.2f})")
            print(f"  {mib:>6} MiB: " + "   ".join(row), flush=True)
    comm.barrier()
    return ctx


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=",".join(NETS), help="comma-separated torchvision model names")
    ap.add_argument("--tiny", action="store_true", help="a small CNN at 32x32 on the CPU (dlnet's PoCL, torch gloo)")
    ap.add_argument("--batch", type=int, default=None, help="images per rank (default 64; --tiny 16)")
    ap.add_argument("--iters", type=int, default=None, help="timed steps (default 10; --tiny 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps after the first")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--sync-bn", action="store_true", help="synchronised BatchNorm on 2 ranks (dlnet sync_bn; "
                    "torch SyncBatchNorm on GPUs)")
    ap.add_argument("--device", default="gpu", help="dlnet device: gpu (rank r: the r-th GPU), cpu or ocl:N")
    ap.add_argument("--transports", default="auto", help="dlnet's 2-rank runs, one per gradient transport "
                    "(Options.gradient_transport): comma-separated of auto, shm, shm-device, mpi")
    args = ap.parse_args(argv)
    args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    args.batch = args.batch or (16 if args.tiny else 64)
    args.iters = args.iters or (5 if args.tiny else 10)

    import dlnet
    args.mpi = comm = dlnet.distributed.MPI()
    if comm.size != 2:
        sys.exit(f"bench/gpu_ddp.py: run it on 2 ranks (mpirun -np 2 ...), not {comm.size}")
    args.dlnet_comm = comm
    init_torch(args, comm)
    nets = ["tiny"] if args.tiny else [n.strip() for n in args.nets.split(",") if n.strip()]
    if comm.rank == 0:
        print(f"{comm.size} ranks; {args.batch} images per rank; Adam lr {args.lr}; median of {args.iters} steps; "
              f"{'CPU (PoCL; torch gloo)' if args.tiny else 'GPUs (dlnet OpenCL; torch NCCL)'}", flush=True)
    sizes = (0.25, 1, 4, 25) if args.tiny else (1, 4, 25, 100)
    ctx = print_copies(args, comm, sizes)
    ways = ["mpi", "mpi fp16", "shm", "shm-device"]
    cost = [(mib, [allreduce_ms(comm, mib, ctx, w.split()[0], fp16=w.endswith("fp16")) for w in ways])
            for mib in sizes]
    if comm.rank == 0:
        print("one bucket from the device, averaged over the ranks, back on the device: median (fastest) ms and "
              "GB/s of the bucket's bytes by the fastest")
        for mib, times in cost:
            print(f"  {mib:>6} MiB: " + "   ".join(f"{w} {a:7.2f} ({b:.2f}, {mib * 2 ** 20 / b / 1e6:.1f} GB/s)"
                                                    for w, (a, b) in zip(ways, times)), flush=True)
    rows = []
    for name in nets:
        try:
            rows.append((name, run_model(name, args, comm), ""))
        except Exception as e:  # noqa: BLE001 (one net failing still prints the others)
            traceback.print_exc()
            rows.append((name, {}, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"))
    if comm.rank == 0:
        print_table(rows, args.batch, args.transports)
    import torch.distributed as dist
    dist.destroy_process_group()


def print_table(rows, batch, transports):
    """One row per (net, engine): images/s on 1 and 2 ranks, scaling efficiency, dlnet / torch DDP at 2 ranks, and
    dlnet's last 2-rank step (forward+backward ms, buckets, each bucket's reduction ms)."""
    nan = float("nan")
    print()
    print(f"images/s, {batch} images per rank (eff = 2 ranks / (2 x 1 rank); vs DDP = 2-rank images/s / torch DDP's)")
    print(f"{'net':<10} {'engine':<16} {'1 rank':>8} {'2 ranks':>8} {'eff':>7} {'vs DDP':>7}  "
          "2-rank step: fwd+bwd ms, buckets (MiB), reduce ms each  note")
    for name, r, note in rows:
        ips = {k: batch * (2 if k.startswith("dlnet 2") or k == "torch 2" else 1) / r[k] if k in r else nan
               for k in ["dlnet 1", "torch 1", "torch 2"] + [f"dlnet 2 {t}" for t in transports]}
        for engine, one, two, t in [(f"dlnet {tr}", "dlnet 1", f"dlnet 2 {tr}", r.get(f"timing {tr}", {}))
                                    for tr in transports] + [("torch DDP", "torch 1", "torch 2", {})]:
            buckets = ", ".join(f"{s * 1e3:.1f}" for s in t.get("bucket_s", []))
            mib = sum(t.get("bucket_bytes", [])) / 2 ** 20
            sync = (f"; sync_bn {t['sync_bn_s'] * 1e3:.1f} ms at {t['sync_bn_points']} points" if "sync_bn_s" in t
                    else "")
            step = (f"{t['forward_backward_s'] * 1e3:.1f}, {len(t['bucket_s'])} ({mib:.1f}), {buckets}{sync} "
                    f"[{t.get('transport')}]" if t else "")
            print(f"{name:<10} {engine:<16} {ips[one]:>8.1f} {ips[two]:>8.1f} {ips[two] / 2 / ips[one]:>7.1%} "
                  f"{ips[two] / ips['torch 2']:>7.3f}  {step}  {note}")


if __name__ == "__main__":
    main()
