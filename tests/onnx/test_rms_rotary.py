"""RMSNormalization-23 and RotaryEmbedding-23, and a Llama-style decoder that uses both ideas in plain torch.

- Each op against onnx.reference on fresh random inputs (every axis and Scale shape; halves and interleaved pairs,
  full and partial rotation, 4-D and 3-D X, with and without position_ids, caches constant or fed at run time).
- Their gradients (w.r.t. X, Scale, the caches), through the importer's graph and autodiff on the device, against
  float64 central differences of onnx.reference.
- RMSNorm as exporters decompose it before op-set 23 (x * rsqrt(mean(x^2) + eps) * w, and the Div forms) runs as one
  RMSNorm kernel; so does torch's nn.RMSNorm through its default exporter.
- A Llama-style decoder (RMSNorm, rotary embeddings by rotate_half, SwiGLU MLP, grouped-query attention through
  scaled_dot_product_attention) exported by torch 2.13's default exporter (op-set 20; enable_gqa=True, and
  repeat_interleave of K/V) and by TorchScript at op-sets 14 and 17 (repeat_interleave only: TorchScript cannot export
  enable_gqa=True): dlnet matches torch within 1e-4 at two sequence lengths, and one SGD step through dlnet.Trainer
  gives torch's loss and torch's drop in loss.
"""
import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dlnet
from dlnet.graph.autodiff import gradients
from dlnet.graph.ir import Builder
from dlnet.net import Plan
from dlnet.onnx.importer import Importer
from dlnet.pipeline import training_passes

from ..conftest import context, reference, rel_l2

rng = np.random.default_rng(23)


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def model_of(nodes, inputs, outputs, inits=None, opset=23):
    def vi(name, a):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)

    graph = helper.make_graph(nodes, "t", [vi(n, a) for n, a in inputs.items()],
                              [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
                              [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def check(nodes, inputs, inits=None, tol=1e-5, opset=23, ctx=None):
    """dlnet's output y against the reference evaluator's: dtype, shape and values (relative L2)."""
    model = model_of(nodes, inputs, ["y"], inits, opset)
    want = reference(model, inputs)[0]
    net = dlnet.Net(ctx or context()).load_onnx(model)
    got = net.run(inputs)["y"]
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    assert rel_l2(got, want) <= tol, rel_l2(got, want)
    return net


def launches(net):
    return [launch.label.split()[-1] for launch in net.launches]


# ---------------------------------------------------------------- RMSNormalization-23 -------------------------------
@pytest.mark.parametrize("shape,axis,scale", [((3, 5, 16), -1, (16,)), ((2, 3, 4, 5), 1, (3, 4, 5)),
                                              ((2, 3, 4, 5), -2, (5,)), ((4, 6), 0, (4, 6)), ((2, 3, 8), -1, (1, 1, 8)),
                                              ((2, 3, 8), -1, (2, 1, 8)), ((2, 3, 4, 5), 2, (1, 5))])
def test_rms_normalization(shape, axis, scale):
    """Every axis; a Scale of the normalised shape, of fewer dims (broadcast over it), with leading ones, or varying
    along the leading axes too ((2, 1, 8): the reference's numpy broadcasting to X)."""
    x = normal(*shape) * 2 + 0.3
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=axis, epsilon=1e-3)
    check([node], {"x": x}, {"scale": normal(*scale) + 1.0})


@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-3), (np.float64, 1e-6)])
def test_rms_normalization_other_floats(dtype, tol):
    """float16 and float64 normalise in float32 (stash_type 1) and come back in their own dtype."""
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"])
    check([node], {"x": normal(4, 24, dtype=dtype)}, {"scale": normal(24, dtype=dtype)}, tol=tol)


def test_rms_normalization_runs_as_one_kernel():
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], epsilon=1e-6)
    net = check([node], {"x": normal(6, 32)}, {"scale": normal(32)})
    assert launches(net) == ["RMSNorm"]


