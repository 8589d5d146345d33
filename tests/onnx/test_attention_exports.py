"""Attention as PyTorch 2.13 exports it, fused into one Attention node per attention, against torch.

Each module is exported by the dynamo exporter at op-set 20 (MatMul, Mul by sqrt(scale) on both sides, Softmax,
MatMul; masks as constants or Where(mask, 0, lowest)), by TorchScript at op-sets 14 and 17 (Transpose, Mul, Add,
Softmax, MatMul; a bool mask with a NaN guard after the Softmax), and the mixed one by dynamo at op-set 23 (an
Attention-23 node per scaled_dot_product_attention, the hand-written one decomposed). After the passes the graph
has one Attention node per attention and no Softmax, and no head Transpose before or after it: the node reads the
projections and writes its output in their layout ([B, T, H, D]; nn.MultiheadAttention's [T, B * H, D] as rank 4
with B 1); dlnet matches torch within 1e-4.
"""
import numpy as np
import onnx
import pytest

import dlnet
from dlnet.graph.ops.attention import logical_shape
from tests.conftest import rel_l2

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")  # the dynamo exporter's dependency
nn = torch.nn
F = torch.nn.functional

B, T, D, HEADS = 2, 11, 32, 4


class Mixed(nn.Module):
    """Five attentions over one projection: SDPA plain, is_causal, with a float mask input, with a bool padding
    mask input, and a hand-written one with a -inf triangle from torch.triu."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(5 * D, D)

    def heads(self, x):
        b, t, _ = x.shape
        return [y.reshape(b, t, HEADS, D // HEADS).transpose(1, 2) for y in self.qkv(x).split(D, dim=-1)]

    def forward(self, x, bias, keep):
        q, k, v = self.heads(x)
        ys = [F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True),
              F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
              F.scaled_dot_product_attention(q, k, v, attn_mask=keep)]
        t = x.shape[1]
        tri = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        ys.append(torch.softmax(q @ k.transpose(-2, -1) / (D // HEADS) ** 0.5 + tri, dim=-1) @ v)
        return self.out(torch.cat([y.transpose(1, 2).reshape(x.shape) for y in ys], dim=-1))


class Mha(nn.Module):
    """nn.MultiheadAttention with its default need_weights (the averaged weights unused) and a key padding mask."""

    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(D, HEADS, batch_first=True)

    def forward(self, x, pad):
        return self.mha(x, x, x, key_padding_mask=pad)[0]


class Gqa(nn.Module):
    """Grouped-query attention: 4 query heads over 2 key/value heads (enable_gqa), causal."""

    def __init__(self):
        super().__init__()
        self.q, self.kv = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, HEADS, D // HEADS).transpose(1, 2)
        k, v = (y.reshape(b, t, 2, D // HEADS).transpose(1, 2) for y in self.kv(x).split(D // 2, dim=-1))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(b, t, D)


def _inputs(name, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    if name == "mixed":
        keep = np.ones((B, 1, 1, T), bool)
        keep[1, ..., 7:] = False
        return {"x": x, "bias": rng.standard_normal((B, 1, T, T)).astype(np.float32), "keep": keep}
    if name == "mha":
        pad = np.zeros((B, T), bool)
        pad[0, 8:] = True
        return {"x": x, "pad": pad}
    return {"x": x}


MODELS = {"mixed": (Mixed, 5), "mha": (Mha, 1), "gqa": (Gqa, 1)}  # module, attentions
EXPORTS = [("mixed", "dynamo"), ("mixed", "ts14"), ("mixed", "ts17"), ("mixed", "dynamo23"), ("mha", "dynamo"),
           ("mha", "ts14"), ("mha", "ts17"), ("gqa", "dynamo")]  # (TorchScript refuses enable_gqa)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = {}

    def get(name, how):
        if (name, how) not in cache:
            torch.manual_seed(0)
            module = MODELS[name][0]().eval()
            feeds = _inputs(name, 0)
            args = tuple(torch.from_numpy(a) for a in feeds.values())
            path = str(tmp_path_factory.mktemp(f"{name}_{how}") / "model.onnx")
            kw = {"input_names": list(feeds), "output_names": ["y"]}
            if how.startswith("dynamo"):
                kw.update(dynamo=True, **({"opset_version": 23} if how == "dynamo23" else {}))
            else:
                kw.update(dynamo=False, opset_version=int(how[2:]))
            torch.onnx.export(module, args, path, **kw)
            cache[name, how] = module, path
        return cache[name, how]
    return get


def _ops(net):
    return [line.split("= ", 1)[1].split("(")[0] for line in str(net.graph).splitlines() if " = " in line]


@pytest.mark.slow
@pytest.mark.parametrize("name,how", EXPORTS, ids=[f"{n}-{h}" for n, h in EXPORTS])
def test_export_fuses_each_attention_and_matches_torch(ctx, exported, name, how):
    module, path = exported(name, how)
    written = [n.op_type for n in onnx.load(path, load_external_data=False).graph.node]
    assert written.count("Attention") == (4 if how == "dynamo23" else 0)
    feeds = _inputs(name, 1)
    with torch.no_grad():
        want = module(*[torch.from_numpy(a) for a in feeds.values()]).numpy()
    net = dlnet.Net(ctx).load_onnx(path)
    got = net.run(feeds)["y"]
    ops = _ops(net)
    assert ops.count("Attention") == MODELS[name][1] and "Softmax" not in ops, ops
    assert rel_l2(got, want) <= 1e-4, rel_l2(got, want)
    assert "algo=flash" in str(net.graph)
    assert not _transposes_around(net.graph), str(net.graph)
    net.release()


def _transposes_around(graph):
    """The Transposes that make an Attention node's q, k, v or read its output (the head splits and merges the
    node's layout attribute takes in their place)."""
    found = []
    for n in graph.nodes:
        if n.op == "Attention":
            found += [x.producer for x in n.inputs[:3] if x.producer is not None and x.producer.op == "Transpose"]
            found += [u for u in n.outputs[0].users if u.op == "Transpose"]
    return found


