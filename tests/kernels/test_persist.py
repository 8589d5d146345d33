"""A run's launches as one persistent kernel on a CPU device with several workers (dlnet/kernels/persist.py): each
launch's program becomes a function of one program, its work-groups claimed through counters, layer after layer.
Checked against the same launches run one by one and against onnx's reference evaluator, over several runs (the
counters start again at zero each time)."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.kernels import persist
from dlnet.kernels.launch import Launch, PendingKernel
from dlnet.kernels.runtime import cl

from ..conftest import context, make_model, reference, rel_l2


def cpu_workers():
    ctx = context()
    if not ctx.is_cpu or ctx.device.max_compute_units < 2:
        pytest.skip("persistent kernels run on CPU devices of several workers")
    return ctx


def small_cnn(rng):
    """Convolutions (3x3, 1x1, strided), pools, a concat, a Gemm and a softmax: 15-20 CPU launches."""
    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2"], ["s"]),
             helper.make_node("Relu", ["s"], ["rs"]),
             helper.make_node("Conv", ["rs", "w3"], ["e1"]),
             helper.make_node("Conv", ["rs", "w4"], ["e3"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["e1", "e3"], ["cat"], axis=1),
             helper.make_node("Relu", ["cat"], ["rc"]),
             helper.make_node("Conv", ["rc", "w5"], ["c5"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c5"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
             helper.make_node("Softmax", ["logits"], ["y"])]
    inits = {"w1": w(24, 3, 3, 3), "b1": w(24), "w2": w(16, 24, 1, 1), "w3": w(32, 16, 1, 1), "w4": w(32, 16, 3, 3),
             "w5": w(48, 64, 3, 3), "wf": w(10, 48), "bf": w(10)}
    return make_model(nodes, {"x": ("float32", (1, 3, 33, 33))}, ["y"], inits)


@pytest.mark.parametrize("piece", [None, 4])
def test_a_cnn_runs_as_persistent_kernels(monkeypatch, piece):
    """As one persistent launch, or (pieces of at most 4 launches) as several in a row."""
    ctx = cpu_workers()
    if piece is not None:
        monkeypatch.setattr(persist, "PIECE", piece)
    rng = np.random.default_rng(0)
    model = small_cnn(rng)
    merged = dlnet.Net(ctx.with_options(cpu_persistent_min=2)).load_onnx(model)
    alone = dlnet.Net(ctx.with_options(cpu_persistent=False)).load_onnx(model)
    for _ in range(4):  # (fresh inputs each run: the counters must be back at zero; the first runs one by one)
        x = rng.standard_normal((1, 3, 33, 33)).astype(np.float32)
        got, want = merged.run({"x": x})["y"], alone.run({"x": x})["y"]
        assert rel_l2(got, want) < 1e-6
        assert rel_l2(got, reference(model, {"x": x})[0]) < 1e-5
    plan = merged._last
    persistent = [la for la in plan.run_list if la.layer == "persistent"]
    assert persistent and len(plan.run_list) < len(plan.launches)
    sizes = [int(la.label.rsplit("(", 1)[1].split()[0]) for la in persistent]
    assert len(persistent) == 1 if piece is None else max(sizes) <= piece and len(persistent) >= 2
    assert sum(1 for la in plan.launches if persist.mergeable(la)) >= 8
    assert len(alone._last.run_list) == len(alone._last.launches)


FIRST = """#define SCALE 2
typedef float4 __attribute__((aligned(4))) f4u;
inline float twice(float v) { return SCALE * v; }
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void first(__global float* y, ulong y_off, __global const float* x, ulong x_off, __constant const int* meta, int n) {
    __local float tmp[STAGE];
    const int i = get_global_id(0) + get_global_size(0) * get_global_id(1);
    tmp[i % STAGE] = x[x_off + i];
    if (i < n) y[y_off + i] = twice(tmp[i % STAGE]) + meta[i % 3];
}
"""
SECOND = """#define SCALE 3
inline float twice(float v) { return SCALE * v + 1.0f; }
__kernel void second(__global float* z, ulong z_off, __global const float* y, ulong y_off, float c) {
    const int i = get_global_id(0), n = get_global_size(0);
    z[z_off + i] = twice(y[y_off + i]) * c + y[y_off + (i + 7) % n];  // (another work-group's value, layer before)
}
"""


def _launch(ctx, source, name, args, gsize, lsize):
    pending = PendingKernel(source, name)
    pending.set_args(*args)
    return Launch(pending.bind(ctx), gsize, lsize, name, pending=pending)


def test_programs_become_functions_of_one_kernel():
    """Two programs defining the same helper differently, a typedef, a __local array sized by a define, a __constant
    table, grids of one and two dimensions, local size 1 and none: as one persistent launch, the same values as the
    launches one by one, run after run."""
    ctx = cpu_workers()
    rng = np.random.default_rng(1)
    x = rng.standard_normal(80).astype(np.float32)
    meta = np.array([5, -1, 2], np.int32)
    xb, mb = (cl.Buffer(ctx.cl, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=a) for a in (x, meta))
    arena = cl.Buffer(ctx.cl, cl.mem_flags.READ_WRITE, 4 * 400)
    first = "#define STAGE 16\n" + FIRST
    launches = [_launch(ctx, first, "first", [arena, np.uint64(0), xb, np.uint64(3), mb, np.int32(65)], (13, 5),
                        (1, 1)),
                _launch(ctx, SECOND, "second", [arena, np.uint64(100), arena, np.uint64(0), np.float32(0.5)], (65,),
                        None),
                _launch(ctx, first, "first", [arena, np.uint64(200), arena, np.uint64(100), mb, np.int32(60)],
                        (65, 1), (1, 1)),
                _launch(ctx, SECOND, "second", [arena, np.uint64(300), arena, np.uint64(200), np.float32(-2.0)],
                        (60,), None)]
    assert all(persist.mergeable(la) for la in launches)
    ctx2 = ctx.with_options(cpu_persistent_min=2)
    counters = cl.Buffer(ctx.cl, cl.mem_flags.READ_WRITE, persist.counters_bytes(ctx2, launches))
    cl.enqueue_fill_buffer(ctx.queue, counters, np.int32(0), 0, counters.size)
    merged = persist.persistent_launches(ctx2, launches, counters)
    assert len(merged) == 1 and merged[0].gsize == (ctx.device.max_compute_units,)

    def arena_after(run):
        cl.enqueue_fill_buffer(ctx.queue, arena, np.float32(np.nan), 0, 4 * 400)
        for la in run:
            la.enqueue(ctx.queue)
        out = np.empty(400, np.float32)
        cl.enqueue_copy(ctx.queue, out, arena)
        return out
    want = arena_after(launches)
    y = 2 * x[3:68] + meta[np.arange(65) % 3]
    assert np.allclose(want[:65], y) and np.allclose(want[100:165], (3 * y + 1) * 0.5 + np.roll(y, -7))
    for _ in range(3):
        got = arena_after(merged)
        assert np.array_equal(got, want, equal_nan=True)


def test_what_stays_a_launch_of_its_own():
    ctx = context()
    plain = PendingKernel("__kernel void k(__global float* y) { y[get_global_id(0)] = 1.0f; }", "k")
    plain.set_args(cl.Buffer(ctx.cl, cl.mem_flags.READ_WRITE, 64))
    synced = PendingKernel("__kernel void k(__global float* y) { barrier(CLK_LOCAL_MEM_FENCE); }", "k")
    synced.set_args(plain.args[0])
    local = PendingKernel(plain.key[0], "k")
    local.set_args(cl.LocalMemory(64))
    assert persist.mergeable(Launch(None, (4,), (1,), pending=plain))
    assert persist.mergeable(Launch(None, (4,), None, pending=plain))
    assert not persist.mergeable(Launch(None, (4,), (4,), pending=plain))  # (work-groups of several work-items)
    assert not persist.mergeable(Launch(None, (4,), None, pending=synced))  # (a barrier under a local size PoCL picks)
    assert persist.mergeable(Launch(None, (4,), (1,), pending=synced))  # (one work-item: the barrier is void)
    assert not persist.mergeable(Launch(None, (4,), (1,), pending=local))
    assert not persist.mergeable(Launch(None, (4,), (1,), wait=(0, 0), pending=plain))  # (waits for its input's chunk)
    assert not persist.mergeable(Launch(None, (4,), (1,)))  # (no program text: bound elsewhere)
