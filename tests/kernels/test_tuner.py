"""The GEMM tile tuner (dlnet/kernels/tuner.py): measurement and its fit, the disk cache, Options.tune (DLNET_TUNE),
the built-in database, pick_tiles and split-K by the model, and `dlnet tune`. No test asserts a timing: on PoCL the
tiled GPU core is forced onto a CPU device, with tiny sizes."""
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from dlnet.cli import main as cli_main
from onnx import helper

import dlnet
from dlnet.kernels import rules, tuner
from dlnet.kernels.options import Options

from ..conftest import context, make_model, rel_l2

TINY = {"compute_units": 1, "depths": (16, 32), "max_per_cu": 2, "reps": 1}
rng = np.random.default_rng(3)


class Calls(list):
    """The devices measure() was called on; `cache`: the test's cache folder."""
    cache = None


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty memo and database, a cache folder of the test's own (for contexts made here: `tuned`; for the CLI's:
    DLNET_CACHE), tiny measurements, DLNET_TUNE unset; returns a list that records each measure() call."""
    monkeypatch.setattr(tuner, "_MEMO", {})
    monkeypatch.setattr(tuner, "DATABASE", {})
    monkeypatch.setenv("DLNET_CACHE", str(tmp_path))
    monkeypatch.delenv("DLNET_TUNE", raising=False)
    monkeypatch.delenv("DLNET_OPTIONS", raising=False)
    monkeypatch.setattr(tuner, "SIZES", {"cpu": TINY, "gpu": TINY})
    calls = Calls()
    calls.cache = str(tmp_path)
    measure = tuner.measure

    def counting(ctx, sizes=None):
        calls.append(ctx.info.name)
        return measure(ctx, sizes)
    monkeypatch.setattr(tuner, "measure", counting)
    return calls


def tuned(fresh, tune="", ctx=None):
    """ctx (the shared context) with the test's cache folder and Options.tune = tune."""
    return (ctx or context()).with_options(cache_dir=fresh.cache, tune=tune)


def gpu_like(fresh, is_gpu=True, tune=""):
    """A context on the test device that the tuner takes for a GPU (CPUs are tuned only with tune="1"), or for
    a CPU."""
    ctx = tuned(fresh, tune)
    ctx.is_cpu = not is_gpu
    assert ctx.dev.is_cpu == (not is_gpu)
    return ctx


def no_measure(monkeypatch):
    def fail(ctx, sizes=None):
        raise AssertionError("measured")
    monkeypatch.setattr(tuner, "measure", fail)


def check_model(model, max_per_cu):
    assert set(model) == set(rules.GPU_TILE_MODEL)
    for shape, m in model.items():
        assert isinstance(m["per_cu"], int) and 1 <= m["per_cu"] <= max_per_cu, (shape, m)
        assert math.isfinite(m["rate"]) and m["rate"] > 0, (shape, m)
        assert math.isfinite(m["k0"]) and m["k0"] >= 0, (shape, m)


def test_measure_every_shape():
    check_model(tuner.measure(context(), TINY), TINY["max_per_cu"])


def test_fit():
    """per_cu: the fewest work-groups per unit at the best throughput (within 5%); time = a (K + k0) through two
    depths; noise that makes the deeper launch the faster one leaves k0 = 0 rather than a negative rate."""
    assert tuner.per_cu_of([1.0, 1.3, 1.9, 2.5]) == 2  # latency hidden from 2 per unit on
    assert tuner.per_cu_of([1.0, 1.5, 1.9, 3.3, 3.7, 3.9]) == 3  # 3 resident: a second wave at 4
    assert tuner.per_cu_of([1.0, 2.0, 3.0]) == 1  # one work-group fills a unit
    tiles = rules.GEMM_TILES["gpu"]["huge"]
    a = 1e-7  # seconds per unit of K for a wave of 2 x 10 tiles of 128 x 128
    m = tuner.fit(2, a * (256 + 30), a * (1024 + 30), (256, 1024), 10, tiles)
    assert m == {"per_cu": 2, "rate": pytest.approx(2 * 10 * 128 * 128 * 2 / a / 1e12, rel=1e-3), "k0": 30.0}
    m = tuner.fit(1, 2e-3, 1e-3, (256, 1024), 10, tiles)
    assert m["rate"] > 0 and m["k0"] == 0