@pytest.mark.slow
def test_grouped_query_heads_are_read_unrepeated(ctx, exported):
    """The Expand that repeats each key/value head for SDPA's enable_gqa goes: the Attention node reads 2 kv heads."""
    _, path = exported("gqa", "dynamo")
    net = dlnet.Net(ctx).load_onnx(path)
    net.run(_inputs("gqa", 1))
    line = next(s for s in str(net.graph).splitlines() if "= Attention(" in s)
    assert "causal=1" in line and "Expand" not in _ops(net)
    node = next(n for n in net.graph.nodes if n.op == "Attention")
    q, k, v = (logical_shape(x.shape, s) for x, s in zip(node.inputs, node.attrs["layout"]))
    assert node.attrs["layout"] == ("bthd",) * 4 and q[1] == HEADS and k[1] == v[1] == 2
    net.release()


@pytest.mark.slow
def test_training_step_through_the_fused_forward_matches_torch(ctx, tmp_path):
    """One SGD step of the mixed module (TorchScript, op-set 17, its weights kept by name) through dlnet.Trainer:
    the forward runs five Attention kernels, the backward their rule; torch's loss and torch's drop in loss."""
    import copy
    torch.manual_seed(0)
    module = Mixed().eval()
    feeds = _inputs("mixed", 2)
    path = str(tmp_path / "model.onnx")
    torch.onnx.export(module, tuple(torch.from_numpy(a) for a in feeds.values()), path, dynamo=False, opset_version=17,
                      do_constant_folding=False, input_names=list(feeds), output_names=["y"])
    target = np.random.default_rng(3).standard_normal((B, T, D)).astype(np.float32)
    ref = copy.deepcopy(module).train()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    loss_of = lambda m: F.mse_loss(m(*[torch.from_numpy(a) for a in feeds.values()]), torch.from_numpy(target))  # noqa
    ref_loss = loss_of(ref)
    ref_loss.backward()
    opt.step()
    ref_after = loss_of(ref).item()
    net = dlnet.Net(ctx).load_onnx(path)
    trainer = dlnet.Trainer(net, loss="mse", optimizer=dlnet.optim.SGD(lr=0.05),
                            params=[n for n, _ in module.named_parameters()])
    loss = trainer.step(dict(feeds, target=target))
    after = trainer.step(dict(feeds, target=target))
    assert sum(n.op == "Attention" for n in trainer._active.graph.nodes) == 5  # (tests/optim reads it so too)
    # the forward reads the projections as [B, T, H, D], the backward's decomposition transposes to [B, H, T, D]
    assert all(n.attrs["layout"] == ("bthd",) * 4 for n in trainer._active.graph.nodes if n.op == "Attention")
    assert abs(loss - ref_loss.item()) <= 1e-4 * abs(ref_loss.item()), (loss, ref_loss.item())
    drop, ref_drop = loss - after, ref_loss.item() - ref_after
    assert ref_drop > 1e-3, ref_drop
    assert abs(drop - ref_drop) <= 1e-3 * abs(ref_drop), (drop, ref_drop)
    trainer.close()
    net.release()
