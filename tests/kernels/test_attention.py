"""The fused attention kernels, attention.cl ("flash": work-groups, __local tiles; the CPU device runs it with
matrix_core="portable") and attention_cpu.cl ("flash_cpu", CPUs), against attention in float64 numpy written here
from its definition (a loop over heads, the visible keys of each query listed): sequence lengths that are no
multiple of the tile, head dims 16 to 128 (and v's apart from q's), causal with and without a cache offset, float
and bool masks that broadcast, grouped-query heads, several batches and heads, Tq != Tk (a KV cache, decoding);
operands stored in other layouts than [B, H, T, D] (read and written through strides); and the tile rule against
__local memory."""
from dataclasses import replace

import numpy as np
import pytest

from dlnet.errors import ModelError
from dlnet.graph.ir import Builder, Graph
from dlnet.graph.ops.attention import to_logical, to_stored
from dlnet.kernels.families.attention import ATTENTION_TILES, AttentionTile, attention_tile, mask_strides
from dlnet.plan import Plan

from ..conftest import context, rel_l2, tensor_core_context


def oracle(q, k, v, mask=None, scale=None, causal=False, offset=0, softcap=0.0):
    """softmax(scores + bias) v query by query in float64; a query that sees no key gives 0."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    lead = q.shape[:-2]
    tq, tk = q.shape[-2], k.shape[-2]
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    q4, k4, v4 = (a.reshape((1,) * (4 - a.ndim) + a.shape) for a in (q, k, v))
    m4 = None if mask is None else np.broadcast_to(mask, lead + (tq, tk)).reshape(q4.shape[:2] + (tq, tk))
    y = np.zeros(q4.shape[:3] + (v.shape[-1],))
    group = q4.shape[1] // k4.shape[1]
    for b in range(q4.shape[0]):
        for h in range(q4.shape[1]):
            kh, vh = k4[b, h // group], v4[b, h // group]
            for i in range(tq):
                s = kh @ q4[b, h, i] * scale
                if softcap > 0:
                    s = softcap * np.tanh(s / softcap)
                seen = np.ones(tk, bool)
                if causal:
                    seen &= np.arange(tk) <= i + offset
                if m4 is not None and m4.dtype == np.bool_:
                    seen &= m4[b, h, i]
                elif m4 is not None:
                    s = s + m4[b, h, i]
                    seen &= ~np.isneginf(m4[b, h, i])
                if seen.any():
                    e = np.exp(s[seen] - s[seen].max())
                    y[b, h, i] = e @ vh[seen] / e.sum()
    return y.reshape(lead + (tq, v.shape[-1]))


ALGOS = ["flash", "flash_cpu"]


def algo_context(algo):
    """The test device, made to run `algo` (the GPU kernel on a CPU through matrix_core="portable")."""
    ctx = context()
    if algo.startswith("flash_cpu") and ctx.dev.tiled:
        pytest.skip("flash_cpu runs on CPU devices")
    if algo == "flash_cpu/4rows":  # (attention_cpu.cl's first kernel, which decoding runs, on every case)
        return ctx.with_options(attention_cpu_lanes=False)
    return ctx.with_options(matrix_core="portable") if algo == "flash" and not ctx.dev.tiled else ctx


def run_attention(q, k, v, mask=None, algo="flash_cpu", ctx=None, more_q=(), **attrs):
    """(y, the node's schedule); with more_q, (the list of y for q and for each of more_q, one plan run again)."""
    ctx = ctx or algo_context(algo)
    g = Graph("attention")
    b = Builder(g)
    arrays = [q, k, v] + ([mask] if mask is not None else [])
    inputs = [g.add_input(f"x{i}", a.dtype, a.shape) for i, a in enumerate(arrays)]
    y = b.op("Attention", inputs, dict(attrs, scale=attrs.get("scale", float(1 / np.sqrt(q.shape[-1])))))
    g.outputs, g.output_names = [y], ["y"]
    plan = Plan(ctx, g)
    try:
        got = plan.run(arrays)[0]
        if more_q:
            got = [got] + [plan.run([q2] + arrays[1:])[0] for q2 in more_q]
        return got, y.producer.schedule
    finally:
        plan.release()


def _normal(rng, *shape, sd=1.0):
    return (rng.standard_normal(shape) * sd).astype(np.float32)


# id: (q shape, k heads, Tk, v head dim or None, mask shape and kind or None, attrs)
CASES = {
    "one-key": ((1, 1, 1, 16), 1, 1, None, None, {}),
    "t37-d16": ((2, 3, 37, 16), 3, 37, None, None, {}),
    "causal-t70-d32": ((1, 2, 70, 32), 2, 70, None, None, {"causal": 1}),
    "float-mask-tq33-tk45-d64": ((2, 2, 33, 64), 2, 45, None, ((2, 1, 33, 45), "float"), {}),
    "bool-mask-gqa-d80": ((1, 4, 50, 80), 2, 50, None, ((50, 50), "bool"), {}),
    "kv-cache-causal-d128": ((1, 2, 20, 128), 2, 97, None, None, {"causal": 1, "causal_offset": 77}),
    "mqa-causal-decode": ((2, 8, 9, 64), 1, 64, None, None, {"causal": 1, "causal_offset": 55}),
    "rank3-mask-per-key": ((3, 40, 16), 3, 40, None, ((40,), "float"), {}),
    "rank2": ((12, 24), None, 30, None, None, {}),
    "softcap-scale": ((2, 2, 21, 32), 2, 21, None, None, {"softcap": 1.5, "scale": 0.9}),
    "dv80-d32": ((2, 2, 35, 32), 2, 35, 80, None, {}),
    "dv24-d48-causal-cache": ((1, 2, 30, 48), 2, 45, 24, None, {"causal": 1, "causal_offset": 15}),
    "d20-dv12": ((2, 3, 19, 20), 3, 23, 12, None, {}),  # (no multiple of the CPU kernel's 8-float chunks)
    "padding-and-causal-d128": ((2, 2, 40, 128), 2, 40, None, ((2, 1, 1, 40), "bool"), {"causal": 1}),
    "negative-offset": ((1, 2, 12, 16), 2, 12, None, None, {"causal": 1, "causal_offset": -5}),
    "decode-one-query-gqa-mask": ((3, 4, 1, 64), 2, 77, None, ((3, 1, 1, 77), "bool"), {}),
    "long-sharp-online": ((1, 2, 33, 32), 2, 300, None, ((1, 2, 33, 300), "float"), {"scale": 2.0}),
}


# (attention.cl, the GPU kernel, on PoCL: seconds a case on 2 cores; CI runs it once, with the slow cases)
@pytest.mark.parametrize("algo", [pytest.param("flash", marks=pytest.mark.slow), "flash_cpu", "flash_cpu/4rows"])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_float64(case, algo):
    qs, hk, tk, dv, mask_spec, attrs = CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    lead = qs[:-3] + ((hk,) if hk is not None else ()) if len(qs) > 2 else ()
    q = _normal(rng, *qs)
    k = _normal(rng, *(lead + (tk, qs[-1])), sd=2.0 if case == "long-sharp-online" else 1.0)
    v = _normal(rng, *(lead + (tk, dv or qs[-1])))
    mask = None
    if mask_spec is not None:
        shape, kind = mask_spec
        if kind == "bool":
            mask = rng.random(shape) > 0.4
            mask.reshape(-1, shape[-1])[0] = False  # a row (or a batch's keys) hidden whole: 0 there
        else:
            mask = _normal(rng, *shape, sd=3.0)
            mask.reshape(-1, shape[-1])[0, ::3] = -np.inf
    got, schedule = run_attention(q, k, v, mask, algo, **attrs)
    want = oracle(q, k, v, mask, attrs.get("scale"), attrs.get("causal", 0), attrs.get("causal_offset", 0),
                  attrs.get("softcap", 0.0))
    assert got.shape == want.shape
    assert np.isfinite(got).all()
    assert rel_l2(got, want) <= 2e-6, rel_l2(got, want)
    assert schedule["algo"] == algo.split("/")[0] and schedule["tile"]
    if algo.startswith("flash_cpu"):  # (query rows in vector lanes where there are 8 of them, unless turned off)
        assert schedule["tile"].endswith("/lanes") == (algo == "flash_cpu" and qs[-2] >= 8), schedule["tile"]


def make_case(case):
    """(q, k, v, mask, attrs) of CASES[case], random."""
    qs, hk, tk, dv, mask_spec, attrs = CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    lead = qs[:-3] + ((hk,) if hk is not None else ()) if len(qs) > 2 else ()
    q = _normal(rng, *qs)
    k = _normal(rng, *(lead + (tk, qs[-1])), sd=2.0 if case == "long-sharp-online" else 1.0)
    v = _normal(rng, *(lead + (tk, dv or qs[-1])))
    mask = None
    if mask_spec is not None:
        shape, kind = mask_spec
        if kind == "bool":
            mask = rng.random(shape) > 0.4
            mask.reshape(-1, shape[-1])[0] = False  # a row (or a batch's keys) hidden whole: 0 there
        else:
            mask = _normal(rng, *shape, sd=3.0)
            mask.reshape(-1, shape[-1])[0, ::3] = -np.inf
    return q, k, v, mask, attrs


@pytest.mark.slow  # (elsewhere than NVIDIA, mma.sync emulated: seconds a case)
@pytest.mark.parametrize("copies", [True, False], ids=["cp", "regs"])
@pytest.mark.parametrize("case", list(CASES))
def test_tensor_core_kernel_matches_float64(case, copies):
    """attention_mma.cl (NVIDIA, tf32 mode: both products on mma.sync) against the float64 oracle, at tf32's
    precision, K and V by cp.async ("/cp") or through registers; the cases it does not take (head dims not multiples
    of 8, decoding's few rows) keep attention.cl."""
    ctx = tensor_core_context("tf32", attention_async=copies)
    q, k, v, mask, attrs = make_case(case)
    got, schedule = run_attention(q, k, v, mask, "flash", ctx=ctx, **attrs)
    want = oracle(q, k, v, mask, attrs.get("scale"), attrs.get("causal", 0), attrs.get("causal_offset", 0),
                  attrs.get("softcap", 0.0))
    assert np.isfinite(got).all()
    assert rel_l2(got, want) <= 5e-3, rel_l2(got, want)
    d, dv, tq = q.shape[-1], v.shape[-1], q.shape[-2]
    mma = d % 8 == 0 and dv % 8 == 0 and tq > 8
    assert schedule["tile"].startswith("mma") == mma, schedule["tile"]
    assert schedule["tile"].endswith("/cp") == (mma and copies), schedule["tile"]


def half_context(copies):
    """precision "fp16" where attention runs on attention_mma.cl, K and V by cp.async (copies) or through
    registers."""
    return tensor_core_context("fp16", attention_async=copies)


def run_half_attention(q, k, v, mask, ctx, **attrs):
    """precision "fp16": (y, the Attention node's schedule) of Mul(Attention(q c, k c, v c), c') with powers of two c
    and c' along the last dim, so that q, k, v and y are stored in half between in-graph kernels (the graph's inputs
    and outputs stay float32); q, k and v must be half values (c keeps them exact). Returns y / c'."""
    g = Graph("attention")
    b = Builder(g)
    arrays = [q, k, v] + ([mask] if mask is not None else [])
    inputs = [g.add_input(f"x{i}", a.dtype, a.shape) for i, a in enumerate(arrays)]
    powers = [2.0 ** (np.arange(x.shape[-1]) % 3 - 1) for x in (q, k, v)]
    scaled = [b.op("Mul", [x, b.const(c.astype(np.float32))]) for x, c in zip(inputs, powers)]
    y = b.op("Attention", scaled + inputs[3:], dict(attrs, scale=attrs.get("scale", float(1 / np.sqrt(q.shape[-1])))))
    node = y.producer
    out = 2.0 ** (np.arange(y.shape[-1]) % 2)
    g.outputs, g.output_names = [b.op("Mul", [y, b.const(out.astype(np.float32))])], ["y"]
    plan = Plan(ctx, g)
    try:
        assert all(x.dtype == "float16" for x in node.inputs[:3] + node.outputs), node
        return plan.run(arrays)[0] / out, node.schedule
    finally:
        plan.release()


@pytest.mark.slow  # (elsewhere than NVIDIA, mma.sync emulated: seconds a case)
@pytest.mark.parametrize("copies", [True, False], ids=["cp", "regs"])
@pytest.mark.parametrize("case", list(CASES))
def test_tensor_core_kernel_in_half(case, copies):
    """attention_mma.cl's F16 form (q, k, v and y in half, mma.sync m16n8k16, fp32 accumulation) against the float64
    oracle of the same half values; K and V by cp.async and ldmatrix (KV_ASYNC, the tile's "/cp") where the head
    dims are multiples of 16, else (and with attention_async off) through registers."""
    ctx = half_context(copies)
    q, k, v, mask, attrs = make_case(case)
    q, k, v = (x.astype(np.float16).astype(np.float32) for x in (q, k, v))
    got, schedule = run_half_attention(q, k, v, mask, ctx, **attrs)
    c = [2.0 ** (np.arange(x.shape[-1]) % 3 - 1) for x in (q, k, v)]
    want = oracle(q * c[0], k * c[1], v * c[2], mask, attrs.get("scale"), attrs.get("causal", 0),
                  attrs.get("causal_offset", 0), attrs.get("softcap", 0.0))
    assert np.isfinite(got).all()
    assert rel_l2(got, want) <= 4e-3, rel_l2(got, want)
    d, dv, tq = q.shape[-1], v.shape[-1], q.shape[-2]
    mma = d % 16 == 0 and dv % 8 == 0 and tq > 8
    assert schedule["tile"].startswith("mma") == mma, schedule["tile"]
    assert schedule["tile"].endswith("/cp") == (mma and dv % 16 == 0 and copies), schedule["tile"]


@pytest.mark.parametrize("algo", ALGOS)
def test_rows_without_a_visible_key_are_zero(algo):
    """Causal with a negative offset hides every key from the first rows, a bool mask from one more: 0, no NaN."""
    rng = np.random.default_rng(3)
    q, k, v = _normal(rng, 1, 1, 6, 16), _normal(rng, 1, 1, 6, 16), _normal(rng, 1, 1, 6, 16)
    mask = np.ones((6, 6), bool)
    mask[4] = False
    got, _ = run_attention(q, k, v, mask, algo, causal=1, causal_offset=-2)
    assert np.all(got[0, 0, [0, 1, 4]] == 0) and np.all(np.abs(got[0, 0, [2, 3, 5]]) > 0)


def test_op_numpy_form_is_the_oracle():
    """Attention's numpy form (folding, the gradient checks' forward) agrees with the loop above."""
    rng = np.random.default_rng(4)
    q, k, v = _normal(rng, 2, 4, 7, 8), _normal(rng, 2, 2, 9, 8), _normal(rng, 2, 2, 9, 5)
    mask = rng.random((2, 1, 7, 9)) > 0.3
    g = Graph()
    got = Builder(g).op("Attention", [g.constant(a) for a in (q, k, v, mask)],
                        {"scale": 0.4, "causal": 1, "causal_offset": 2, "softcap": 2.0}).const
    assert rel_l2(got, oracle(q, k, v, mask, 0.4, True, 2, 2.0)) <= 1e-6


class _Dev:
    def __init__(self, kind, local_mem):
        self.kind, self.local_mem = kind, local_mem


def test_tile_shrinks_to_local_memory():
    """The table's tile where it fits; halved along BK, then BQ, where the head dims overflow a 48 KiB GPU; an
    error naming the head dims where even the smallest tile does not fit."""
    gpu = ATTENTION_TILES["gpu"]
    assert attention_tile(_Dev("gpu", 48 << 10), 64, 64) == gpu
    assert attention_tile(_Dev("gpu", 48 << 10), 64, 64, tq=1) == AttentionTile(1, 64, 1, 64)
    assert attention_tile(_Dev("gpu", 48 << 10), 64, 64, tq=5) == AttentionTile(8, 64, 1, 64)
    assert attention_tile(_Dev("gpu", 48 << 10), 64, 64, tq=9) == gpu
    big = attention_tile(_Dev("gpu", 48 << 10), 256, 256)
    assert attention_tile(_Dev("gpu", 48 << 10), 256, 256, tq=1) == big  # (the decoding tile does not fit)
    assert big.local_bytes(256, 256) <= 48 << 10 and (big.bq, big.bk) != (gpu.bq, gpu.bk)
    assert (big.ntr, big.ntc) == (gpu.ntr, gpu.ntc) and big.bq % big.ntr == 0 and big.bk % big.ntc == 0
    tiles = {"gpu": replace(gpu, bq=64, bk=64)}
    assert attention_tile(_Dev("gpu", 48 << 10), 128, 128, tiles) == AttentionTile(32, 32, gpu.ntr, gpu.ntc)
    with pytest.raises(ModelError, match="head dims 4096 / 4096"):
        attention_tile(_Dev("gpu", 48 << 10), 4096, 4096)


@pytest.mark.parametrize("splits", [32, 2, 1])
@pytest.mark.parametrize("case", ["one-key", "decode-one-query-gqa-mask", "decode-3-rows-causal-d128",
                                  "decode-gpt2-step", "decode-causal-splits-unseen", "decode-hidden-row-dv48"])
def test_decode_tile_matches_float64(case, splits):
    """attention.cl with the decoding tile (a few query rows: one row of 64 work-items over 64 keys), on the test
    device (PoCL: the GPU kernel through the portable core); its key tiles split over up to `splits` work-groups per
    head (Options.attention_decode_splits, runs of whole tiles, the last to finish merging them), or streamed by one;
    the plan run three times. A causal step whose last splits see no key, a row a bool mask hides whole (0), dv
    apart from d."""
    qs, hk, tk, dv, mask_spec, attrs = DECODE_CASES.get(case) or CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    lead = qs[:-3] + (hk,)
    q, k, v = _normal(rng, *qs), _normal(rng, *(lead + (tk, qs[-1]))), _normal(rng, *(lead + (tk, dv or qs[-1])))
    mask = None
    if mask_spec:
        mask = rng.random(mask_spec[0]) > 0.4
        mask.reshape(-1, mask.shape[-1])[0] = False
    ctx = algo_context("flash").with_options(attention_decode_splits=splits)
    qs2 = [_normal(rng, *qs) for _ in range(2)]  # (the same plan again: the splits' counts start at 0 each run)
    gots, schedule = run_attention(q, k, v, mask, "flash", ctx=ctx, more_q=qs2, **attrs)
    for qi, got in zip([q] + qs2, gots, strict=True):
        want = oracle(qi, k, v, mask, None, attrs.get("causal", 0), attrs.get("causal_offset", 0), 0.0)
        assert np.isfinite(got).all() and rel_l2(got, want) <= 2e-6, rel_l2(got, want)
    tiles = -(-tk // 64)  # (the tile: 64 keys a tile, then the splits where there are several)
    want_splits = -(-tiles // -(-tiles // min(tiles, splits)))
    assert schedule["tile"].endswith("x64/1x64" + (f"/s{want_splits}" if want_splits > 1 else "")), schedule["tile"]


DECODE_CASES = {
    "decode-3-rows-causal-d128": ((1, 2, 3, 128), 2, 70, None, None, {"causal": 1, "causal_offset": 67}),
    "decode-gpt2-step": ((1, 12, 1, 64), 12, 136, None, None, {}),  # (bench/gpu_decode.py's: 3 tiles of keys)
    "decode-causal-splits-unseen": ((2, 4, 2, 32), 2, 300, None, None, {"causal": 1, "causal_offset": 90}),
    "decode-hidden-row-dv48": ((2, 2, 1, 64), 2, 200, 48, ((2, 1, 1, 200), "bool"), {}),
}


def test_mask_strides_broadcast():
    class V:
        def __init__(self, shape):
            self.shape, self.rank = shape, len(shape)
    assert mask_strides(V((2, 1, 5, 7)), (2, 3, 5, 7)) == [35, 0, 7, 1]
    assert mask_strides(V((5, 7)), (2, 3, 5, 7)) == [0, 0, 7, 1]
    assert mask_strides(V((2, 1, 1, 7)), (2, 3, 5, 7)) == [7, 0, 0, 1]
    assert mask_strides(V((3, 5, 1)), (2, 3, 5, 7)) == [0, 5, 1, 0]


# id: (q logical [B, Hq, Tq, D], k heads, Tk, the layouts of q, k, v, y, attrs)
LAYOUT_CASES = {
    "bthd-t37-d32": ((2, 3, 37, 32), 3, 37, ("bthd",) * 4, {}),
    "mixed-gqa-causal-d64": ((2, 4, 21, 64), 2, 30, ("tbhd", "bthd", "hbtd", "thbd"),
                             {"causal": 1, "causal_offset": 9}),
    "bthd-decode-d80": ((3, 2, 2, 80), 2, 41, ("bthd", "bhtd", "bthd", "bthd"), {}),
}


@pytest.mark.parametrize("case,algo", [(c, "flash_cpu") for c in LAYOUT_CASES] + [("bthd-t37-d32", "flash")] + [
    pytest.param(c, "flash", marks=pytest.mark.slow) for c in list(LAYOUT_CASES)[1:]])
def test_layouts_match_float64(case, algo):
    """q, k, v read and y written through the strides of their layouts (a [B, T, H, D] operand in place): the
    logical result equals the oracle's, on both kernels. (The GPU kernel's first case runs in the quick suite.)"""
    qs, hk, tk, layout, attrs = LAYOUT_CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    b, hq, tq, d = qs
    logical = [_normal(rng, *qs), _normal(rng, b, hk, tk, d), _normal(rng, b, hk, tk, d)]
    stored = [np.ascontiguousarray(x.transpose(to_stored(s))) for x, s in zip(logical, layout)]
    got, schedule = run_attention(*stored, None, algo, layout=layout, **attrs)
    want = oracle(*logical, None, None, attrs.get("causal", 0), attrs.get("causal_offset", 0))
    assert got.shape == want.transpose(to_stored(layout[3])).shape
    assert rel_l2(got.transpose(to_logical(layout[3])), want) <= 2e-6
    assert schedule["algo"] == algo


@pytest.mark.slow  # (elsewhere than NVIDIA, mma.sync emulated: seconds a case)
@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_tensor_core_kernel_layouts(case):
    """attention_mma.cl reads q, k, v and writes y through their layouts' strides, as attention.cl does."""
    qs, hk, tk, layout, attrs = LAYOUT_CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    b, hq, tq, d = qs
    logical = [_normal(rng, *qs), _normal(rng, b, hk, tk, d), _normal(rng, b, hk, tk, d)]
    stored = [np.ascontiguousarray(x.transpose(to_stored(s))) for x, s in zip(logical, layout)]
    got, schedule = run_attention(*stored, None, "flash", ctx=tensor_core_context("tf32"), layout=layout, **attrs)
    want = oracle(*logical, None, None, attrs.get("causal", 0), attrs.get("causal_offset", 0))
    assert rel_l2(got.transpose(to_logical(layout[3])), want) <= 5e-3
    assert schedule["tile"].startswith("mma") == schedule["tile"].endswith("/cp") == (tq > 8), schedule["tile"]


@pytest.mark.slow  # (elsewhere than NVIDIA, mma.sync emulated: seconds a case)
@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_tensor_core_kernel_layouts_in_half(case):
    """... and in half, K and V by cp.async from rows strided by the layouts (one 16-byte aligned row each)."""
    ctx = half_context(True)
    qs, hk, tk, layout, attrs = LAYOUT_CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    b, hq, tq, d = qs
    logical = [x.astype(np.float16).astype(np.float32)
               for x in (_normal(rng, *qs), _normal(rng, b, hk, tk, d), _normal(rng, b, hk, tk, d))]
    stored = [np.ascontiguousarray(x.transpose(to_stored(s))) for x, s in zip(logical, layout)]
    got, schedule = run_half_attention(*stored, None, ctx, layout=layout, **attrs)
    c = 2.0 ** (np.arange(d) % 3 - 1)
    want = oracle(*(x * c for x in logical), None, None, attrs.get("causal", 0), attrs.get("causal_offset", 0))
    assert rel_l2(got.transpose(to_logical(layout[3])), want) <= 4e-3
    assert schedule["tile"].endswith("/cp") == (tq > 8)
