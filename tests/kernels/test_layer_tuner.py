"""Tiles per layer (tuner.tune_layers): every tile a layer may take, measured in the whole plan; the fastest kept per
layer key, in the process and on disk, for every later plan. No test asserts a timing: the choice is checked on
times the test gives, the measuring run for what it records and computes. On PoCL the tiled GPU core is forced onto
the CPU device (its four fp32 tiles); on an NVIDIA device in tf32 mode the tensor-core tiles are options too."""
import json
import os

import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.kernels import tuner

from ..conftest import context, make_model, reference, rel_l2

rng = np.random.default_rng(11)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def small_net():
    """3x3 convolution + bias + ReLU, 3x3 stride 2, 1x1, and a product of two inputs: four tunable products."""
    w1, b1, w2, w3 = f32(32, 16, 3, 3) / 12, f32(32), f32(64, 32, 3, 3) / 17, f32(32, 64, 1, 1) / 8
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["c2", "w3"], ["y"]),
             helper.make_node("MatMul", ["a", "b"], ["p"])]
    feeds = {"x": f32(2, 16, 12, 12), "a": f32(40, 64), "b": f32(64, 48)}
    model = make_model(nodes, feeds, ["y", "p"], {"w1": w1, "b1": b1, "w2": w2, "w3": w3})
    return model, feeds


@pytest.fixture(params=["fp32", "tf32"])
def tunable(request, monkeypatch, tmp_path):
    """A context whose products are tunable (the shared one's device, the GPU's tiled core forced on a CPU device;
    tf32: a context of the same device in tf32 mode, NVIDIA only) with a cache folder of the test's own and
    tune_layers unset, and an empty table of choices."""
    ctx = context()
    options = ctx.options.replace(matrix_core="portable", cache_dir=str(tmp_path), tune_layers="")
    if request.param == "tf32":
        if not ctx.is_nvidia:
            pytest.skip("the tf32 tiles need an NVIDIA device (inline PTX mma.sync)")
        ctx = dlnet.Context(ctx.info, precision="tf32", options=options)
    else:
        ctx = ctx.with_options(options)
    assert ctx.dev.tiled
    monkeypatch.setattr(tuner, "_LAYERS", {})
    return ctx


def check_outputs(net, model, feeds, ctx):
    got = net.run(feeds)
    want = reference(model, feeds)
    for name, ref in zip(["y", "p"], want):
        assert rel_l2(got[name], ref) < (5e-3 if ctx.precision == "tf32" else 1e-5), name


def tiles_of(net):
    return {launch.tile[0]: launch.tile[1] for launch in net.launches if launch.tile}


@pytest.mark.slow  # (every GPU tile, emulated on PoCL; CI runs it once)
def test_every_tile_a_layer_may_take_computes_it(tunable):
    """Each tile name the layers may take, forced on every product that may take it (as a trial plan is built),
    gives the model's outputs."""
    model, feeds = small_net()
    options = {n for _, _, opts in (launch.tile for launch in dlnet.Net(tunable).load_onnx(model).launches
                                     if launch.tile) for n in opts}
    assert {"gpu:huge", "gpu:big"} <= options
    if tunable.precision == "tf32":
        assert {"tf32:big", "tf32:tall"} <= options
    for name in sorted(options):
        tuner._TRIAL[id(tunable)] = name
        try:
            net = dlnet.Net(tunable).load_onnx(model)
        finally:
            del tuner._TRIAL[id(tunable)]
        assert name in tiles_of(net).values()
        check_outputs(net, model, feeds, tunable)