def test_cache_written_then_read(fresh, monkeypatch):
    """tune="1" (DLNET_TUNE=1) tunes even a CPU device: measured once, written to cache_dir/tune; a fresh memo reads
    the file back without measuring."""
    ctx = tuned(fresh, "1")
    model = tuner.tile_model(ctx)
    assert fresh == [ctx.info.name]
    assert tuner.tile_model(ctx) is model  # the memo
    path = tuner.cache_path(ctx)
    assert tuner.cache_dir(ctx.options) == fresh.cache
    assert path.startswith(fresh.cache) and "/tune/" in path
    with open(path) as f:
        data = json.load(f)
    assert data["version"] == tuner.VERSION and data["model"] == model
    check_model(model, TINY["max_per_cu"])
    monkeypatch.setattr(tuner, "_MEMO", {})
    no_measure(monkeypatch)
    assert tuner.tile_model(ctx) == model


@pytest.mark.parametrize("damage", ["garbage", "empty", "version", "programs", "short", "negative"])
def test_bad_cache_measured_again(fresh, monkeypatch, damage):
    """A cache file that is not JSON, of another version or other kernels, short of a shape, or with a value out of
    range is ignored: measured again and rewritten."""
    ctx = gpu_like(fresh)
    tuner.tile_model(ctx)
    path = tuner.cache_path(ctx)
    with open(path) as f:
        data = json.load(f)
    text = {"garbage": "{not json", "empty": ""}.get(damage)
    if damage == "version":
        data["version"] = tuner.VERSION + 1
    elif damage == "programs":
        data["programs"] = "0" * 64
    elif damage == "short":
        del data["model"]["huge"]
    elif damage == "negative":
        data["model"]["mid"]["rate"] = -1.0
    with open(path, "w") as f:
        f.write(text if text is not None else json.dumps(data))
    monkeypatch.setattr(tuner, "_MEMO", {})
    model = tuner.tile_model(ctx)
    assert len(fresh) == 2
    with open(path) as f:
        assert json.load(f)["model"] == model


def test_gpu_measured_on_first_use(fresh, monkeypatch):
    """A GPU outside the database is measured on first use (tune unset); a CPU device is not."""
    ctx = gpu_like(fresh)
    check_model(tuner.tile_model(ctx), TINY["max_per_cu"])
    assert len(fresh) == 1
    monkeypatch.setattr(tuner, "_MEMO", {})
    assert tuner.tile_model(gpu_like(fresh, is_gpu=False)) is rules.GPU_TILE_MODEL
    assert len(fresh) == 1


def test_tune_0_never_measures(fresh, monkeypatch):
    no_measure(monkeypatch)
    assert tuner.tile_model(gpu_like(fresh, tune="0")) is rules.GPU_TILE_MODEL


def test_tune_from_the_environment(fresh, monkeypatch):
    """DLNET_TUNE is read when a Context is made (Options.from_env), not when the tuner runs."""
    monkeypatch.setenv("DLNET_TUNE", "0")
    ctx = dlnet.Context(context().info)
    assert ctx.options.tune == "0"
    monkeypatch.setenv("DLNET_TUNE", "1")
    assert ctx.options.tune == "0" and dlnet.Context(context().info).options.tune == "1"
    ctx.is_cpu = False
    no_measure(monkeypatch)
    assert tuner.tile_model(ctx) is rules.GPU_TILE_MODEL


def test_database_entry(fresh, monkeypatch):
    """A device named in DATABASE takes its entry without measuring; tune="1" measures it all the same."""
    ctx = gpu_like(fresh)
    entry = {shape: dict(m, rate=m["rate"] / 2) for shape, m in rules.GPU_TILE_MODEL.items()}
    monkeypatch.setitem(tuner.DATABASE, ctx.info.name, entry)
    assert tuner.tile_model(ctx) is entry
    assert fresh == []
    monkeypatch.setattr(tuner, "_MEMO", {})
    check_model(tuner.tile_model(ctx.with_options(tune="1")), TINY["max_per_cu"])
    assert len(fresh) == 1


@pytest.fixture
def tiled_core():
    """The shared context with the fp32 GPU table (gemm_core.cl) on whatever device runs the tests."""
    ctx = context().with_options(matrix_core="portable")
    assert ctx.dev.core == "gemm_core"
    return ctx


