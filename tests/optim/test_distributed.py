"""Data-parallel training without MPI: the buckets, the reduction and Trainer(comm=...) on ranks that are threads of
this process, talking through a fake communicator (the 2-process MPI job: tests/cli/test_train_mpi.py)."""
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dlnet
from dlnet import allreduce, distributed, sync_bn
from tests.conftest import rel_l2


class ThreadGroup:
    """Ranks as threads: each collective is numbered in the order a rank calls it (every rank calls them in the
    same order, as MPI requires) and sums in rank order. `log` has rank 0's collectives: (kind, elements)."""

    def __init__(self, size, shared=False, hosts=None):
        # shared: the ranks say they share a host (Trainer's "auto" transport then takes shared memory); hosts: the
        # host of each rank, where they say they are on several (split_host's communicators follow it)
        self.size, self.slots, self.log, self.shared = size, {}, [], shared
        self.hosts = list(hosts) if hosts is not None else [0] * size
        self.cond = threading.Condition()
        self.children = {}

    def child(self, key, size):
        """The group of a communicator split_host or dup made (every rank that is in it gets the same one)."""
        with self.cond:
            return self.children.setdefault(key, ThreadGroup(size, shared=True))

    def comms(self):
        return [FakeComm(self, r) for r in range(self.size)]

    def put(self, key, rank, obj):
        with self.cond:
            self.slots.setdefault(key, {})[rank] = obj
            self.cond.notify_all()

    def ready(self, key):
        with self.cond:
            return len(self.slots[key]) == self.size

    def gather(self, key):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.slots[key]) == self.size, timeout=60), f"collective {key}"
            return [self.slots[key][r] for r in range(self.size)]

    def exchange(self, key, rank, obj):
        self.put(key, rank, obj)
        return self.gather(key)

    def run(self, fn):
        """fn(comm) on every rank in its thread; their results in rank order (a rank's exception is raised)."""
        dlnet.devices()  # the OpenCL platforms listed once first: two threads' first listing at once can find none
        results, errors = [None] * self.size, [None] * self.size

        def body(comm):
            try:
                results[comm.rank] = fn(comm)
            except BaseException as e:  # noqa: BLE001 (handed to the test's thread)
                errors[comm.rank] = e

        threads = [threading.Thread(target=body, args=(c,)) for c in self.comms()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for e in errors:
            if e is not None:
                raise e
        return results


class FakeRequest:
    """Complete once every rank has contributed (Test: without waiting; Wait: waiting)."""

    def __init__(self, group, key, done):
        self.group, self.key, self.done, self.finished = group, key, done, False

    def Test(self):  # noqa: N802
        if not self.finished and self.group.ready(self.key):
            self.Wait()
        return self.finished

    def Wait(self):  # noqa: N802
        if not self.finished:
            self.done(self.group.gather(self.key))
            self.finished = True


class FakeComm:
    def __init__(self, group, rank):
        self.group, self.rank, self.size, self.calls = group, rank, group.size, 0

    def same_host(self):
        return self.group.shared and len(set(self.group.hosts)) == 1

    def split_host(self):
        self.calls += 1
        hosts = self.group.hosts
        mine = [r for r in range(self.size) if hosts[r] == hosts[self.rank]]
        firsts = sorted(hosts.index(h) for h in set(hosts))
        local = FakeComm(self.group.child(("host", self.calls, hosts[self.rank]), len(mine)), mine.index(self.rank))
        leaders = (FakeComm(self.group.child(("first ranks", self.calls), len(firsts)), firsts.index(self.rank))
                   if self.rank in firsts else None)
        return local, leaders

    def dup(self):
        self.calls += 1
        return FakeComm(self.group.child(("dup", self.calls), self.size), self.rank)

    def free(self):
        return None

    def _key(self, kind, n):
        self.calls += 1
        if self.rank == 0:
            self.group.log.append((kind, n))
        return self.calls

    def iallreduce(self, buf):
        key = self._key("iallreduce", buf.size)
        self.group.put(key, self.rank, buf.copy())

        def done(parts):
            total = parts[0].copy()
            for p in parts[1:]:
                total += p
            buf[:] = total
        return FakeRequest(self.group, key, done)

    def iallgather(self, send, recv):
        key = self._key("iallgather", send.size)
        self.group.put(key, self.rank, send.copy())

        def done(parts):
            recv[:] = np.stack(parts)
        return FakeRequest(self.group, key, done)

    def ibarrier(self):
        key = self._key("ibarrier", 0)
        self.group.put(key, self.rank, None)
        return FakeRequest(self.group, key, lambda parts: None)

    def barrier(self):
        self.ibarrier().Wait()

    def bcast(self, obj, root=0):
        return self.group.exchange(self._key("bcast", 0), self.rank, obj)[root]

    def allgather(self, obj):
        return self.group.exchange(self._key("allgather", 0), self.rank, obj)


def test_buckets_follow_readiness_and_the_cap():
    grads = [("a", 400, 9), ("b", 40, 2), ("c", 400, 5), ("d", 4000, 7), ("e", 40, 2)]
    assert distributed.make_buckets(grads, 500) == [[1, 4, 2], [3], [0]]
    assert distributed.make_buckets(grads, 10 ** 6) == [[1, 4, 2, 3, 0]]
    assert distributed.make_buckets(grads, 1) == [[1], [4], [2], [3], [0]]


@pytest.mark.parametrize("fp16", [False, True])
def test_reducer_averages_alike_on_every_rank(fp16):
    rng = np.random.default_rng(3)
    grads = [[rng.standard_normal(n).astype(np.float32) for n in (7, 300)] for _ in range(3)]

    def rank(comm):
        reducer = allreduce.GradientReducer(comm, [7, 300], fp16=fp16)
        for k in (0, 1):
            reducer.host[k][:] = grads[comm.rank][k]
            reducer.start(k)
        reducer.poll()
        for k in (0, 1):
            reducer.finish(k)
        return reducer.host

    out = ThreadGroup(3).run(rank)
    for k in (0, 1):
        assert np.array_equal(out[0][k], out[1][k]) and np.array_equal(out[0][k], out[2][k])
        parts = [g[k].astype(np.float16).astype(np.float32) if fp16 else g[k] for g in grads]
        expected = (parts[0] + parts[1] + parts[2]) * np.float32(1 / 3)  # fp32, in rank order
        assert np.array_equal(out[0][k], expected)
        exact = np.mean([g[k].astype(np.float64) for g in grads], axis=0)
        assert rel_l2(out[0][k], exact) <= (1e-3 if fp16 else 1e-6)


@pytest.mark.parametrize("transport", ["shm", "shm-device", "shm-mpi"])
def test_shared_memory_reducers_average_alike_on_every_rank(monkeypatch, transport):
    """Three ranks (threads, each its own CPU context) copy two buckets from the device into their slots (the second
    from two places of the buffer), and write() leaves the same average, summed in rank order, in those places on
    every rank: summed on host threads in chunks, or on the device, or ("shm-mpi", ranks 0 and 1 on one host, rank 2
    on another) by each host's first rank, whose sums the communicator adds: (g0 + g1) + g2, the same bits."""
    monkeypatch.setattr(allreduce, "SUM_CHUNK", 64)  # (several threads' chunks, each in several blocks)
    monkeypatch.setattr(allreduce, "SUM_BLOCK", 48)
    rng = np.random.default_rng(5)
    grads = [rng.standard_normal(7 + 1000).astype(np.float32) for _ in range(3)]
    rows = [[(0, 0, 7)], [(7, 0, 400), (407, 400, 600)]]  # (element offset in buf, element in the bucket, elements)

    def rank(comm):
        ctx = dlnet.Context("cpu")
        buf = ctx.alloc(4 * grads[0].size)
        ctx.upload(buf, grads[comm.rank])
        reducer = allreduce.make_reducer(comm, [7, 1000], ctx, transport=transport, threads=3)
        assert reducer.transport == transport
        for k in (0, 1):
            for off, at, n in rows[k]:
                event = reducer.read(ctx.copy_queue, k, at, buf, off, n)
        event.wait()
        for k in (0, 1):
            reducer.start(k)
        for k in (1, 0):
            reducer.write(k, [(buf, off, at, n) for off, at, n in rows[k]], ctx.queue)
        out = np.empty_like(grads[0])
        ctx.download(buf, out)
        reducer.close()
        ctx.free(buf)
        return out

    out = ThreadGroup(3, shared=True, hosts=[0, 0, 1] if transport == "shm-mpi" else None).run(rank)
    whole = (grads[0] + grads[1] + grads[2]) * np.float32(1 / 3)  # fp32, in rank order
    for r in (0, 1, 2):
        assert np.array_equal(out[r], whole), r


def test_shared_memory_that_cannot_be_made_falls_back_to_mpi(monkeypatch, tmp_path):
    """Where the segment cannot be made (here: no such folder), "auto" warns and reduces through the communicator;
    "shm" is an error on every rank."""
    monkeypatch.setattr(allreduce, "SHARED_DIR", str(tmp_path / "absent"))

    def rank(comm, transport):
        ctx = dlnet.Context("cpu")
        if transport == "shm":
            with pytest.raises(dlnet.errors.DeviceError, match="rank 0 could not reserve .*absent"):
                allreduce.make_reducer(comm, [10], ctx, transport="shm")
            return None
        return type(allreduce.make_reducer(comm, [10], ctx, transport="auto"))

    with pytest.warns(UserWarning, match="averaging the gradients through MPI instead"):  # (the threads' warnings)
        assert ThreadGroup(2, shared=True).run(lambda c: rank(c, "auto")) == [allreduce.GradientReducer] * 2
    assert ThreadGroup(2, shared=True).run(lambda c: rank(c, "shm")) == [None] * 2


def test_auto_transport_sums_on_the_device_of_a_gpu_and_on_the_host_of_the_cpu_device():
    """One host, fp32: "auto" is "shm-device" where the device is a GPU (its kernels sum; 97% scaling on 2 H200s
    against 90%/75% summed on the host), "shm" on the CPU device, and "mpi" with fp16 gradients."""
    def rank(comm, gpu, fp16=False):
        ctx = dlnet.Context("cpu")
        if gpu:
            ctx.is_cpu = False  # what Device.resolve reads: a GPU's choice, on PoCL's buffers
        reducer = allreduce.make_reducer(comm, [10, 300], ctx, fp16=fp16, transport="auto")
        transport = reducer.transport
        reducer.close()
        return transport

    assert ThreadGroup(2, shared=True).run(lambda c: rank(c, gpu=True)) == ["shm-device"] * 2
    assert ThreadGroup(2, shared=True).run(lambda c: rank(c, gpu=False)) == ["shm"] * 2
    assert ThreadGroup(2, shared=True).run(lambda c: rank(c, gpu=True, fp16=True)) == ["mpi"] * 2


def test_four_ranks_on_two_hosts_train_as_one_process(tmp_path):
    """"shm-mpi": ranks 0-1 and 2-3 say they are on two hosts; each host sums its ranks' gradients through its own
    segment, the hosts' first ranks add the two sums through the communicator (one all-reduce per bucket, of the
    bucket's size, from 2 of the 4 ranks), and every rank ends with the weights of one process on the whole batch."""
    data = batches(5)
    path = mlp(tmp_path / "m.onnx", 0)
    one_losses, one_weights, _ = train(path, None, data)
    group = ThreadGroup(4, shared=True, hosts=[0, 0, 1, 1])
    out = group.run(lambda comm: train(path, comm, data, "shm-mpi", bucket_mb=1e-6))
    plan = out[0][2]
    assert plan.timing["transport"] == "shm-mpi" and len(plan.timing["bucket_bytes"]) == 4
    for losses, weights, _ in out[1:]:
        assert losses == out[0][0]
        for name in one_weights:
            assert np.array_equal(weights[name], out[0][1][name]), name
    for name in one_weights:
        assert rel_l2(out[0][1][name], one_weights[name]) <= 1e-5, name
    assert rel_l2(np.array(out[0][0]), np.array(one_losses)) <= 1e-6
    assert not [k for k, n in group.log if k in ("iallreduce", "iallgather") and n > 1]  # (the world's: the loss)
    leaders = [g for key, g in group.children.items() if key[0] == "first ranks"]
    assert len(leaders) == 1  # one all-reduce per bucket and step between the hosts
    assert sorted(n for k, n in leaders[0].log if k == "iallreduce") == sorted([5, 16, 80, 192] * len(data))


def test_check_same_names_the_rank_that_differs():
    w = {"w": np.linspace(0, 1, 10, dtype=np.float32)}
    assert ThreadGroup(3).run(lambda comm: distributed.check_same(comm, w, "here")) == [None] * 3
    nudged = {"w": w["w"].copy()}
    nudged["w"][4] = np.nextafter(nudged["w"][4], np.float32(2))

    def rank(comm):
        with pytest.raises(distributed.RanksDiverged, match="here: the weights of rank 2 differ from rank 0's"):
            distributed.check_same(comm, nudged if comm.rank == 2 else w, "here")
        return True
    assert ThreadGroup(3).run(rank) == [True] * 3


def mlp(path, seed, batchnorm=False):
    """x [n, 12] -> Gemm 12x16 -> (BatchNormalization) -> Tanh -> Gemm 16x5."""
    rng = np.random.default_rng(seed)
    init = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.3, n)
            for n, s in (("w1", (12, 16)), ("b1", (16,)), ("w2", (16, 5)), ("b2", (5,)))]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"])]
    act = "h"
    if batchnorm:
        init += [numpy_helper.from_array(a, n) for n, a in (
            ("g", np.ones(16, np.float32)), ("beta", np.zeros(16, np.float32)), ("mean", np.zeros(16, np.float32)),
            ("var", np.ones(16, np.float32)))]
        nodes += [helper.make_node("Unsqueeze", ["h", "axes"], ["h4"]),
                  helper.make_node("BatchNormalization", ["h4", "g", "beta", "mean", "var"], ["n4"]),
                  helper.make_node("Squeeze", ["n4", "axes"], ["n"])]
        init.append(numpy_helper.from_array(np.array([2, 3], np.int64), "axes"))
        act = "n"
    nodes += [helper.make_node("Tanh", [act], ["t"]), helper.make_node("Gemm", ["t", "w2", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])], init)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8), str(path))
    return str(path)