@pytest.mark.parametrize("D", [5, 300, 2051])
def test_rms_normalization_on_a_gpu(D):
    """GPUs run a work-group per row (a CPU context told it is a GPU runs that kernel here)."""
    ctx = context().with_options(input_chunks=1)
    ctx.is_cpu = False
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], epsilon=1e-4)
    net = check([node], {"x": normal(7, D) * 3 + 2}, {"scale": normal(D)}, ctx=ctx)
    assert [launch.kernel.function_name for launch in net.launches] == ["layernorm_wg"]


@pytest.mark.parametrize("attrs,scale,match", [({"stash_type": 0}, (8,), "stash_type 0"),
                                               ({}, (3, 8), r"scale of shape \[3, 8\] does not broadcast")])
def test_rms_normalization_errors_name_the_node(attrs, scale, match):
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], name="rms", **attrs)
    model = model_of([node], {"x": normal(2, 8)}, ["y"], {"scale": normal(*scale)})
    with pytest.raises(dlnet.ModelError, match=rf"node rms \(RMSNormalization\): .*{match}"):
        dlnet.Net(context()).load_onnx(model)


# ---------------------------------------------------------------- RMSNorm decomposed -------------------------------
def _const(name, value):
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value, np.float32)))


def rms_decomposed(square, form, scale, axes=(-1,), opset=18):
    """x^2 (Pow or Mul), ReduceMean over `axes`, + eps, Sqrt, then x * Reciprocal(..), x * (1 / ..) or x / ..; then
    * w (scale "first": w * n, "second": n * w, None: no scale). Output "n" or "y"."""
    nodes = [_const("two", 2.0), _const("eps", 1e-6), _const("one", 1.0)]
    nodes.append(helper.make_node("Pow", ["x", "two"], ["x2"]) if square == "pow" else
                 helper.make_node("Mul", ["x", "x"], ["x2"]))
    if opset >= 18:
        nodes += [helper.make_node("Constant", [], ["axes"], value=onnx.numpy_helper.from_array(np.asarray(axes))),
                  helper.make_node("ReduceMean", ["x2", "axes"], ["m"])]
    else:
        nodes.append(helper.make_node("ReduceMean", ["x2"], ["m"], axes=list(axes)))
    nodes += [helper.make_node("Add", ["m", "eps"], ["me"]), helper.make_node("Sqrt", ["me"], ["r"])]
    if form == "div_x":
        nodes.append(helper.make_node("Div", ["x", "r"], ["n"]))
    else:
        nodes += [helper.make_node("Reciprocal", ["r"], ["ir"]) if form == "reciprocal" else
                  helper.make_node("Div", ["one", "r"], ["ir"]), helper.make_node("Mul", ["x", "ir"], ["n"])]
    if scale is not None:
        nodes.append(helper.make_node("Mul", ["w", "n"] if scale == "first" else ["n", "w"], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    return nodes


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("form", ["reciprocal", "div_one", "div_x"])
@pytest.mark.parametrize("scale", ["first", "second", None])
def test_decomposed_rmsnorm_is_one_kernel(square, form, scale):
    """Each way exporters write RMSNorm before op-set 23 (torch 2.13's dynamo exporter: Pow, ReduceMean, Add, Sqrt,
    Reciprocal, Mul, Mul; TorchScript: Div(1, Sqrt)) becomes one RMSNorm kernel."""
    nodes = rms_decomposed(square, form, scale)
    net = check(nodes, {"x": normal(3, 5, 16) * 2}, {"w": normal(16)} if scale else None, opset=18)
    assert launches(net) == ["RMSNorm"]


def test_decomposed_rmsnorm_over_trailing_axes_and_read_elsewhere():
    """Over the last two axes (op-set 13's axes attribute): on a view, its [4, 5] scale folded into the kernel's row;
    x also read by a residual Add after it."""
    nodes = rms_decomposed("pow", "reciprocal", "second", axes=(-2, -1), opset=13)
    nodes[-1].output[0] = "n2"
    nodes.append(helper.make_node("Add", ["n2", "x"], ["y"]))
    net = check(nodes, {"x": normal(2, 3, 4, 5)}, {"w": normal(4, 5)}, opset=13)
    assert launches(net)[0] == "RMSNorm" and len(launches(net)) == 2


def test_rms_over_a_leading_axis_stays_decomposed():
    """A mean of squares over a leading axis is no RMSNorm: the primitives run, with the right values."""
    nodes = rms_decomposed("mul", "div_x", "second", axes=(1,))
    net = check(nodes, {"x": normal(2, 3, 4)}, {"w": normal(4)}, opset=18)
    assert "RMSNorm" not in launches(net)


def test_torch_rmsnorm_through_the_default_exporter():
    """nn.RMSNorm through torch 2.13's default exporter (op-set 20: no RMSNormalization node): one RMSNorm kernel,
    matching torch. (TorchScript cannot export nn.RMSNorm at op-set 14 or 17: aten::rms_norm is unsupported.)"""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    module = torch.nn.RMSNorm(24, eps=1e-6).eval()
    module.weight.data.uniform_(0.5, 1.5)
    x = normal(3, 7, 24)
    model = torch.onnx.export(module, (torch.from_numpy(x),), dynamo=True, verbose=False).model_proto
    assert "RMSNormalization" not in {n.op_type for n in model.graph.node}
    net = dlnet.Net(context()).load_onnx(model)
    got = list(net.run({model.graph.input[0].name: x}).values())[0]
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    assert rel_l2(got, want) <= 1e-5
    assert launches(net) == ["RMSNorm"]


# ---------------------------------------------------------------- RotaryEmbedding-23 --------------------------------
B, S, HEADS, HEAD, POSITIONS = 2, 5, 3, 8, 11


def rotary_case(rank, interleaved, rot, with_pos, dtype=np.float32):
    """(node, inputs, caches): X 4-D [B, heads, S, head] or 3-D [B, S, heads * head]; caches [positions, rot / 2]
    with position_ids, else [B, S, rot / 2]."""
    half = (rot or HEAD) // 2
    x = normal(B, HEADS, S, HEAD, dtype=dtype) if rank == 4 else normal(B, S, HEADS * HEAD, dtype=dtype)
    rows = (POSITIONS,) if with_pos else (B, S)
    angles = rng.uniform(0, 6, rows + (half,))
    caches = {"cos": np.cos(angles).astype(dtype), "sin": np.sin(angles).astype(dtype)}
    inputs = {"x": x}
    names = ["x", "cos", "sin"]
    if with_pos:
        inputs["pos"] = rng.integers(0, POSITIONS, (B, S)).astype(np.int64)
        names.append("pos")
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot}
    if rank == 3:
        attrs["num_heads"] = HEADS
    return helper.make_node("RotaryEmbedding", names, ["y"], **attrs), inputs, caches


ROTARY = [(4, 0, 0, True), (4, 1, 0, True), (4, 0, 4, True), (4, 1, 6, False), (3, 0, 0, False), (3, 1, 4, True),
          (3, 0, 6, True)]


@pytest.mark.parametrize("rank,interleaved,rot,with_pos", ROTARY)
@pytest.mark.parametrize("caches_fed", [False, True])
def test_rotary_embedding(rank, interleaved, rot, with_pos, caches_fed):
    node, inputs, caches = rotary_case(rank, interleaved, rot, with_pos)
    if caches_fed:
        check([node], dict(inputs, **caches))
    else:
        check([node], inputs, caches)


def test_rotary_embedding_float16():
    node, inputs, caches = rotary_case(4, 0, 0, True, np.float16)
    check([node], inputs, caches, tol=2e-3)


def test_rotary_embedding_constant_caches_run_in_four_launches():
    """Constant caches widen at load: a row Gather per table, the pair swap's Gather, one fused Mul/Add."""
    node, inputs, caches = rotary_case(4, 1, 4, True)
    net = check([node], inputs, caches)
    assert sorted(launches(net)) == ["Gather", "Gather", "Gather", "Mul+Mul+Add"]


@pytest.mark.parametrize("attrs,cache,match", [({}, (B, S, HEAD // 2), "needs num_heads"),
                                               ({"num_heads": HEADS, "rotary_embedding_dim": 5}, (B, S, 2),
                                                "rotary_embedding_dim 5"),
                                               ({"num_heads": HEADS}, (B, S, 3), r"cos_cache of shape \[2, 5, 3\]")])
def test_rotary_embedding_errors_name_the_node(attrs, cache, match):
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], name="rope", **attrs)
    model = model_of([node], {"x": normal(B, S, HEADS * HEAD)}, ["y"], {"cos": normal(*cache), "sin": normal(*cache)})
    with pytest.raises(dlnet.ModelError, match=rf"node rope \(RotaryEmbedding\): .*{match}"):
        dlnet.Net(context()).load_onnx(model)


# ---------------------------------------------------------------- gradients ----------------------------------------
def device_gradients(model, feeds, wrt, w):
    """(loss, [d loss / d feeds[name] for name in wrt]) of loss = sum(y * w), y the model's output: the importer's
    training graph, autodiff and the trainer's passes, float32 on the device."""
    imp = Importer(model, "t.onnx")
    g = imp.build({n: a.shape for n, a in feeds.items()}, training=True)
    b = Builder(g)
    weights = g.add_input("w", "float32", w.shape)
    prod = b.op("Mul", [g.outputs[0], weights])
    loss = b.op("Reduce", [prod], {"mode": "sum", "axes": tuple(range(prod.rank)), "keepdims": 0})
    grads = gradients(g, loss, [imp.values[n] for n in wrt])
    g.outputs, g.output_names = [loss] + grads, ["loss"] + [f"d{n}" for n in wrt]
    training_passes(g, context())
    plan = Plan(context(), g)
    arrays = dict(feeds, w=w.astype(np.float32))
    try:
        outs = plan.run([arrays[v.name] for v in g.inputs])
    finally:
        plan.release()
    return float(outs[0]), outs[1:]


def central_differences(model64, feeds, name, w, eps=1e-6):
    x = feeds[name]
    fd = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        keep = x[i]
        sums = []
        for step in (eps, -eps):
            x[i] = keep + step
            sums.append(float((reference(model64, feeds)[0] * w).sum()))
        x[i] = keep
        fd[i] = (sums[0] - sums[1]) / (2 * eps)
    return fd


def check_gradients(node, feeds, wrt):
    """Every float feed an input; the float64 twin of the model evaluated by onnx.reference for the differences."""
    model = model_of([node], feeds, ["y"])
    feeds64 = {n: a.astype(np.float64) if a.dtype.kind == "f" else a for n, a in feeds.items()}
    model64 = model_of([node], feeds64, ["y"])
    y = reference(model64, feeds64)[0]
    w = np.random.default_rng(1).standard_normal(y.shape)
    loss, grads = device_gradients(model, feeds, wrt, w)
    assert abs(loss - float((y * w).sum())) <= 1e-4 * max(1.0, abs(float((y * w).sum())))
    for name, g in zip(wrt, grads):
        fd = central_differences(model64, feeds64, name, w)
        assert rel_l2(g, fd) <= 1e-3, (name, rel_l2(g, fd))


@pytest.mark.parametrize("shape,axis,scale", [((3, 4, 6), -1, (6,)), ((2, 3, 2, 4), 1, (3, 2, 4)),
                                              ((2, 3, 5), -1, (2, 1, 5))])
def test_rms_normalization_gradients(shape, axis, scale):
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=axis, epsilon=1e-2)
    check_gradients(node, {"x": normal(*shape), "scale": normal(*scale) + 1}, ["x", "scale"])


