"""Probe: one-layer CPU models (resnet50's 7x7-stage convolutions, shufflenet's depthwise layers, squeezenet's and
shufflenet's first layers, squeezenet's and resnet50's MaxPools 3x3 stride 2)
under two settings of an Options field, both plans in one process; each round runs every plan's launches back to
back (OpenCL profiling events), interleaved over --rounds rounds; prints the median and best kernel ms per layer and
setting, and the outputs' relative difference. Asserts nothing.

    python bench/probes/cpu_layer_ab.py --flag conv_cpu_pixels_max --values 0,64 [--only conv] [--rounds 15]
    python bench/probes/cpu_layer_ab.py --flag pool_cpu_separable --values False,True --only pool
    python bench/probes/cpu_layer_ab.py --flag define:PAD_SCALAR --values 0,1 --only s2  (a .cl file's variant)
    python bench/probes/cpu_layer_ab.py --flag file:pool_cpu=/tmp/old_pool_cpu.cl --values 1,0 --only pool
"""
import argparse
import ast
import contextlib
import os
import statistics
import sys

import numpy as np
from onnx import helper

import dlnet
from dlnet.kernels import runtime
from dlnet.kernels.options import _split_items

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tests.conftest import make_model, rel_l2  # noqa: E402

# (name, batch, Cin, H, W, Cout, kernel, stride, pad): each with bias, a residual and Relu
CONVS = [("r50 3x3 512 7x7", 1, 512, 7, 7, 512, 3, 1, 1), ("r50 1x1 s2 1024->2048", 1, 1024, 14, 14, 2048, 1, 2, 0),
         ("r50 1x1 2048->512 7x7", 1, 2048, 7, 7, 512, 1, 1, 0), ("r50 1x1 512->2048 7x7", 1, 512, 7, 7, 2048, 1, 1, 0),
         ("dn121 3x3 128->32 7x7", 1, 128, 7, 7, 32, 3, 1, 1), ("inc 1x1 832->384 7x7", 1, 832, 7, 7, 384, 1, 1, 0),
         ("inc 1x1 832->48 7x7", 1, 832, 7, 7, 48, 1, 1, 0), ("inc 3x3 192->384 7x7", 1, 192, 7, 7, 384, 3, 1, 1),
         ("inc 5x5 48->128 7x7", 1, 48, 7, 7, 128, 5, 1, 2), ("s2 r50 3x3 128 56->28", 1, 128, 56, 56, 128, 3, 2, 1),
         ("s2 r50 3x3 256 28->14", 1, 256, 28, 28, 256, 3, 2, 1), ("s2 r50 stem", 1, 3, 224, 224, 64, 7, 2, 3),
         ("s2 sq11 stem", 1, 3, 224, 224, 64, 3, 2, 0),
         ("sq 1x1 64->16 55x55", 1, 64, 55, 55, 16, 1, 1, 0), ("sq 1x1 16->64 55x55", 1, 16, 55, 55, 64, 1, 1, 0),
         ("sq 1x1 384->48 13x13", 1, 384, 13, 13, 48, 1, 1, 0),
         ("sq 1x1 512->1000 13x13", 1, 512, 13, 13, 1000, 1, 1, 0), ("sq 3x3 64->256 13x13", 1, 64, 13, 13, 256, 3, 1, 1),
         ("sq 3x3 48->192 13x13", 1, 48, 13, 13, 192, 3, 1, 1), ("sq 3x3 32->128 27x27", 1, 32, 27, 27, 128, 3, 1, 1),
         ("sq 3x3 16->64 55x55", 1, 16, 55, 55, 64, 3, 1, 1),
         ("14 r50 1x1 256->1024 14x14", 1, 256, 14, 14, 1024, 1, 1, 0),
         ("14 r50 1x1 s2 512->1024 28->14", 1, 512, 28, 28, 1024, 1, 2, 0)]
# (name, input shape, pads, ceil_mode): MaxPool 3x3 stride 2
# (name, batch, C, H, W, stride, shuffled): shufflenet's depthwise 3x3 layers (pad 1, bias, no activation); shuffled:
# a channel shuffle before it (folded into the layer's padding as a channel map)
DWS = [("dw 136 28x28 shuffled", 1, 136, 28, 28, 1, True), ("dw 136 28x28", 1, 136, 28, 28, 1, False),
       ("dw 272 14x14", 1, 272, 14, 14, 1, False), ("dw 544 7x7", 1, 544, 7, 7, 1, False),
       ("dw s2 112 56->28", 1, 112, 56, 56, 2, False), ("dw s2 136 28->14", 1, 136, 28, 28, 2, False),
       ("dw s2 272 14->7", 1, 272, 14, 14, 2, False)]
# (name, batch, Cin, H, W, Cout, kernel, stride, pad): first layers, bias and Relu (no residual)
STEMS = [("stem sq11 3->64 224", 1, 3, 224, 224, 64, 3, 2, 0), ("stem shuffle 3->24 224", 1, 3, 224, 224, 24, 3, 2, 1)]
POOLS = [("squeezenet1.1 pool1", (1, 64, 111, 111), 0, 0), ("squeezenet pool1", (1, 96, 109, 109), 0, 1),
         ("squeezenet pool2", (1, 256, 54, 54), 0, 1),
         ("squeezenet pool3", (1, 512, 27, 27), 0, 1), ("resnet50 pool", (1, 64, 112, 112), 1, 0),
         ("shufflenet pool", (1, 24, 112, 112), 1, 0)]


