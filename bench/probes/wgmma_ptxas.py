"""Probe: what ptxas says of gemm_wgmma.cl's programs (NVIDIA's -cl-nv-verbose build log: registers, spills, and
the C7515-style notes on wgmma serialised), for a transformer layer's product (4096 x 768 -> 3072, bias and GELU,
fp16) and a weight gradient (x^T dy, A and B transposed) at the network's shapes; the sm_90a PTX of each is
written to OUT (default /tmp) to read. On a Hopper GPU; asserts nothing.

    DLNET_CACHE=$(mktemp -d) python3 bench/probes/wgmma_ptxas.py [--out DIR]
"""
import argparse
import os
import sys

import numpy as np
import pyopencl as cl

import dlnet
from dlnet.kernels import compile_worker, runtime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_epilogue import layer  # noqa: E402
from weight_grads import model as wgrad_model  # noqa: E402

SEEN = []


def spy(program, source, options):
    if compile_worker.WGMMA_MARK in source:
        SEEN.append((program, source, list(options)))
    return compile_worker.for_sm90a(program, source, options)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    runtime.for_sm90a = spy
    ctx = dlnet.Context("gpu", precision="fp16").with_options(build_processes=1)
    rng = np.random.default_rng(0)
    model, feeds = layer(4096, 768, 3072, True, rng)
    dlnet.Net(ctx).load_onnx(model).run(feeds)
    x, dy = rng.standard_normal((4096, 768)).astype(np.float32), rng.standard_normal((4096, 2304)).astype(np.float32)
    dlnet.Net(ctx).load_onnx(wgrad_model(x.shape, dy.shape)).run({"x": x, "dy": dy})
    for i, (program, source, options) in enumerate(SEEN):
        ptx = compile_worker.sm90a_ptx(program.get_info(cl.program_info.BINARIES)[0])
        with open(os.path.join(args.out, f"wgmma_{i}.ptx"), "wb") as f:
            f.write(ptx)
        with open(os.path.join(args.out, f"wgmma_{i}.cl"), "w") as f:
            f.write(source)
        built = cl.Program(program.context, program.devices, [ptx]).build(options=options + ["-cl-nv-verbose"])
        log = built.get_build_info(program.devices[0], cl.program_build_info.LOG)
        defs = " ".join(line[8:] for line in source.splitlines()[:40] if line.startswith("#define ") and
                        line.split()[1] in ("TM", "TN", "STAGES", "A_ALONG_M", "B_NK", "SPLITS", "F16"))
        print(f"== program {i}: {defs}\n{log.strip()}", flush=True)


if __name__ == "__main__":
    main()
