"""Decoding with the KV cache on the device: Net.run(keep=...) and dlnet.generate, against a GPT-2-shaped decoder
written in plain torch (2 layers, d 64, 4 heads, vocab 97) and its own greedy loop with the same cache.

The decoder has two forms over the same weights: "growing" (the past concatenated with the new keys, the standard
exports' form: symbolic batch and lengths) and "static" (past keys and values of a fixed length TMAX, the new ones
written in place at a `position` input by Where with a one-hot, or index_copy, the keys after it masked).
"""
import io
import math
from collections import Counter

import numpy as np
import pytest

import dlnet
import dlnet.plan
from dlnet.generate import sample_tokens
from tests.conftest import context, rel_l2

torch = pytest.importorskip("torch")
nn = torch.nn

VOCAB, D, HEADS, LAYERS, TMAX = 97, 64, 4, 2, 32
PAST = [f"past_key_values.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]
PRESENT = [f"present.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x, past_k, past_v, update, mask):
        b, t, _ = x.shape
        q, k, v = (y.reshape(b, t, HEADS, D // HEADS).transpose(1, 2) for y in self.qkv(self.ln1(x)).split(D, -1))
        k, v = update(past_k, k), update(past_v, v)
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D // HEADS) + mask, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, D))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x)))), k, v


class Decoder(nn.Module):
    """forward(input_ids, [position,] *past) -> (logits, *present); cache: "growing", "where" or "index_copy"."""

    def __init__(self, cache="growing"):
        super().__init__()
        self.cache = cache
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(TMAX, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB, bias=False)

    def forward(self, input_ids, *rest):
        if self.cache == "growing":
            past = rest
            tp, t = past[0].shape[2], input_ids.shape[1]
            update = lambda old, new: torch.cat([old, new], dim=2)
            mask = torch.triu(torch.full((t, tp + t), float("-inf")), diagonal=tp + 1)
            pos = torch.arange(tp, tp + t).reshape(1, t)
        else:
            position, past = rest[0], rest[1:]
            keys = torch.arange(TMAX)
            hot = (keys == position).reshape(1, 1, TMAX, 1)
            if self.cache == "where":
                update = lambda old, new: torch.where(hot, new, old)
            else:
                update = lambda old, new: old.index_copy(2, position, new)
            mask = torch.where(keys <= position, 0.0, float("-inf"))
            pos = position.reshape(1, 1)
        x = self.wte(input_ids) + self.wpe(pos)
        present = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, past[2 * i], past[2 * i + 1], update, mask)
            present += [k, v]
        return (self.head(self.ln(x)), *present)


@pytest.fixture(scope="module")
def decoders():
    torch.manual_seed(0)
    growing = Decoder().eval()
    static = {c: Decoder(c).eval() for c in ("where", "index_copy")}
    for m in static.values():
        m.load_state_dict(growing.state_dict())
    return growing, static


def export(model, past=PAST, present=PRESENT):
    """The TorchScript exporter's ONNX (op-set 17): the growing form with symbolic batch, length and past."""
    f = io.BytesIO()
    if model.cache == "growing":
        args = (torch.zeros(1, 3, dtype=torch.long), *[torch.randn(1, HEADS, 2, D // HEADS) for _ in PAST])
        dynamic = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"},
                   **{n: {0: "batch", 2: "past"} for n in past}, **{n: {0: "batch", 2: "total"} for n in present}}
        names = ["input_ids"] + past
    else:
        args = (torch.zeros(1, 1, dtype=torch.long), torch.tensor([0]),
                *[torch.zeros(1, HEADS, TMAX, D // HEADS) for _ in past])
        dynamic, names = None, ["input_ids", "position"] + past
    torch.onnx.export(model, args, f, opset_version=17, dynamo=False, input_names=names,
                      output_names=["logits"] + present, dynamic_axes=dynamic)
    return f.getvalue()


def torch_greedy(model, prompt, n):
    """torch's own greedy loop with the growing cache: the prompt in one step, then a token a step."""
    with torch.no_grad():
        tokens = torch.from_numpy(prompt)
        out = model(tokens, *[torch.zeros(len(prompt), HEADS, 0, D // HEADS) for _ in PAST])
        for _ in range(n):
            new = out[0][:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, new], dim=1)
            out = model(new, *out[1:])
    return tokens.numpy()


@pytest.fixture(scope="module")
def nets(decoders):
    growing, static = decoders
    made = {"growing": dlnet.Net(context()).load_onnx(export(growing))}
    made.update({c: dlnet.Net(context()).load_onnx(export(m)) for c, m in static.items()})
    yield made
    for net in made.values():
        net.close()


def prompt(batch=1, length=5, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, length))


class CopySpy:
    """Counts pyopencl's copies by direction: "up" (host to device), "down", "device" (device to device)."""

    def __init__(self, monkeypatch):
        self.counts = Counter()
        real = dlnet.plan.cl.enqueue_copy

        def spy(queue, dest, src, **kw):
            host = (isinstance(dest, np.ndarray), isinstance(src, np.ndarray))
            self.counts[{(False, True): "up", (True, False): "down"}.get(host, "device")] += 1
            return real(queue, dest, src, **kw)
        monkeypatch.setattr(dlnet.plan.cl, "enqueue_copy", spy)


def test_growing_cache_greedy_matches_torch(decoders, nets):
    """The standard exports' concatenated past: 16 greedy tokens at batch 2 equal torch's with its own cache."""
    ids = prompt(batch=2)
    want = torch_greedy(decoders[0], ids, 16)
    got = dlnet.generate(nets["growing"], ids, 16)
    assert got.dtype == np.int64 and got.shape == (2, 5 + 16)
    np.testing.assert_array_equal(got, want)
    assert not nets["growing"].kept  # the cache is released at the end


@pytest.mark.parametrize("cache", ["where", "index_copy"])
def test_static_cache_one_plan(decoders, nets, cache, monkeypatch):
    """The static cache: the same tokens as torch's greedy loop, every step (the prompt's token by token too) on
    one plan, the cache uploaded from the host once (the empty cache) and bound on the device at every later step.
    Where writes each present key over its past one (the planner ties them), so no step copies the cache; ScatterND
    (index_copy) cannot, so each step copies it once, device to device."""
    net = nets[cache]
    net.release()
    ids = prompt(seed=1)
    want = torch_greedy(decoders[0], ids, 16)
    got = dlnet.generate(net, ids[0], 16)  # (a 1-D prompt gives 1-D tokens)
    np.testing.assert_array_equal(got, want[0])
    assert len(net.plans) == 1
    plan = next(iter(net.plans.values()))
    runs = 5 + 16 - 1  # 5 prompt tokens, then 15 steps (the 16th token needs no run)
    assert plan.device_binds == len(PAST) * (runs - 1)
    copies = CopySpy(monkeypatch)  # (after the weights went up)
    np.testing.assert_array_equal(dlnet.generate(net, ids[0], 16), want[0])
    assert len(net.plans) == 1
    device = 0 if cache == "where" else len(PAST) * (runs - 1)
    assert copies.counts == {"up": len(PAST) + 2 * runs, "down": runs, **({"device": device} if device else {})}


@pytest.mark.slow
def test_static_cache_default_exporter(decoders):
    """The same static-cache decoder through torch's default (dynamo) exporter, op-set 20: torch's tokens, one
    plan."""
    pytest.importorskip("onnxscript")
    model = decoders[1]["where"]
    args = (torch.zeros(1, 1, dtype=torch.long), torch.tensor([0]),
            *[torch.zeros(1, HEADS, TMAX, D // HEADS) for _ in PAST])
    program = torch.onnx.export(model, args, input_names=["input_ids", "position"] + PAST,
                                output_names=["logits"] + PRESENT, opset_version=20, verbose=False)
    ids = prompt(seed=5)
    with dlnet.Net(context()).load_onnx(program.model_proto) as net:
        net.release()  # (the plan made at load, without the cache's outputs tied to its inputs)
        np.testing.assert_array_equal(dlnet.generate(net, ids, 16), torch_greedy(decoders[0], ids, 16))
        assert len(net.plans) == 1


def test_keep_without_host_round_trip(nets, monkeypatch):
    """run(keep=...): the kept outputs are not downloaded, the next run binds them without a host upload, and its
    logits equal those of a run given the same cache through the host."""
    net = nets["where"]
    rng = np.random.default_rng(2)
    cache = {n: rng.standard_normal((1, HEADS, TMAX, D // HEADS)).astype(np.float32) for n in PAST}
    first = {"input_ids": np.array([[7]]), "position": np.array([3]), **cache}
    second = {"input_ids": np.array([[11]]), "position": np.array([4])}
    keep = dict(zip(PRESENT, PAST))
    net.run(first, keep=keep)  # (the plans made before the copies are counted)
    net.drop_kept()
    presents = net.run(first, outputs=PRESENT)
    want = net.run({**second, **dict(zip(PAST, presents.values()))}, outputs=["logits"] + PRESENT[:1])
    copies = CopySpy(monkeypatch)
    out = net.run(first, keep=keep)
    assert sorted(out) == ["logits"]
    assert copies.counts == {"up": 2 + len(PAST), "down": 1}
    assert sorted(net.kept) == sorted(PAST) and all(k.shape == (1, HEADS, TMAX, D // HEADS) for k in net.kept.values())
    copies.counts.clear()
    got = net.run(second, outputs=["logits"] + PRESENT[:1])
    assert copies.counts == {"up": 2, "device": len(PAST), "down": 2}
    assert not net.kept  # a kept value feeds one run
    for name in ["logits", PRESENT[0]]:
        assert rel_l2(got[name], want[name]) < 1e-6
    with pytest.raises(dlnet.InputError, match="missing input 'past_key_values.0.key'"):
        net.run(second)
    net.run(first, keep=keep)
    given = net.run({**second, **dict(zip(PAST, presents.values()))}, outputs=["logits"] + PRESENT[:1])
    assert not net.kept  # inputs given anew replace the kept values
    assert rel_l2(given["logits"], want["logits"]) < 1e-6


def test_kept_values_survive_release(decoders, nets):
    """Kept values move out of a plan's arena when it goes (release, or eviction at max_plans=1 where every
    growing length plans anew): the tokens stay torch's."""
    ids = prompt(seed=3)
    want = torch_greedy(decoders[0], ids, 6)
    growing = dlnet.Net(context(), max_plans=1).load_onnx(export(decoders[0]))
    np.testing.assert_array_equal(dlnet.generate(growing, ids, 6), want)
    growing.close()
    net = nets["where"]
    keep = dict(zip(PRESENT, PAST))
    zeros = {n: np.zeros((1, HEADS, TMAX, D // HEADS), np.float32) for n in PAST}
    got = []
    for t, token in enumerate(ids[0]):
        logits = net.run({"input_ids": ids[:, t:t + 1], "position": np.array([t]), **(zeros if t == 0 else {})},
                         keep=keep)["logits"]
        got.append(int(logits[0, -1].argmax()))
        net.release()  # the plan goes; the kept cache moves to buffers of its own
    net.drop_kept()
    with torch.no_grad():
        logits = decoders[0](torch.from_numpy(ids), *[torch.zeros(1, HEADS, 0, D // HEADS) for _ in PAST])[0]
    np.testing.assert_array_equal(got, logits[0].argmax(-1).numpy())


def test_cache_names_given(decoders):
    """Names no exporter writes: refused by name, then paired by cache={present: past}; torch's tokens."""
    past = [f"cache_in_{i}" for i in range(len(PAST))]
    present = [f"cache_out_{i}" for i in range(len(PAST))]
    ids = prompt(seed=7)
    with dlnet.Net(context()).load_onnx(export(decoders[1]["where"], past, present)) as net:
        with pytest.raises(dlnet.ModelError, match=r"no present output pairs with input\(s\) \['input_ids'"):
            dlnet.generate(net, ids, 4)
        with pytest.raises(dlnet.InputError, match="cache pairs output 'present.0.key' with input 'cache_in_0'"):
            dlnet.generate(net, ids, 4, cache={"present.0.key": "cache_in_0"})
        got = dlnet.generate(net, ids, 8, cache=dict(zip(present, past)))
    np.testing.assert_array_equal(got, torch_greedy(decoders[0], ids, 8))


def test_keep_errors(nets):
    """A kept value of another shape, and keep= naming what the model lacks, are one-line InputErrors."""
    net = nets["growing"]
    keep = dict(zip(PRESENT, PAST))
    feeds = {"input_ids": prompt(length=3), **{n: np.zeros((1, HEADS, 0, D // HEADS), np.float32) for n in PAST}}
    net.run(feeds, keep=keep)
    with pytest.raises(dlnet.InputError, match=r"dimension 'batch' is 2 in one input and 1 in "
                                               r"'past_key_values.0.key' \(kept on the device"):
        net.run({"input_ids": prompt(batch=2, length=1)})
    net.drop_kept()
    assert not net.kept
    with pytest.raises(dlnet.InputError, match="unknown output 'present.9.key'"):
        net.run(feeds, keep={"present.9.key": PAST[0]})
    with pytest.raises(dlnet.InputError, match="output 'logits' is float32, input 'input_ids' expects int64"):
        net.run(feeds, keep={"logits": "input_ids"})
    with pytest.raises(dlnet.InputError, match="static cache holds 32"):
        dlnet.generate(nets["where"], prompt(length=20), 13)


def test_sampling_reproducible(nets):
    """A seed gives the same tokens; top_k=1 is greedy; another seed gives others."""
    net, ids = nets["where"], prompt(seed=4)
    kw = dict(greedy=False, top_k=20, top_p=0.9, temperature=1.5)
    a = dlnet.generate(net, ids, 12, seed=7, **kw)
    np.testing.assert_array_equal(dlnet.generate(net, ids, 12, seed=7, **kw), a)
    assert (dlnet.generate(net, ids, 12, seed=8, **kw) != a).any()
    np.testing.assert_array_equal(dlnet.generate(net, ids, 12, greedy=False, top_k=1, seed=7),
                                  dlnet.generate(net, ids, 12))
    eos = int(a[0, 7])  # stops where every row has given eos_id
    b = dlnet.generate(net, ids, 12, seed=7, eos_id=eos, **kw)
    np.testing.assert_array_equal(b, a[:, :a[0].tolist().index(eos, 5) + 1])
    with pytest.raises(dlnet.InputError, match="pass greedy=False"):
        dlnet.generate(net, ids, 4, top_k=3)


@pytest.mark.parametrize("top_k, top_p, temperature, kept", [
    (2, None, 1.0, [0, 0.4, 0, 0.3, 0]),
    (None, 0.8, 1.0, [0, 0.4, 0, 0.3, 0.15]),  # the smallest set reaching 0.8: its third token crosses
    (4, 0.5, 1.0, [0, 0.4, 0, 0.3, 0]),
    (None, None, 0.5, [0.05**2, 0.4**2, 0.1**2, 0.3**2, 0.15**2]),  # temperature 0.5 squares the probabilities
])
def test_sample_tokens_distribution(top_k, top_p, temperature, kept):
    """top_k, top_p and temperature keep the right tokens with renormalised probabilities (20000 draws)."""
    logits = np.repeat(np.log([[0.05, 0.4, 0.1, 0.3, 0.15]]), 20000, axis=0)
    draws = sample_tokens(logits, np.random.default_rng(0), top_k, top_p, temperature)
    freq = np.bincount(draws, minlength=5) / len(draws)
    assert np.abs(freq - np.array(kept) / sum(kept)).max() < 0.015


def test_kept_values_swapped_in_one_arena():
    """Two values kept in a plan's own arena, each where the other input goes: both move out before either is
    copied in (copied in order, the first would overwrite the second)."""
    from onnx import helper

    from tests.conftest import make_model
    nodes = [helper.make_node("Neg", ["x"], ["y"]), helper.make_node("Add", ["c", "c"], ["z"])]
    model = make_model(nodes, {"x": ("float32", [64]), "c": ("float32", [64])}, ["y", "z"])
    with dlnet.Net(context()).load_onnx(model) as net:
        plan = next(iter(net.plans.values()))
        rng = np.random.default_rng(6)
        a, b = (rng.standard_normal(64).astype(np.float32) for _ in range(2))
        plan.run([a, b])  # the inputs' places now hold a and b
        (buf, x_at), (_, c_at) = plan.input_locs
        at_c = dlnet.plan.Kept(net.ctx, (64,), np.float32, buf, c_at * 4, plan)
        at_x = dlnet.plan.Kept(net.ctx, (64,), np.float32, buf, x_at * 4, plan)
        plan.issued.update([at_c, at_x])
        y, z = plan.run([at_c, at_x])
        np.testing.assert_array_equal(y, -b)
        np.testing.assert_array_equal(z, a + a)
        assert at_c.state == at_x.state == "live" and at_c.owner is None  # moved to buffers of their own
        at_c.release()
        at_x.release()
        plan.run([a, b])
        in_place = dlnet.plan.Kept(net.ctx, (64,), np.float32, buf, x_at * 4, plan)  # already where x goes
        plan.issued.add(in_place)
        copies = plan.device_binds
        y, z = plan.run([in_place, -b])
        np.testing.assert_array_equal(y, -a)
        np.testing.assert_array_equal(z, -(b + b))
        assert plan.device_binds == copies + 1 and in_place.state == "consumed"
