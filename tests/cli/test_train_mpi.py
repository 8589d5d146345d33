"""`dlnet train` data-parallel over MPI on the CPU device: a 2-rank job on the digits config against one process with
the same global batch, and --resume with another number of processes. Skips without the `mpi` extra."""
import os
import sys

import numpy as np
import pytest

from .conftest import MODELS
from .train_util import dlnet_train
from tests.conftest import rel_l2

pytest.importorskip("mpi4py")
from dlnet.cli import train_mpi  # noqa: E402

try:
    MPIRUN = train_mpi.find_mpirun()
except Exception:  # noqa: BLE001 (no mpirun: the extra is half installed)
    MPIRUN = None
pytestmark = [pytest.mark.skipif(MPIRUN is None, reason="no mpirun (pip install -e '.[mpi]')"), pytest.mark.slow]

# the test harness each process runs before `dlnet train`: it records every step's loss and, at exit, writes them
# with the rank's trained weights to DUMP/rank<r>.npz
HARNESS = """
import atexit, os, numpy as np, dlnet
_rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
_losses, _trainer = [], []
_step = dlnet.Trainer.step
def _recording(self, feeds):
    _trainer[:] = [self]
    loss = _step(self, feeds)
    _losses.append(loss)
    return loss
dlnet.Trainer.step = _recording
def _dump():
    if _trainer:
        w = {"weight/" + k: v for k, v in _trainer[0].net.state_dict().items()}
        np.savez(os.path.join(os.environ["DUMP"], f"rank{_rank}.npz"), losses=np.array(_losses), **w)
atexit.register(_dump)
"""


def digits_config(tmp_path, name, epochs):
    """models/digits_train.yaml with its paths made absolute, `epochs` epochs and its output in tmp_path."""
    with open(os.path.join(MODELS, "digits_train.yaml")) as f:
        text = f.read()
    text = text.replace("digits_init.onnx", os.path.join(MODELS, "digits_init.onnx"))
    text = text.replace("digits_train.npz", os.path.join(MODELS, "digits_train.npz"))
    text = text.replace("epochs: 15", f"epochs: {epochs}").replace("runs/digits", str(tmp_path / name))
    assert str(tmp_path) in text and f"epochs: {epochs}" in text
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return str(path), tmp_path / name


def mpirun(procs):
    return tuple(train_mpi.mpirun_command(MPIRUN, procs, [])[:-4])  # mpirun and its options, without the command


