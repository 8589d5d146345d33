"""Where a decode step's time goes (GPU machine): kernel time by kind of one static-cache step of bench/gpu_decode.py's
GPT-2-small-shaped decoder, its launch count, the wall time of a step, and a host profile of 32 steps.

    python3 bench/probes/decode_profile.py [--precision fp32] [--top 12]
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dlnet  # noqa: E402
from gpu_decode import GPT2_SMALL, Decoder, export_static  # noqa: E402
from gpu_profile import table  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Decoder(**GPT2_SMALL, tmax=136).eval()
    onnx_bytes = export_static(model)
    prompt = np.random.default_rng(0).integers(0, GPT2_SMALL["vocab"], (1, 8))
    ctx = dlnet.Context("gpu", precision=args.precision, profile=True)
    with dlnet.Net(ctx).load_onnx(onnx_bytes) as net:
        net.release()
        dlnet.generate(net, prompt, 16)
        launches = net._last.launches
        table(f"one decode step, {args.precision}", launches, ctx.queue, top=args.top)
        t = time.perf_counter()
        dlnet.generate(net, prompt, 64)
        print(f"generate of 64 tokens after an 8-token prompt: {(time.perf_counter() - t) / 72 * 1e3:.2f} ms a step")
        prof = cProfile.Profile()
        prof.enable()
        dlnet.generate(net, prompt, 32)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