def batches(steps, batch=16, seed=7):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 12)).astype(np.float32), rng.integers(0, 5, batch)) for _ in range(steps)]


def train(path, comm, data, transport="auto", **kw):
    """Steps on this rank's half of each batch (the whole batch on one process): (losses, weights, trainer's plan)."""
    rank, size = (comm.rank, comm.size) if comm is not None else (0, 1)
    ctx = dlnet.Context("cpu", options=dlnet.Options.from_env().replace(gradient_transport=transport))
    with dlnet.Net(ctx).load_onnx(path) as net:
        trainer = dlnet.Trainer(net, optimizer=dlnet.optim.Adam(lr=1e-2), comm=comm, **kw)
        losses = []
        for x, y in data:
            n = len(x) // size
            losses.append(trainer.step({"x": x[rank * n:(rank + 1) * n], "target": y[rank * n:(rank + 1) * n]}))
        trainer.check_weights()
        return losses, net.state_dict(), trainer._active


@pytest.mark.parametrize("fp16,shared,transport", [(False, False, "auto"), (True, False, "auto"),
                                                    (False, True, "auto"), (False, True, "shm-device")])
def test_two_thread_ranks_train_as_one_process(tmp_path, fp16, shared, transport):
    """Rank 1 starts from other weights and gets rank 0's; every step's loss and the final weights are those of one
    process on the whole batch; one bucket per gradient (bucket_mb tiny) in reverse layer order. shared: the ranks
    share a host, so the gradients go through a shared-memory segment (summed on the host, or with "shm-device" on
    the device), not the communicator's all-reduce."""
    data = batches(6)
    path0, path1 = mlp(tmp_path / "m0.onnx", 0), mlp(tmp_path / "m1.onnx", 1)
    one_losses, one_weights, _ = train(path0, None, data)
    group = ThreadGroup(2, shared=shared)
    out = group.run(lambda comm: train(path0 if comm.rank == 0 else path1, comm, data, transport, bucket_mb=1e-6,
                                       fp16_gradients=fp16))
    (l0, w0, plan), (l1, w1, _) = out
    assert plan.timing["transport"] == ("mpi" if not shared else "shm" if transport == "auto" else transport)
    assert l0 == l1
    for name in one_weights:
        assert np.array_equal(w0[name], w1[name]), name
        assert rel_l2(w0[name], one_weights[name]) <= (2e-3 if fp16 else 1e-5), name
    assert rel_l2(np.array(l0), np.array(one_losses)) <= (1e-3 if fp16 else 1e-6)
    names = [plan.params[rows_at][0] for rows_at in range(len(plan.params))]
    order = [[names[i] for i in b] for b in distributed.make_buckets(
        [(n, gv.nbytes, plan.plan.node_launches[plan.graph.nodes.index(gv.producer)][1])
         for n, _, gv in plan.params], 1)]
    assert order[0][0] in ("b2", "w2") and order[-1][0] in ("w1", "b1")  # the last layer's gradients first
    sizes = {"w1": 192, "b1": 16, "w2": 80, "b2": 5}
    if shared:  # the buckets, in that order; nothing summed by the communicator
        assert [b // 4 for b in plan.timing["bucket_bytes"]] == [sizes[b[0]] for b in order]
        assert not [k for k, n in group.log if k in ("iallreduce", "iallgather") and n > 1]  # (the loss: 1)
        return
    kind = "iallgather" if fp16 else "iallreduce"
    step = [n for k, n in group.log if k == kind][:4]
    assert step == [sizes[b[0]] for b in order]


def test_combined_statistics_are_the_global_batch_s():
    rng = np.random.default_rng(11)
    parts = [rng.standard_normal((n, 3)) * s + m for n, s, m in ((5, 0.5, 2.0), (9, 2.0, -1.0), (4, 1.0, 0.0))]
    whole = np.concatenate(parts)
    total, mean, var = sync_bn.combine_statistics([len(p) for p in parts], [p.mean(0) for p in parts],
                                                  [p.var(0) for p in parts])
    assert total == 18
    assert rel_l2(mean, whole.mean(0)) <= 1e-12 and rel_l2(var, whole.var(0)) <= 1e-12
    sums = rng.standard_normal((3, 4))
    assert rel_l2(sync_bn.combine_gradient_sums(sums, 5, 18), sums.sum(0) * 5 / 18) <= 1e-15


def shifted_batches(steps, batch=16, seed=7):
    """batches() whose two halves differ: the first half's features centred at +1.5 and narrow, the second's at -1
    and wide, so each half's BatchNorm statistics are far from the whole batch's."""
    out = []
    for x, y in batches(steps, batch, seed):
        x = x.copy()
        x[:batch // 2] = x[:batch // 2] * 0.5 + 1.5
        x[batch // 2:] = x[batch // 2:] * 2.0 - 1.0
        out.append((x, y))
    return out


def test_sync_bn_trains_two_ranks_as_one_process_on_the_global_batch(tmp_path):
    """Ranks as threads whose halves of each batch have different statistics: with sync_bn the losses, the trained
    weights and the running statistics are one process's on the whole batch, identical on both ranks; without it
    they are not. (The 2-process MPI job: tests/cli/test_train_mpi.py.)"""
    path = mlp(tmp_path / "bn.onnx", 0, batchnorm=True)
    data = shifted_batches(5)
    # b1, added just before the BatchNorm, has a gradient of rounding noise only, which Adam would scale up to lr
    one_losses, one_weights, _ = train(path, None, data, frozen=["b1"])

    def ranks(sync):
        return ThreadGroup(2).run(lambda comm: train(path, comm, data, sync_bn=sync, bucket_mb=1e-6, frozen=["b1"]))

    (l0, w0, plan), (l1, w1, _) = ranks(True)
    assert l0 == l1
    assert [len(p.layers) for p in plan.bn_sync.points] == [1, 1]  # the forward's and the backward's
    assert rel_l2(np.array(l0), np.array(one_losses)) <= 1e-5
    for name in one_weights:
        assert np.array_equal(w0[name], w1[name]), name
        assert rel_l2(w0[name], one_weights[name]) <= 1e-5, name
    (local, lw, _), _ = ranks(False)
    assert rel_l2(np.array(local), np.array(one_losses)) > 1e-3
    assert rel_l2(lw["w1"], one_weights["w1"]) > 1e-3 and rel_l2(lw["var"], one_weights["var"]) > 1e-3


@pytest.mark.parametrize("shared", [False, True])
def test_buckets_are_staged_in_pinned_host_memory(tmp_path, shared):
    """Each bucket's host buffer is a mapped ALLOC_HOST_PTR buffer (Context.pinned), the average lands in it, and
    every rank's average is the mean of the ranks' gradients (through MPI's all-reduce, or shared memory)."""
    from dlnet.kernels.runtime import cl
    path = mlp(tmp_path / "m.onnx", 0)
    x, y = batches(1)[0]

    def rank(comm):
        with dlnet.Net(dlnet.Context("cpu")).load_onnx(path) as net:
            trainer = dlnet.Trainer(net, optimizer=dlnet.optim.SGD(lr=0.0), comm=comm, bucket_mb=1e-6)
            trainer.step({"x": x[comm.rank * 8:(comm.rank + 1) * 8], "target": y[comm.rank * 8:(comm.rank + 1) * 8]})
            plan = trainer._active
            return [h.copy() for h in plan.reducer.host], [isinstance(h.base, cl.MemoryMap) for h in plan.reducer.host]

    (h0, pinned0), (h1, _) = ThreadGroup(2, shared=shared).run(rank)
    assert pinned0 == [True] * 4
    with dlnet.Net(dlnet.Context("cpu")).load_onnx(path) as net:  # the whole batch's gradients on one process
        trainer = dlnet.Trainer(net, optimizer=dlnet.optim.SGD(lr=0.0))
        trainer.step({"x": x, "target": y})
        plan = trainer._active
        whole = {n: plan.download(trainer.ctx, gv).reshape(-1) for n, _, gv in plan.params}
        order = [[plan.params[i][0] for i in b] for b in distributed.make_buckets(
            [(n, gv.nbytes, plan.plan.node_launches[plan.graph.nodes.index(gv.producer)][1])
             for n, _, gv in plan.params], 1)]
    for k, names in enumerate(order):
        assert np.array_equal(h0[k], h1[k])
        assert rel_l2(h0[k], whole[names[0]]) <= 1e-5, names