@pytest.mark.parametrize("rank,interleaved,rot,with_pos", [(4, 0, 0, True), (4, 1, 4, False), (3, 1, 6, True)])
def test_rotary_embedding_gradients(rank, interleaved, rot, with_pos):
    node, inputs, caches = rotary_case(rank, interleaved, rot, with_pos)
    check_gradients(node, dict(inputs, **caches), ["x", "cos", "sin"])


# ---------------------------------------------------------------- a Llama-style decoder ------------------------------
DIM, N_HEADS, KV_HEADS, FFN, VOCAB = 32, 4, 2, 48, 40
HEAD_DIM = DIM // N_HEADS


def llama_modules(torch):
    """The Llama decoder's classes, in plain torch (as the Llama code writes them)."""
    nn, F = torch.nn, torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.rand(dim) + 0.5), eps

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class Attention(nn.Module):
        """Grouped-query attention: KV_HEADS key / value heads shared by N_HEADS query heads, through SDPA with
        is_causal and either enable_gqa or K / V repeated (repeat_interleave)."""

        def __init__(self, gqa):
            super().__init__()
            self.q = nn.Linear(DIM, N_HEADS * HEAD_DIM, bias=False)
            self.k, self.v = (nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False) for _ in range(2))
            self.o = nn.Linear(DIM, DIM, bias=False)
            self.gqa = gqa

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            q = self.q(x).view(b, t, N_HEADS, HEAD_DIM).transpose(1, 2)
            k = self.k(x).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
            v = self.v(x).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            if self.gqa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                k, v = (z.repeat_interleave(N_HEADS // KV_HEADS, dim=1) for z in (k, v))
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(y.transpose(1, 2).reshape(b, t, DIM))

    class Layer(nn.Module):
        """x + attn(norm(x)), then x + down(silu(gate(norm(x))) * up(norm(x))) (SwiGLU)."""

        def __init__(self, gqa):
            super().__init__()
            self.attn_norm, self.mlp_norm = RMSNorm(DIM), RMSNorm(DIM)
            self.attn = Attention(gqa)
            self.gate, self.up = (nn.Linear(DIM, FFN, bias=False) for _ in range(2))
            self.down = nn.Linear(FFN, DIM, bias=False)

        def forward(self, x, cos, sin):
            x = x + self.attn(self.attn_norm(x), cos, sin)
            h = self.mlp_norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        """Embedding, rotary cos / sin of the positions, two layers, a final RMSNorm, an LM head."""

        def __init__(self, gqa=False, flat=False):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, DIM)
            self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM),
                                 persistent=False)
            self.layers = nn.ModuleList([Layer(gqa), Layer(gqa)])
            self.norm, self.head = RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)
            self.flat = flat  # logits as [B * S, VOCAB] rows (the cross-entropy of every position)

        def forward(self, ids):
            freqs = torch.outer(torch.arange(ids.shape[1], dtype=torch.float32), self.inv_freq)
            angles = torch.cat((freqs, freqs), dim=-1)
            cos, sin = angles.cos(), angles.sin()
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x, cos, sin)
            logits = self.head(self.norm(x))
            return logits.flatten(0, 1) if self.flat else logits

    return Llama