def run(args, dump, procs=1, harness=HARNESS):
    env = dict(os.environ, DUMP=str(dump), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               DLNET_DEVICE="cpu")
    dump.mkdir(exist_ok=True)
    r = dlnet_train(args, harness=harness, prefix=mpirun(procs) if procs > 1 else (), env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def metrics(out):
    import csv
    with open(out / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_two_ranks_train_the_digits_as_one_process_does(tmp_path):
    """mpirun -np 2: identical weights on both ranks, >= 95% validation accuracy, and every step's loss (the global
    batch's, averaged over the ranks) that of one process on the same global batch."""
    epochs = 6
    config2, out2 = digits_config(tmp_path, "two", epochs)
    config1, out1 = digits_config(tmp_path, "one", epochs)
    r2 = run([config2], tmp_path / "d2", procs=2)
    run([config1], tmp_path / "d1")
    rank0, rank1 = np.load(tmp_path / "d2" / "rank0.npz"), np.load(tmp_path / "d2" / "rank1.npz")
    one = np.load(tmp_path / "d1" / "rank0.npz")
    weights = [k for k in rank0.files if k.startswith("weight/")]
    assert len(weights) == 6
    for k in weights:
        assert np.array_equal(rank0[k], rank1[k]), k
    steps = len(one["losses"])
    assert steps == epochs * (1078 // 64) and np.array_equal(rank0["losses"], rank1["losses"])
    rel = np.abs(rank0["losses"] - one["losses"]) / np.abs(one["losses"])
    # fp32 sums over 2 x 32 images round otherwise than over 64: measured 5.8e-7 at most on this config (both runs
    # are deterministic); a trajectory near a ReLU or max-pool tie can amplify it (the 4-epoch cosine reaches 1e-4)
    assert rel.max() <= 1e-5, rel.max()
    rows = metrics(out2)
    assert len(rows) == epochs and float(rows[-1]["val_accuracy"]) >= 0.95
    assert r2.stdout.count("epoch 1/") == 1  # rank 0 alone reports
    assert sorted(os.listdir(out2)) == ["checkpoint-000005.safetensors", "checkpoint-000006.safetensors",
                                        "metrics.csv", "metrics.png", "model.onnx"]


def test_resume_with_another_number_of_processes(tmp_path):
    """2 epochs on 2 processes (--procs) resumed to 3 on one process, and 2 epochs on one process resumed to 3 on
    2 processes, make the same run (the checkpoint holds the global state; a cosine schedule is stretched alike)."""
    curves = []
    for name, first, then in (("a", 2, 1), ("b", 1, 2)):
        config, out = digits_config(tmp_path, name, 2)
        r = run((["--procs", str(first)] if first > 1 else []) + [config], tmp_path / "x", harness="")
        assert "epoch 2/2" in r.stdout
        with open(config) as f:
            text = f.read()
        with open(config, "w") as f:
            f.write(text.replace("epochs: 2", "epochs: 3"))
        r = run((["--procs", str(then)] if then > 1 else []) + ["--resume", config], tmp_path / "x", harness="")
        assert "resumed from" in r.stdout and "epoch 3/3" in r.stdout and "epoch 2/3" not in r.stdout
        curves.append(metrics(out))
    a, b = curves
    assert [row["epoch"] for row in a] == [row["epoch"] for row in b] == ["1", "2", "3"]
    for ra, rb in zip(a, b):
        for key in ("train_loss", "val_loss"):
            assert abs(float(ra[key]) - float(rb[key])) <= 1e-4 * float(rb[key]), (key, ra, rb)


def test_procs_refuses_a_batch_that_does_not_split(tmp_path):
    config, out = digits_config(tmp_path, "c", 1)
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text.replace("batch_size: 64", "batch_size: 63"))
    env = dict(os.environ, DLNET_DEVICE="cpu")
    r = dlnet_train(["--procs", "2", config], env=env, timeout=300)
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == [f"dlnet: error: {config}: batch_size 63 does not split over 2 processes; give a multiple of 2 "
                     "(it is the global batch)"], r.stderr
    assert not out.exists()


def test_a_rank_that_dies_ends_the_job_in_one_line(tmp_path):
    """Rank 1 is killed in epoch 2: the job ends, one line says so, and epoch 1's checkpoint stays good."""
    config, out = digits_config(tmp_path, "d", 3)
    rank_harness = ("import os, signal, dlnet\n_s = dlnet.Trainer.step\n"
                    "def _step(self, feeds):\n"
                    "    if os.environ.get('OMPI_COMM_WORLD_RANK') == '1' and self.step_count == 20:\n"
                    "        os.kill(os.getpid(), signal.SIGKILL)\n"
                    "    return _s(self, feeds)\n"
                    "dlnet.Trainer.step = _step\n")
    # the launcher's harness puts the ranks' harness before the code each rank runs
    harness = ("from dlnet.cli import train_mpi\n_command = train_mpi.mpirun_command\n"
               "def _with_harness(*a):\n    cmd = _command(*a)\n    i = cmd.index('-c') + 1\n"
               f"    cmd[i] = {rank_harness!r} + cmd[i]\n    return cmd\n"
               "train_mpi.mpirun_command = _with_harness\n")
    env = dict(os.environ, DLNET_DEVICE="cpu", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = dlnet_train(["--procs", "2", config], harness=harness, env=env, timeout=300)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dlnet: error: the 2-process job ended (rank 1"), r.stderr
    assert "stays good" in lines[0]
    from dlnet.cli import checkpoint
    (_, path), *_ = checkpoint.checkpoints(str(out))
    tensors, state = checkpoint.read_checkpoint(path)
    assert state["epoch"] == 1 and len(tensors) > 0



# each rank of `mpirun -np 2` (and one process alone) trains the small CNN below with and without sync_bn on its half
# of each global batch and writes its losses and weights to OUT/<mode>-rank<r>.npz
SYNC_BN_JOB = """
import sys, numpy as np, dlnet
model, out = sys.argv[1], sys.argv[2]
comm = dlnet.distributed.from_environment()
rng = np.random.default_rng(5)
data = []
for _ in range(6):
    x = rng.standard_normal((16, 2, 6, 6)).astype(np.float32)
    x[:8] = x[:8] * 0.5 + 1.5  # rank 0's half: narrow, centred at 1.5; rank 1's: wide, centred at -1
    x[8:] = x[8:] * 2.0 - 1.0
    data.append((x, rng.integers(0, 4, 16)))
for sync in (True, False):
    with dlnet.Net(dlnet.Context("cpu")).load_onnx(model) as net:
        trainer = dlnet.Trainer(net, optimizer=dlnet.optim.Adam(lr=1e-2), comm=comm, sync_bn=sync)
        part = slice(comm.rank * 16 // comm.size, (comm.rank + 1) * 16 // comm.size)
        losses = [trainer.step({"x": x[part], "target": y[part]}) for x, y in data]
        trainer.check_weights()
        how = getattr(trainer._active, "timing", {}).get("transport", "one")  # shm, mpi; one process: one
        np.savez(f"{out}/{'sync' if sync else 'local'}-{how}-rank{comm.rank}.npz", losses=np.array(losses),
                 **net.state_dict())
comm.finalize()
"""


def small_cnn(path):
    """[n, 2, 6, 6] -> Conv 3x3 (no bias) -> BatchNorm -> Relu -> Conv 3x3 (no bias) -> BatchNorm -> Relu ->
    GlobalAveragePool -> Flatten -> Gemm -> [n, 4]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array((rng.standard_normal(s) * 0.4).astype(np.float32), n)
            for n, s in (("c1", (6, 2, 3, 3)), ("c2", (5, 6, 3, 3)), ("fc", (5, 4)), ("fcb", (4,)))]
    nodes = []
    for i, (x, c) in enumerate((("x", 6), ("r1", 5)), 1):
        init += [numpy_helper.from_array(a, f"{n}{i}") for n, a in (
            ("g", rng.uniform(0.5, 1.5, c).astype(np.float32)), ("beta", rng.standard_normal(c).astype(np.float32)),
            ("mean", np.zeros(c, np.float32)), ("var", np.ones(c, np.float32)))]
        nodes += [helper.make_node("Conv", [x, f"c{i}"], [f"h{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"h{i}", f"g{i}", f"beta{i}", f"mean{i}", f"var{i}"],
                                   [f"n{i}"]),
                  helper.make_node("Relu", [f"n{i}"], [f"r{i}"])]
    nodes += [helper.make_node("GlobalAveragePool", ["r2"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
              helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], init)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8), str(path))
    return str(path)


def test_sync_bn_two_ranks_train_as_one_process_on_the_global_batch(tmp_path):
    """mpirun -np 2, each rank's half of every batch with other statistics: with sync_bn every step's loss and the
    final weights (running statistics too) are one process's on the global batch; without it they differ. The
    gradients go between the ranks through shared memory (the default on one host; summed on the host, or on the
    device), through MPI's all-reduce, and host by host ("shm-mpi": MPI's host and first-rank communicators, here
    one host)."""
    import subprocess
    model, script = small_cnn(tmp_path / "cnn.onnx"), tmp_path / "job.py"
    script.write_text(SYNC_BN_JOB)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", DLNET_DEVICE="cpu")
    for prefix, options in ((mpirun(2), ""), (mpirun(2), "gradient_transport=mpi"),
                            (mpirun(2), "gradient_transport=shm-device"), (mpirun(2), "gradient_transport=shm-mpi"),
                            ((), "")):
        r = subprocess.run([*prefix, sys.executable, str(script), model, str(tmp_path)], capture_output=True,
                           text=True, timeout=300, env=dict(env, DLNET_OPTIONS=options))
        assert r.returncode == 0, r.stderr
    one = np.load(tmp_path / "sync-one-rank0.npz")  # (sync_bn changes nothing on one process)
    assert np.array_equal(one["losses"], np.load(tmp_path / "local-one-rank0.npz")["losses"])
    assert len(one.files) == 13
    for how in ("shm", "mpi", "shm-device", "shm-mpi"):
        sync0, sync1 = np.load(tmp_path / f"sync-{how}-rank0.npz"), np.load(tmp_path / f"sync-{how}-rank1.npz")
        local = np.load(tmp_path / f"local-{how}-rank0.npz")
        rel = np.abs(sync0["losses"] - one["losses"]) / np.abs(one["losses"])
        assert rel.max() <= 1e-5, (how, rel)
        for k in one.files:
            assert np.array_equal(sync0[k], sync1[k]), (how, k)
            if k != "losses":
                assert rel_l2(sync0[k], one[k]) <= 1e-5, (how, k)
        assert (np.abs(local["losses"] - one["losses"]) / np.abs(one["losses"])).max() > 1e-3
        assert rel_l2(local["c1"], one["c1"]) > 1e-3 and rel_l2(local["var1"], one["var1"]) > 1e-3


def test_each_rank_takes_its_device(monkeypatch):
    """Rank r: the (local rank)-th device of the config's kind; an ocl:N as given; DLNET_DEVICE where the config
    names none; one process: the config's spec untouched."""
    from types import SimpleNamespace

    import dlnet
    found = [SimpleNamespace(index=i, type=t) for i, t in enumerate(["GPU", "GPU", "GPU", "CPU"])]
    monkeypatch.setattr(dlnet, "devices", lambda: found)
    monkeypatch.delenv("DLNET_DEVICE", raising=False)
    two = SimpleNamespace(rank=1, size=2)
    expected = {("1", "gpu"): "ocl:1", ("2", "gpu"): "ocl:2", ("4", "gpu"): "ocl:1", ("1", None): "ocl:1",
                ("1", "cpu"): "ocl:3", ("1", "ocl:0"): "ocl:0"}
    for (local, spec), device in expected.items():
        monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", local)
        assert train_mpi.rank_device(spec, two) == device, (local, spec)
    monkeypatch.setenv("DLNET_DEVICE", "ocl:2")
    assert train_mpi.rank_device(None, two) is None  # the Context reads DLNET_DEVICE
    assert train_mpi.rank_device("gpu", SimpleNamespace(rank=0, size=1)) == "gpu"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
