"""Probe: every distinct convolution of a torchvision net, alone (and with a residual Add + Relu after it), in
dlnet's tf32 mode against float64 on the GPU: relative L2 error and kernel tile per layer.

    python3 bench/probes/tf32_convs.py --net resnet50 --batch 16 [--variant bench/probes/variants/gemm_mma_v0.cl]
"""
import argparse

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import dlnet
from dlnet.kernels import lowering, runtime


def conv_model(cin, cout, k, s, p, h, w, batch, res):
    rng = np.random.default_rng(0)
    wt = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, cin, h, w])]
    if res:  # the residual made inside the graph (Relu of an input), so that the Add may write over it
        nodes += [helper.make_node("Relu", ["r"], ["rr"]), helper.make_node("Add", ["c", "rr"], ["a"]),
                  helper.make_node("Relu", ["a"], ["y"])]
        ins.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [batch, cout, oh, ow]))
    else:
        nodes[0].output[0] = "y"
    g = helper.make_graph(nodes, "c", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, cout, oh, ow])],
                          [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), wt, bias, (oh, ow)


def main():
    import torch
    import torchvision
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="resnet50")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--variant", default="")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each model (the worst error is shown)")
    args = ap.parse_args()
    if args.variant:
        text = open(args.variant).read()
        lowering.kernel_source = lambda name: text if name == "gemm_mma" else runtime.kernel_source(name)
    model = getattr(torchvision.models, args.net)(weights=None).eval()
    seen = []

    def hook(mod, inp, out):
        c = (mod.in_channels, mod.out_channels, mod.kernel_size[0], mod.stride[0], mod.padding[0],
             inp[0].shape[2], inp[0].shape[3])
        if mod.groups == 1 and c not in seen:
            seen.append(c)
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros(1, 3, 224, 224))
    ctx = dlnet.Context("gpu", precision="tf32")
    rng = np.random.default_rng(1)
    print(f"{'cin':>5} {'cout':>5} {'k':>2} {'s':>2} {'hw':>4} {'err':>9} {'err+res':>9}")
    for cin, cout, k, s, p, h, w in seen:
        errs = []
        for res in (False, True):
            proto, wt, bias, (oh, ow) = conv_model(cin, cout, k, s, p, h, w, args.batch, res)
            x = rng.standard_normal((args.batch, cin, h, w)).astype(np.float32)
            feeds = {"x": x}
            ref = torch.nn.functional.conv2d(torch.from_numpy(x).double().cuda(), torch.from_numpy(wt).double().cuda(),
                                             torch.from_numpy(bias).double().cuda(), s, p)
            if res:
                r = rng.standard_normal((args.batch, cout, oh, ow)).astype(np.float32)
                feeds["r"] = r
                ref = torch.relu(ref + torch.relu(torch.from_numpy(r).double().cuda()))
            ref = ref.cpu().numpy()
            net = dlnet.Net(ctx).load_onnx(proto)
            errs.append(max(np.linalg.norm(y - ref) / np.linalg.norm(ref)
                            for y in (net.run(feeds)["y"] for _ in range(args.repeat))))
            labels = [la.label for la in net.launches]
            net.release()
        print(f"{cin:5d} {cout:5d} {k:2d} {s:2d} {h:4d} {errs[0]:9.1e} {errs[1]:9.1e}  {labels}", flush=True)


if __name__ == "__main__":
    main()
