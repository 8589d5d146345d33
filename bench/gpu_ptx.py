"""What NVIDIA's compiler makes of dlnet's kernels: the PTX each program of a plan builds to, assembled again with
ptxas -v (registers, spills, shared memory) and disassembled, with a count of the main instruction kinds in the
SASS (tensor-core HMMA, FFMA, shared loads, cp.async LDGSTS, integer IMAD/IADD3...). Run on the GPU machine:

    python3 bench/gpu_ptx.py [--precision tf32] [--gemm 4096] [--conv 16,256,56,256,3] [--out DIR]
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

import dlnet
from dlnet.kernels.runtime import cl

KINDS = ("HMMA", "FFMA", "LDS", "STS", "LDGSTS", "LDG", "STG", "IMAD", "IADD3", "LEA", "ISETP", "SEL", "BAR",
         "BRA", "LOP3", "SHF")


def conv_model(n, c, hw, k, ks):
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((k, c, ks, ks)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[ks // 2] * 4)], "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def tool(name):
    return shutil.which(name) or next((p for p in (f"/usr/local/cuda/bin/{name}",) if os.path.exists(p)), None)


def report(ctx, out):
    ptxas, cuobjdump = tool("ptxas"), tool("cuobjdump")
    for i, ((source, opts), prg) in enumerate(ctx._programs.items()):
        ptx = prg.get_info(cl.program_info.BINARIES)[0]
        path = os.path.join(out, f"prog{i}.ptx")
        with open(path, "wb") as f:
            f.write(ptx)
        names = re.findall(rb"\.entry\s+(\w+)", ptx)
        print(f"\nprogram {i}: {b', '.join(names).decode()} ({len(source)} chars of source) -> {path}")
        if not ptxas:
            print("  (no ptxas on this machine)")
            continue
        cubin = path[:-4] + ".cubin"
        r = subprocess.run([ptxas, "-arch=sm_90", "-v", path, "-o", cubin], capture_output=True, text=True)
        for line in (r.stdout + r.stderr).splitlines():
            if "registers" in line or "spill" in line or "error" in line.lower():
                print("  " + line.strip())
        if cuobjdump and os.path.exists(cubin):
            sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
            with open(cubin[:-6] + ".sass", "w") as f:
                f.write(sass)
            ops = collections.Counter(m.group(1).split(".")[0] for m in
                                      re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass))
            print("  SASS: " + ", ".join(f"{k} {ops[k]}" for k in KINDS if ops[k]) + f"; all {sum(ops.values())}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--gemm", type=int, default=4096)
    ap.add_argument("--conv", default="16,256,56,256,3", help="batch,channels,size,out channels,kernel")
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    args = ap.parse_args()
    ctx = dlnet.Context("gpu", precision=args.precision)
    from gpu import matmul_model
    if args.gemm:
        dlnet.Net(ctx).load_onnx(matmul_model(args.gemm))
    if args.conv:
        n, c, hw, k, ks = (int(v) for v in args.conv.split(","))
        dlnet.Net(ctx).load_onnx(conv_model(n, c, hw, k, ks))
    report(ctx, args.out)


if __name__ == "__main__":
    main()
