"""The fp32 GPU tile model per device (rules.GPU_TILE_MODEL's form: per tile shape, work-groups resident per
compute unit, TFLOP/s with every unit full, fixed cost per tile in units of K), measured on a device's first use and
cached on disk, as CLBlast's tuner and database do.

tile_model(ctx) looks in, in order: this process's memo; the built-in DATABASE for devices measured by hand (unless
DLNET_TUNE=1); the cache file DLNET_CACHE/tune/<device>.json; else measures now (1.3-1.6 s the first time on an
H100 or H200, 0.1 s once its four programs are compiled) and writes that file. DLNET_TUNE=0 never measures: the
database's entry, else the H100's values. CPU devices run gemm_vec.cl, not the tiled core, and are measured only
with DLNET_TUNE=1 (or by `measure` and `tune` called directly).

tune_layers(ctx, build) measures per layer instead, where asked (Net.load_onnx(tune=True), `dlnet tune MODEL`): the
tile each product of a plan runs fastest on, kept per layer key in DLNET_CACHE/tune/<device>-layers-<precision>.json
and taken by every later plan on the device (layer_tile).
"""
import contextlib
import hashlib
import json
import math
import os
import statistics
import tempfile
import time

import numpy as np

from ..errors import DeviceError, DlnetError
from . import rules
from .emitter import gemm_args, gemm_source
from .runtime import cache_dir, cl, kernel_source

# Devices measured by hand, by OpenCL device name (the H100's entry: see the comment above GPU_TILE_MODEL)
DATABASE = {"NVIDIA H100 80GB HBM3": rules.GPU_TILE_MODEL}
# the cache file's format; a file of another version (or of other kernels) is measured again
VERSION = 1
# What measure() times, per device class: compute units assumed (None: the device's), the depths K1 < K2 of the
# full-wave launches, the most work-groups per compute unit tried, and repetitions timed (median) after a warm-up.
# On CPUs the tiled core runs only where tests force it (a few GFLOP/s on PoCL): tiny sizes, a fraction of a second.
SIZES = {"gpu": dict(compute_units=None, depths=(256, 1024), max_per_cu=6, reps=5),
         "cpu": dict(compute_units=1, depths=(16, 48), max_per_cu=3, reps=1)}
# per_cu: the fewest work-groups per compute unit whose throughput comes within this fraction of the best seen. On
# an H200 (132 units) one work-group per unit ran at 0.5-0.77 of the best rate, so "time within 1.2x of one per
# unit" took per_cu = 1 for every tile; this rule gave huge 2, mid 3, big 4 (the H100 fit: 2, 4, 4) and wide 3, where
# the times rose in steps of 3 per unit (a second wave at 4), on the register-fetch core (bench/RESULTS.md).
FULL_RATE = 0.95

_MEMO = {}  # cl.Device -> tile model


def tile_model(ctx):
    """The tile model of ctx's device (memoised per process)."""
    model = _MEMO.get(ctx.device)
    if model is None:
        model = _MEMO[ctx.device] = _lookup(ctx)
    return model


def _lookup(ctx):
    mode = ctx.options.tune
    known = DATABASE.get(ctx.info.name)
    if mode == "0" or (mode != "1" and (known is not None or ctx.dev.is_cpu)):
        return known if known is not None else rules.GPU_TILE_MODEL
    path = cache_path(ctx)
    model = read_cache(path, ctx) if path else None
    return model if model is not None else tune(ctx)[0]


def tune(ctx, sizes=None):
    """Measure ctx's device now and write the cache file: (model, seconds, cache path or None where there is no
    cache folder)."""
    start = time.perf_counter()
    model = measure(ctx, sizes)
    seconds = time.perf_counter() - start
    path = cache_path(ctx)
    if path:
        _write(path, {"version": VERSION, "device": _identity(ctx), "programs": _programs_digest(ctx),
                      "seconds": round(seconds, 3), "model": model})
    _MEMO[ctx.device] = model
    return model, seconds, path


def _identity(ctx):
    dev = ctx.device
    return [dev.platform.name.strip(), dev.name.strip(), dev.driver_version.strip(), str(ctx.info.compute_units)]


def cache_path(ctx):
    """DLNET_CACHE/tune/<digest of platform, device, driver and compute units>.json; None without a cache folder."""
    root = cache_dir(ctx.options)
    if root is None:
        return None
    digest = hashlib.sha256("\0".join(_identity(ctx)).encode()).hexdigest()[:24]
    return os.path.join(root, "tune", digest + ".json")


def _programs_digest(ctx):
    """Digest of the programs measure() times: new tiles or kernel text make a cached model stale."""
    return hashlib.sha256("".join(_program(t) for t in _tiles(ctx).values()).encode()).hexdigest()