# how: (dynamo, op-set, enable_gqa). TorchScript cannot export enable_gqa=True ("conversion of
# scaled_dot_product_attention not implemented if enable_gqa is True"): its exports repeat K / V.
LLAMA_EXPORTS = {"dynamo-gqa": (True, None, True), "dynamo": (True, None, False), "ts14": (False, 14, False),
                 "ts17": (False, 17, False)}


def export_llama(torch, how, flat=False):
    """(module, ModelProto): the decoder exported batch- and sequence-dynamic (the default exporter for inference;
    optimize=False for training, so every weight keeps its qualified name, as dlnet.torch does)."""
    import io
    dynamo, opset, gqa = LLAMA_EXPORTS[how]
    torch.manual_seed(0)
    module = llama_modules(torch)(gqa, flat).eval()
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, VOCAB, (2, 12)))
    kw = {"input_names": ["ids"], "output_names": ["logits"], "dynamo": dynamo}
    if dynamo:
        kw["dynamic_shapes"] = ({0: torch.export.Dim("batch", min=1, max=16), 1: torch.export.Dim("seq", min=2,
                                                                                                  max=32)},)
        if flat:
            kw["optimize"] = False
        return module, torch.onnx.export(module, (ids,), verbose=False, **kw).model_proto
    buf = io.BytesIO()
    torch.onnx.export(module, (ids,), buf, opset_version=opset, do_constant_folding=not flat,
                      dynamic_axes={"ids": {0: "batch", 1: "seq"}}, **kw)
    return module, onnx.load_from_string(buf.getvalue())