def conv_model(rng, n, cin, h, w, cout, k, s, p, residual=True):
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    wt = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    r = rng.standard_normal((n, cout, oh, ow)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)]
    if not residual:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
        return make_model(nodes, {"x": x}, ["y"], {"w": wt, "b": b}), {"x": x}
    nodes += [helper.make_node("Add", ["c", "r"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    return make_model(nodes, {"x": x, "r": r}, ["y"], {"w": wt, "b": b}), {"x": x, "r": r}


def dw_model(rng, n, c, h, w, s, shuffled):
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    inits = {"w": (rng.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32),
             "b": rng.standard_normal(c).astype(np.float32)}
    nodes, v = [], "x"
    if shuffled:  # Reshape -> Transpose -> Reshape over 4 groups, after a Relu (its own launch, the same in A and B)
        inits.update(s5=np.array([n, 4, c // 4, h, w], np.int64), s4=np.array([n, c, h, w], np.int64))
        nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Reshape", ["a", "s5"], ["a5"]),
                 helper.make_node("Transpose", ["a5"], ["at"], perm=[0, 2, 1, 3, 4]),
                 helper.make_node("Reshape", ["at", "s4"], ["as"])]
        v = "as"
    nodes.append(helper.make_node("Conv", [v, "w", "b"], ["y"], kernel_shape=[3, 3], strides=[s, s], pads=[1] * 4,
                                  group=c))
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


def pool_model(rng, shape, p, ceil):
    x = rng.standard_normal(shape).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[p] * 4, ceil_mode=ceil)
    return make_model([node], {"x": x}, ["y"], opset=19), {"x": x}


def kernel_ms(ctx, net):
    """The summed kernel time of one run of net's launches."""
    events = [launch.enqueue(ctx.queue) for launch in net.launches]
    ctx.queue.finish()
    return sum((ev.profile.end - ev.profile.start) * 1e-6 for ev in events)


@contextlib.contextmanager
def swapped_source(flag, value):
    """Kernels built inside see a .cl file changed, for A/B runs of a file's variants (a falsy value: as it is):
    define:NAME puts `#define NAME value` ahead of every source; file:NAME=PATH reads cl/NAME.cl from PATH (an old
    copy). The families' own imports of runtime.kernel_source are swapped."""
    original = runtime.kernel_source
    kind, _, what = flag.partition(":")
    if kind == "define":
        patched = lambda name: f"#define {what} {int(value)}\n" + original(name)  # noqa: E731
    else:
        name0, _, path = what.partition("=")
        text = open(path).read()
        patched = lambda name: text if name == name0 else original(name)  # noqa: E731
    mods = [m for m in list(sys.modules.values()) if getattr(m, "kernel_source", None) is original] if value else []
    for m in mods:
        m.kernel_source = patched
    try:
        yield
    finally:
        for m in mods:
            m.kernel_source = original


def build(ctx, flag, value, model):
    if flag.startswith(("define:", "file:")):
        with swapped_source(flag, value):
            return dlnet.Net(ctx).load_onnx(model)
    return dlnet.Net(ctx.with_options(**{flag: value})).load_onnx(model)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flag", default="conv_cpu_pixels_max",
                    help="a field of dlnet.Options, define:NAME or file:NAME=PATH (swapped_source)")
    ap.add_argument("--values", default="0,64", help="its two settings, A then B (Python literals)")
    ap.add_argument("--only", default="conv,pool", help="conv, dw, stem, pool, or names' prefixes (r50, inc, ...)")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    a, b = (ast.literal_eval(v) for v in _split_items(args.values))  # (commas inside brackets stay)
    rng = np.random.default_rng(0)
    ctx = dlnet.Context("cpu", profile=True)
    only = args.only.split(",")
    cases = [(c[0], conv_model(rng, *c[1:])) for c in CONVS if "conv" in only or c[0].split()[0] in only] + \
        [(c[0], dw_model(rng, *c[1:])) for c in DWS if "dw" in only or c[0] in only] + \
        [(c[0], conv_model(rng, *c[1:], residual=False)) for c in STEMS if "stem" in only or c[0] in only] + \
        [(c[0], pool_model(rng, *c[1:])) for c in POOLS if "pool" in only]
    for name, (model, feeds) in cases:
        nets = {v: build(ctx, args.flag, v, model) for v in (a, b)}
        outs = {v: next(iter(net.run(feeds).values())) for v, net in nets.items()}
        algos = {v: [n.schedule.get("algo") for n in net.graph.nodes if n.op == "Conv"] for v, net in nets.items()}
        times = {a: [], b: []}
        for _ in range(args.rounds):
            for v, net in nets.items():
                kernel_ms(ctx, net)
                times[v].append(min(kernel_ms(ctx, net) for _ in range(3)))
        cells = " | ".join(f"{args.flag}={v} {algos[v] or ''}: median {statistics.median(t):.3f} best {min(t):.3f}"
                           for v, t in times.items())
        print(f"{name:24s} rel diff {rel_l2(outs[b], outs[a]):.1e} | {cells}", flush=True)
        for net in nets.values():
            net.release()


if __name__ == "__main__":
    main()