def _tiles(ctx):
    """The tiles of each shape of the model, as ctx's device runs them."""
    return {shape: rules.core_tiles(ctx.dev, ctx.options, rules.GEMM_TILES["gpu"][shape], "gemm_core")
            for shape in rules.GPU_TILE_MODEL}


# element strides (sam, sak, sbk, sbn, scm, scn) as gemm_source sees those of row-major A (M x K) and B (K x N)
# with K and N multiples of 4, and no C
ROW_MAJOR = (4, 1, 4, 1, 0, 0)


def _program(tiles):
    return gemm_source("gemm_core", tiles, ROW_MAJOR, "int")


def read_cache(path, ctx):
    """The model in a cache file, or None where it is missing, unreadable, of another version, device or programs,
    or short of a shape."""
    try:
        with open(path) as f:
            data = json.load(f)
        if data["version"] != VERSION or data["device"] != _identity(ctx) or data["programs"] != _programs_digest(ctx):
            return None
        model = {shape: data["model"][shape] for shape in rules.GPU_TILE_MODEL}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return model if all(_valid(m) for m in model.values()) else None


def _valid(m):
    return isinstance(m, dict) and isinstance(m.get("per_cu"), int) and m["per_cu"] >= 1 and all(
        isinstance(m.get(k), (int, float)) and math.isfinite(m[k]) for k in ("rate", "k0")) and m["rate"] > 0 and \
        m["k0"] >= 0


def _write(path, data):
    """Write the JSON atomically (a temporary file beside it, then os.replace); a cache that cannot be written is
    skipped."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tune-", suffix=".tmp", dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass


def _grid(groups):
    """(rows, columns) of tiles for a grid of exactly `groups` work-groups, as square as divisors allow."""
    rows = max(r for r in range(1, math.isqrt(groups) + 1) if groups % r == 0)
    return rows, groups // rows


def measure(ctx, sizes=None):
    """Time every fp32 GPU tile shape on ctx's device and fit its model; sizes: entries of SIZES to override.

    Random A (M x K) and B (K x N), kernel time from OpenCL profiling events. per_cu: grids of c * CUs
    work-groups, c = 1..max_per_cu, at depth K2 (per_cu_of); rate and k0: the full wave of per_cu * CUs work-groups
    at K1 and K2 (fit)."""
    sizes = dict(SIZES[ctx.dev.kind], **(sizes or {}))
    cus = sizes["compute_units"] or ctx.info.compute_units
    k1, k2 = sizes["depths"]
    counts = range(1, sizes["max_per_cu"] + 1)
    tiles = _tiles(ctx)
    sources = {shape: _program(t) for shape, t in tiles.items()}
    ctx.build_all([(src, ()) for src in sources.values()])
    grids = [_grid(c * cus) for c in counts]
    floats = {"a": k2 * max(r * t["TM"] for r, _ in grids for t in tiles.values()),
              "b": k2 * max(n * t["TN"] for _, n in grids for t in tiles.values()),
              "y": counts[-1] * cus * max(t["TM"] * t["TN"] for t in tiles.values())}
    queue = cl.CommandQueue(ctx.cl, ctx.device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    bufs = {name: ctx.alloc(4 * n) for name, n in floats.items()}
    bufs["boff"] = ctx.alloc(32)  # one product, at offset 0 in each operand
    try:
        rng = np.random.default_rng(0)
        for name in ("a", "b"):
            cl.enqueue_copy(queue, bufs[name], rng.random(floats[name], dtype=np.float32))
        cl.enqueue_copy(queue, bufs["boff"], np.zeros(4, np.int64))
        model = {}
        for shape, t in tiles.items():
            kernel = cl.Kernel(ctx.program(sources[shape]), "gemm")
            times = [_time(queue, kernel, bufs, t, c * cus, k2, sizes["reps"]) for c in counts]
            per_cu = per_cu_of(times)
            t1 = _time(queue, kernel, bufs, t, per_cu * cus, k1, sizes["reps"])
            model[shape] = fit(per_cu, t1, times[per_cu - 1], (k1, k2), cus, t)
    finally:
        for buf in bufs.values():
            ctx.free(buf)
    return model


def per_cu_of(times):
    """Work-groups per compute unit from the times of grids of c = 1, 2, ... per unit: the fewest that keep the
    device as busy as any (throughput c / time within FULL_RATE of the best), a full wave."""
    rates = [c / t for c, t in enumerate(times, 1)]
    return next(c for c, r in enumerate(rates, 1) if r >= FULL_RATE * max(rates))


def fit(per_cu, t1, t2, depths, compute_units, tiles):
    """A shape's model from a full wave's seconds t1, t2 at depths K1 < K2: time = a (K + k0), rate = the wave's
    FLOPs per unit of K over a, in TFLOP/s."""
    k1, k2 = depths
    a = (t2 - t1) / (k2 - k1)
    k0 = max(0.0, t1 / a - k1) if a > 0 else 0.0
    if a <= 0:  # no growth with K measured (noise on a tiny problem): no fixed cost, all of the time scales with K
        a = t2 / k2
    rate = per_cu * compute_units * tiles["TM"] * tiles["TN"] * 2 / a / 1e12
    return dict(per_cu=per_cu, rate=float(f"{rate:.4g}"), k0=round(k0, 1))


def _time(queue, kernel, bufs, tiles, groups, K, reps):
    """Median seconds over `reps` launches, after one warm-up, of a product of `groups` tiles of depth K."""
    rows, cols = _grid(groups)
    M, N, threads = rows * tiles["TM"], cols * tiles["TN"], rules.core_threads(tiles)
    at = [bufs["y"], np.uint64(0)]  # (C is not read: no HAS_C; no split-K workspace)
    kernel.set_args(*gemm_args([bufs["a"], np.uint64(0)], [bufs["b"], np.uint64(0)], at, at, bufs["boff"],
                                        M, N, K, (K, 1, N, 1, 0, 0), "int"), *at)
    try:
        events = [cl.enqueue_nd_range_kernel(queue, kernel, (cols * threads, rows, 1), (threads, 1, 1))
                  for _ in range(reps + 1)]
        queue.finish()
    except cl.Error as e:
        raise DeviceError(f"tuner: gemm_core.cl with tiles {tiles} failed on {M} x {N} x {K}: {e}") from e
    return max(1e-9, statistics.median((ev.profile.end - ev.profile.start) * 1e-9 for ev in events[1:]))


# Tiles per layer ---------------------------------------------------------------------------------------------------
# lowering picks a product's tile by rule (pick_tiles: the fp32 model above, the tf32 rules), which fits measured
# layer times only to 7-27%. tune_layers measures instead: every tile a layer may take, in the whole plan, and keeps
# the fastest per layer key (kind of product, M x N x K x batches) in DLNET_CACHE/tune/<device>-layers-<precision>.json,
# which every later plan on that device reads (as cuDNN's benchmark mode, but kept on disk).

LAYER_VERSION = 1
LAYER_REPS = 5  # timed runs of each trial plan (the median per launch), after one warm-up
# a measured tile replaces the plan's own only where it took at most this fraction of that one's time
LAYER_MARGIN = 0.97
LAYER_SOURCES = ("gemm", "gemm_core", "gemm_mma", "gemm_fetch", "gemm_reduce", "conv", "window", "conv_grad_gemm")

_LAYERS = {}  # (cl.Device, precision) -> {layer key: tile name}
_TRIAL = {}  # id(ctx) -> the tile name every tunable product takes (where it may) while a trial plan is built


class Measured:
    """What was measured on a context's device, as the lowering reads it (rules.pick_tiles' `measured`): the tile
    model (measured on first use where the device is unknown) and each tunable layer's tile."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._model = None

    @property
    def tile_model(self):
        if self._model is None:
            self._model = tile_model(self.ctx)
        return self._model

    def layer_tile(self, key, rule, choices):
        return layer_tile(self.ctx, key, rule, choices)


