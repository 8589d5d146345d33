"""Probe: the fp32 GEMM core with its tiles fetched through registers (STAGES 0) or by a cp.async pipeline, at
several TK, in one process: GEMM TFLOP/s against cuBLAS, then the nets at batch 16.

    python3 bench/probes/fp32_stages.py --configs '0,8;3,8;3,16' --gemm 4096,8192 --nets resnet50,vgg16
"""
import argparse

import dlnet
from dlnet.kernels import lowering
import gpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="0,8;2,8;3,8;4,8;3,16;4,16", help="'STAGES,TK;...'")
    ap.add_argument("--gemm", default="4096,8192")
    ap.add_argument("--nets", default="")
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    ctx = dlnet.Context("gpu")
    for cfg in args.configs.split(";"):
        lowering.FP32_STAGES, lowering.FP32_TK = (int(v) for v in cfg.split(","))
        print(f"\n### STAGES {lowering.FP32_STAGES} TK {lowering.FP32_TK}", flush=True)
        try:
            if args.gemm:
                gpu.bench_gemm(ctx, [int(n) for n in args.gemm.split(",")])
            if args.nets:
                rows = []
                gpu.bench_nets(ctx, args.nets.split(","), [args.batch], 10, rows)
                for r in rows:
                    print(f"  {r[0]:13s} b{r[1]} torch {r[2]:.2f} dlnet {r[3]:.2f} ratio {r[4]:.2f} err {r[5]:.1e}")
        except Exception as e:  # a config that fails to build: say so, go on
            print(f"  failed: {str(e)[:600]}")


if __name__ == "__main__":
    main()