def test_the_fastest_tile_is_kept_per_layer(tunable, monkeypatch):
    """Given times: a layer takes the tile that ran fastest, unless the plan's own came within LAYER_MARGIN of it;
    the choices go to the cache file, which a fresh process reads, and later plans take them without measuring."""
    model, feeds = small_net()
    keys = sorted(tiles_of(dlnet.Net(tunable).load_onnx(model)))
    assert len(keys) == 4
    rule = tiles_of(dlnet.Net(tunable).load_onnx(model))
    want = {keys[0]: "gpu:huge" if rule[keys[0]] != "gpu:huge" else "gpu:mid", keys[1]: rule[keys[1]]}

    def given(ctx, plan, reps):  # keys[0]: `want` at half the rest's time; keys[1]: another 1% faster than the rule's
        out = {}
        for launch in plan.launches:
            if launch.tile:
                key, name = launch.tile[:2]
                ms = 1.0 if name == want.get(key) else 2.0
                if key == keys[1] and name != rule[key]:
                    ms = 0.99
                out[key, name] = ms
        return out
    monkeypatch.setattr(tuner, "_layer_times", given)
    net = dlnet.Net(tunable).load_onnx(model, tune=True)
    report = net._last.tuning
    assert report["layers"][keys[0]]["tile"] == want[keys[0]] and report["layers"][keys[0]]["was"] == rule[keys[0]]
    assert report["layers"][keys[1]]["tile"] == rule[keys[1]]  # within the margin: the plan's own stays
    assert tiles_of(net)[keys[0]] == want[keys[0]]
    check_outputs(net, model, feeds, tunable)
    with open(tuner.layer_cache_path(tunable)) as f:
        saved = json.load(f)["layers"]
    assert {k: v["tile"] for k, v in saved.items()} == {k: v["tile"] for k, v in report["layers"].items()}
    monkeypatch.setattr(tuner, "_LAYERS", {})  # a fresh process: the file's choices, nothing measured
    monkeypatch.setattr(tuner, "_layer_times", lambda *a: pytest.fail("measured again"))
    again = dlnet.Net(tunable).load_onnx(model, tune=True)
    assert again._last.tuning is None and tiles_of(again) == tiles_of(net)
    assert tiles_of(dlnet.Net(tunable).load_onnx(model)) == tiles_of(net)  # a plan without tune=True too
    with tuner.by_rule(tunable):  # comparisons: the rule's tiles, whatever was measured
        assert tiles_of(dlnet.Net(tunable).load_onnx(model)) == rule
    assert tiles_of(dlnet.Net(tunable.with_options(tune_layers="0")).load_onnx(model)) == rule


def test_a_stale_or_broken_cache_file_is_ignored(tunable, monkeypatch):
    model, _ = small_net()
    rule = tiles_of(dlnet.Net(tunable).load_onnx(model))
    key = sorted(rule)[0]
    other = "gpu:huge" if rule[key] != "gpu:huge" else "gpu:mid"
    path = tuner.layer_cache_path(tunable)
    good = {"version": tuner.LAYER_VERSION, "device": tuner._identity(tunable), "programs": tuner._layer_digest(),
            "layers": {key: {"tile": other}}}
    for data, taken in [(good, other), (dict(good, programs="old kernels"), rule[key]),
                        (dict(good, layers={key: {"tile": "gpu:no_such_tile"}}), rule[key]), ("{not json", rule[key])]:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(data if isinstance(data, str) else json.dumps(data))
        monkeypatch.setattr(tuner, "_LAYERS", {})
        assert tiles_of(dlnet.Net(tunable).load_onnx(model))[key] == taken


def test_tune_layers_measures_every_option(tunable, monkeypatch):
    """The measuring run itself (one timed run per trial): a time for every tile each layer may take, and the
    tuned plan computes the model; `dlnet tune MODEL` prints its table."""
    monkeypatch.setattr(tuner, "LAYER_REPS", 1)
    model, feeds = small_net()
    net = dlnet.Net(tunable).load_onnx(model, tune=True)
    report = net._last.tuning
    options = {launch.tile[0]: launch.tile[2] for launch in net.launches if launch.tile}
    assert set(report["layers"]) == set(options)
    for key, v in report["layers"].items():
        assert set(v["ms"]) == set(options[key]) and all(ms > 0 for ms in v["ms"].values()), key
        assert v["tile"] in options[key]
    assert 0 < report["after"] <= report["before"]
    check_outputs(net, model, feeds, tunable)
    if tunable.precision != "fp32" or not tunable.is_cpu:
        return
    from click.testing import CliRunner
    from dlnet.cli import main as cli_main
    # the CLI's context reads the environment: the same cache folder, the tiled core as on `tunable`
    monkeypatch.setenv("DLNET_CACHE", tunable.options.cache_dir)
    monkeypatch.setenv("DLNET_OPTIONS", "matrix_core=portable")
    monkeypatch.delenv("DLNET_TUNE_LAYERS", raising=False)
    path = os.path.join(tunable.options.cache_dir, "small.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    res = CliRunner().invoke(cli_main.cli, ["tune", path, "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "measured" in res.output and "by rule" in res.output and sorted(options)[0] in res.output