def layer_tile(ctx, key, rule, options):
    """The tile name (an entry of options) a product with this layer key takes: the trial's while tune_layers
    builds one, else the one measured for it (none with DLNET_TUNE_LAYERS=0), else the rule's."""
    trial = _TRIAL.get(id(ctx))
    if trial is not None:
        return trial if trial in options else rule
    if ctx.options.tune_layers == "0":
        return rule
    name = layer_tiles(ctx).get(key)
    return name if name in options else rule


@contextlib.contextmanager
def by_rule(ctx):
    """Plans built inside take the rule's tiles, whatever was measured (comparisons)."""
    _TRIAL[id(ctx)] = ""
    try:
        yield
    finally:
        del _TRIAL[id(ctx)]


def layer_tiles(ctx):
    """{layer key: tile name} measured on ctx's device in ctx's precision (memoised per process; read from the
    cache file once)."""
    device = getattr(ctx, "device", None)
    if device is None:  # (a stand-in context of tests of the rules)
        return {}
    table = _LAYERS.get((device, ctx.dev.precision))
    if table is None:
        path = layer_cache_path(ctx)
        table = _LAYERS[device, ctx.dev.precision] = _read_layers(path, ctx) if path else {}
    return table


def layer_cache_path(ctx):
    path = cache_path(ctx)
    return path and f"{path[:-5]}-layers-{ctx.dev.precision}.json"


def _layer_digest():
    """Digest of what a layer's tile names stand for: the tile tables and the kernels' text."""
    text = json.dumps(rules.GEMM_TILES, sort_keys=True) + "".join(kernel_source(name) for name in LAYER_SOURCES)
    return hashlib.sha256(text.encode()).hexdigest()


