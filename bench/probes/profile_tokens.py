"""Kernel time by kind of node for a token model of bench/gpu.py (gpt2, bert), and what of it runs on tensor cores
and in half. On the GPU machine:

    python3 bench/probes/profile_tokens.py gpt2 16 fp16
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpu  # noqa: E402
import gpu_profile  # noqa: E402

import dlnet  # noqa: E402


def main():
    name, batch, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    model, inputs = gpu.make_model(name)
    proto = gpu.export(model, 1, inputs)
    ctx = dlnet.Context("gpu", precision=precision, profile=True)
    net = dlnet.Net(ctx).load_onnx(proto)
    net.run({"x": inputs(batch)})
    gpu_profile.table(f"{name} b{batch} {precision}", net.launches, ctx.queue, top=8)
    text = str(net.graph)
    print("ldsm_f16 products:", text.count("ldsm_f16"), " tensor-core attention:", text.count("tile=mma"),
          " half values:", text.count(": f16["))


if __name__ == "__main__":
    main()