class Given:
    """What was measured, as rules.pick_tiles reads it (tuner.Measured's form): a tile model and no layer's tile."""

    def __init__(self, model):
        self.tile_model = model

    def layer_tile(self, key, rule, choices):
        return rule


PROBLEMS = [(64, 3136, 576), (128, 50176, 1152), (512, 196, 4608), (96, 100, 64), (256, 784, 2304), (2048, 64, 9)]


@pytest.mark.parametrize("shape", sorted(rules.GPU_TILE_MODEL))
def test_pick_tiles_follows_the_model(tiled_core, shape):
    """A shape whose rate is tiny is never picked; one whose rate is huge always is."""
    dev, options = tiled_core.dev, tiled_core.options
    for rate, want in [(1e-9, False), (1e9, True)]:
        model = {s: dict(m, rate=rate) if s == shape else m for s, m in rules.GPU_TILE_MODEL.items()}
        for M, N, K in PROBLEMS:
            pick = rules.pick_tiles(dev, options, M, N, K, measured=Given(model))
            want_tiles = rules.core_tiles(dev, options, rules.GEMM_TILES["gpu"][shape], "gemm_core")
            assert (pick.tiles == want_tiles) == want, (rate, M, N, K, pick.tiles)
            assert (pick.name == f"gpu:{shape}") == want, (rate, M, N, K, pick.name)


def test_resident_groups_follow_the_model():
    """Split-K's resident slots per compute unit come from the model's per_cu (for tiles outside it, the options'
    tf32_resident: 2 by default)."""
    tiles = rules.GEMM_TILES["gpu"]["big"]
    for per_cu in (1, 3, 8):
        model = dict(rules.GPU_TILE_MODEL, big=dict(rules.GPU_TILE_MODEL["big"], per_cu=per_cu))
        assert rules.resident_groups(tiles, model, Options()) == per_cu
    narrow = rules.GEMM_TILES["gpu"]["narrow_m"]
    assert rules.resident_groups(narrow, rules.GPU_TILE_MODEL, Options()) == 2
    assert rules.resident_groups(narrow, rules.GPU_TILE_MODEL, Options(tf32_resident=3)) == 3


@pytest.mark.parametrize("M,K,N", [(300, 200, 2100), (70, 45, 90), (64, 3000, 64), (130, 64, 40)])
def test_gemm_correct_with_a_tuned_model(tiled_core, fresh, M, K, N):
    """Gemm on the tiled core, its tiles and split-K picked by a model measured here (tune="1": even on a CPU
    device), against float64."""
    ctx = tuned(fresh, "1", tiled_core)
    model = tuner.tile_model(ctx)
    assert len(fresh) == 1 and tuner.Measured(ctx).tile_model is model
    check_model(model, TINY["max_per_cu"])
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in [(M, K), (K, N), (N,)])
    net = dlnet.Net(ctx).load_onnx(make_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5)],
                                                     {"a": a, "b": b}, ["y"], {"c": c}))
    y = net.run({"a": a, "b": b})["y"]
    assert rel_l2(y, 0.5 * a.astype(np.float64) @ b.astype(np.float64) + c) < 1e-5


def test_cli_tune(fresh, monkeypatch):
    """`dlnet tune` measures (ignoring a database entry), prints a row per shape and writes the cache."""
    monkeypatch.setitem(tuner.DATABASE, context().info.name, rules.GPU_TILE_MODEL)
    r = CliRunner().invoke(cli_main.cli, ["tune"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["shape", "tile", "per_cu", "TFLOP/s", "k0"]
    rows = {line.split()[0]: line.split() for line in lines[2:-1]}
    assert set(rows) == set(rules.GPU_TILE_MODEL) and {len(row) for row in rows.values()} == {5}
    assert len(fresh) == 1
    path = lines[-1].split("cached in ")[1]
    with open(path) as f:
        data = json.load(f)
    assert {s: m["per_cu"] for s, m in data["model"].items()} == {s: int(row[2]) for s, row in rows.items()}


def test_cli_tune_bad_device():
    r = CliRunner().invoke(cli_main.cli, ["tune", "--device", "ocl:99"])
    assert r.exit_code == 2
    assert r.stderr.startswith("dlnet: error: device 'ocl:99'") and len(r.stderr.splitlines()) == 1