def _read_layers(path, ctx):
    try:
        with open(path) as f:
            data = json.load(f)
        if data["version"] != LAYER_VERSION or data["device"] != _identity(ctx) or data["programs"] != _layer_digest():
            return {}
        return {str(k): v["tile"] for k, v in data["layers"].items() if isinstance(v.get("tile"), str)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def tune_layers(ctx, build, reps=LAYER_REPS, again=False):
    """A plan from build() whose tunable products take the tile measured fastest for their layer key.

    Where some key of the plan has no measured tile yet (again: always): one trial plan per tile name any of them may
    take, with every tunable product forced onto that tile where it may take it (the rule's elsewhere). Each trial runs
    reps + 1 times on a profiling queue (random inputs); a key's time under a tile is its launches' kernel time
    (split-K's reduction included), median per launch, summed over the nodes that share the key.
    Per key the fastest tile replaces the plan's own where it took at most LAYER_MARGIN of that one's time. The
    choices go to the process's table and the cache file, then the plan is built again.

    Returns (plan, report): report is None where nothing was measured, else {"seconds", "before" and "after" (the
    tunable products' summed ms), "layers": {key: {"tile": chosen, "was": the plan's own, "ms": {tile: ms}}}}."""
    plan = build()
    tagged = {launch.tile[0]: launch.tile for launch in plan.launches if launch.tile}
    table = layer_tiles(ctx)
    if not tagged or (not again and all(key in table for key in tagged)):
        return plan, None
    start = time.perf_counter()
    plan.release()
    times = {}  # key -> {tile name: ms}
    for name in dict.fromkeys(n for _, _, options in tagged.values() for n in options):
        _TRIAL[id(ctx)] = name
        try:
            trial = build()
        except DlnetError:  # a tile this device cannot build or run (too much local memory): not a choice
            continue
        finally:
            del _TRIAL[id(ctx)]
        try:
            measured = _layer_times(ctx, trial, reps)
        except cl.Error:
            continue
        finally:
            trial.release()
        for (key, got), ms in measured.items():
            times.setdefault(key, {})[got] = min(ms, times.get(key, {}).get(got, math.inf))
    layers = {}
    for key, (_, was, _) in tagged.items():
        ms = times.get(key, {})
        best = min(ms, key=ms.get) if ms else was
        tile = best if was not in ms or ms[best] <= LAYER_MARGIN * ms[was] else was
        table[key] = tile
        layers[key] = {"tile": tile, "was": was, "ms": {n: round(float(t), 5) for n, t in ms.items()}}
    _save_layers(ctx, layers)
    plan = build()
    before = float(sum(v["ms"].get(v["was"], 0.0) for v in layers.values()))
    after = float(sum(v["ms"].get(v["tile"], 0.0) for v in layers.values()))
    return plan, {"seconds": time.perf_counter() - start, "before": before, "after": after, "layers": layers}


def _layer_times(ctx, plan, reps):
    """{(layer key, tile name): kernel ms} of a plan's tunable products, median per launch of reps runs after a
    warm-up, on a profiling queue, with random float inputs (zeros in integer ones)."""
    queue = cl.CommandQueue(ctx.cl, ctx.device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    rng = np.random.default_rng(0)
    for v, (buf, off) in zip(plan.graph.inputs, plan.input_locs):
        if v.size:
            a = rng.standard_normal(v.size).astype(v.dtype) if np.dtype(v.dtype).kind == "f" else \
                np.zeros(v.size, v.dtype)
            cl.enqueue_copy(queue, buf, a, dst_offset=off * a.itemsize)
    runs = []
    for r in range(reps + 1):
        events = [launch.enqueue(queue) for launch in plan.launches]
        queue.finish()
        if r:
            runs.append([ev.profile.end - ev.profile.start for ev in events])
    out = {}
    for launch, ns in zip(plan.launches, np.median(np.array(runs, np.float64), axis=0)):
        if launch.tile:
            at = launch.tile[:2]
            out[at] = out.get(at, 0.0) + ns * 1e-6
    return out


def _save_layers(ctx, layers):
    """Merge these layers' choices into the cache file (another process's entries kept)."""
    path = layer_cache_path(ctx)
    if not path:
        return
    try:
        with open(path) as f:
            data = json.load(f)
        old = data["layers"] if data["version"] == LAYER_VERSION and data["device"] == _identity(ctx) and \
            data["programs"] == _layer_digest() and isinstance(data["layers"], dict) else {}
    except (OSError, ValueError, KeyError, TypeError):
        old = {}
    _write(path, {"version": LAYER_VERSION, "device": _identity(ctx), "programs": _layer_digest(),
                  "layers": dict(old, **layers)})