@pytest.mark.slow
@pytest.mark.parametrize("how", list(LLAMA_EXPORTS))
def test_llama_export_matches_torch(how):
    """Two sequence lengths (and batches), each planned on its own, within 1e-4 of torch; every RMSNorm (two per
    layer and the final one) one kernel."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    module, model = export_llama(torch, how)
    net = dlnet.Net(context()).load_onnx(model)
    for seed, shape in ((1, (2, 12)), (2, (3, 7))):
        ids = np.random.default_rng(seed).integers(0, VOCAB, shape)
        with torch.no_grad():
            want = module(torch.from_numpy(ids)).numpy()
        got = net.run({"ids": ids})["logits"]
        assert got.shape == want.shape and rel_l2(got, want) <= 1e-4, (shape, rel_l2(got, want))
    assert len(net.plans) == 2
    ops = [line.split("= ", 1)[1].split("(")[0] for line in str(net.graph).splitlines() if " = " in line]
    assert ops.count("RMSNorm") == 5 and not {"Pow", "Sqrt", "Reciprocal"} & set(ops)
    net.release()


@pytest.mark.slow
@pytest.mark.parametrize("how", list(LLAMA_EXPORTS))
def test_llama_sgd_step_matches_torch(how):
    """One SGD step of next-token cross-entropy over every position through dlnet.Trainer (the module's parameters
    named, not the exporter's constants or the inv_freq buffer): torch's loss, and torch's drop in loss."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    module, model = export_llama(torch, how, flat=True)
    rng = np.random.default_rng(3)
    ids, target = rng.integers(0, VOCAB, (2, 12)), rng.integers(0, VOCAB, 24)
    lr = 0.5
    ref = copy.deepcopy(module).train()
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    ref_loss = torch.nn.functional.cross_entropy(ref(torch.from_numpy(ids)), torch.from_numpy(target))
    ref_loss.backward()
    opt.step()
    with torch.no_grad():
        ref_after = torch.nn.functional.cross_entropy(ref(torch.from_numpy(ids)), torch.from_numpy(target)).item()
    net = dlnet.Net(context()).load_onnx(model)
    trainer = dlnet.Trainer(net, optimizer=dlnet.optim.SGD(lr=lr), params=[n for n, _ in module.named_parameters()])
    loss = trainer.step({"ids": ids, "target": target})
    after = trainer.step({"ids": ids, "target": target})  # the loss of the updated weights
    assert abs(loss - ref_loss.item()) <= 1e-4 * abs(ref_loss.item()), (loss, ref_loss.item())
    drop, ref_drop = loss - after, ref_loss.item() - ref_after
    assert ref_drop > 0.1, ref_drop  # the step moves the loss well above float rounding
    assert abs(drop - ref_drop) <= 1e-4 * abs(ref_drop), (drop, ref_drop)
    trainer.close()
    net.close()
