"""A transformer layer's weight-gradient products, dW = x^T dy (A = x transposed: stored [K, M], contiguous along m),
as a training step runs them, against cuBLAS (torch.matmul of x.T and dy) in the same precision, one run.

    python3 bench/probes/weight_grads.py [--precision fp32,tf32,fp16] [--set name=value ...] [--huge STAGES=6 ...]

Shapes: GPT-2-small's (4096 tokens) and ViT-B/16's (3152 tokens) linear layers at batch 16: x [tokens, in], dy
[tokens, out], dW [in, out]. fp32: TF32 off on both sides (dlnet's 3xtf32 on NVIDIA); tf32: TF32 on both; fp16:
torch on half tensors, dlnet in precision "fp16" (x and dy copied to half first: only the product's launch is
timed). Kernel time from OpenCL profiling events and CUDA events (fc_grads.py's timers), median of 10, a 256 MiB
buffer written before each; errors against float64. Prints a table; asserts nothing. Runs on the GPU machine.
"""
import argparse
import ast

import fc_grads
import numpy as np
import torch
from onnx import TensorProto, helper

import dlnet
from dlnet.kernels import rules

SHAPES = [(4096, 768, 2304), (4096, 768, 768), (4096, 768, 3072), (4096, 3072, 768), (3152, 768, 3072),
          (3152, 3072, 768)]
def model(x_shape, dy_shape):
    g = helper.make_graph([helper.make_node("Gemm", ["x", "dy"], ["dw"], transA=1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
                           helper.make_tensor_value_info("dy", TensorProto.FLOAT, dy_shape)],
                          [helper.make_tensor_value_info("dw", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def dlnet_ms(ctx, feeds, ref):
    net = dlnet.Net(ctx).load_onnx(model(feeds["x"].shape, feeds["dy"].shape))
    y = net.run(feeds)["dw"]
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    ms = fc_grads.launches_ms(net, ctx.queue, lambda launch: "Gemm" in launch.label)  # (not the half copies)
    tile = str(net.graph).split("= Gemm(")[-1].split("algo=")[-1].split("}")[0]
    net.release()
    return ms, err, tile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", default="fp32,tf32,fp16")
    ap.add_argument("--set", nargs="*", default=[], help="dlnet.Options fields, name=value (Python literals)")
    ap.add_argument("--huge", nargs="*", default=[], help="gemm_wgmma.cl's 128 x 128 tile changed, name=value")
    args = ap.parse_args()
    for table in (rules.GEMM_TILES["wgmma_f16"], rules.GEMM_TILES["wgmma_tf32"]):
        table["huge"] = dict(table["huge"], **{k: int(v) for k, v in (kv.split("=", 1) for kv in args.huge)})
    fc_grads.FLUSH = torch.empty(64 << 20, device="cuda")  # (fc_grads' timers write it before each run)
    opts = {k: ast.literal_eval(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    print("| precision | tokens x in x out | cuBLAS ms | dlnet ms | ratio | dlnet TFLOP/s | err cuBLAS / dlnet | "
          "dlnet kernel |")
    print("|---|---|---|---|---|---|---|---|")
    for precision in args.precision.split(","):
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        ctx = dlnet.Context("gpu", precision=precision, profile=True).with_options(**opts)
        for tokens, inp, out in SHAPES:
            rng = np.random.default_rng(0)
            x, dy = rng.standard_normal((tokens, inp)).astype(np.float32), \
                rng.standard_normal((tokens, out)).astype(np.float32)
            ref = x.astype(np.float64).T @ dy.astype(np.float64)
            tx, td = torch.from_numpy(x).cuda(), torch.from_numpy(dy).cuda()
            if precision == "fp16":
                tx, td = tx.half(), td.half()
            t_err = np.linalg.norm((tx.T @ td).double().cpu().numpy() - ref) / np.linalg.norm(ref)
            t_ms = fc_grads.torch_ms(lambda: tx.T @ td)
            d_ms, d_err, tile = dlnet_ms(ctx, {"x": x, "dy": dy}, ref)
            print(f"| {precision} | {tokens}x{inp}x{out} | {t_ms:.4f} | {d_ms:.4f} | {t_ms / d_ms:.2f} | "
                  f"{2 * tokens * inp * out / d_ms / 1e9:.0f} | {t_err:.1e} / {d_err:.1e} | {tile} |", flush=True)


if __name__ == "__main__":
    main()
