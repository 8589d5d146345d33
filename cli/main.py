"""The `dlnet` command: infer, devices, bench, show, validate, tune (and train, where cli/train.py exists)."""
import ctypes.util
import glob
import os
import statistics
import sys
import time

import click
import numpy as np

import dlnet
from dlnet.errors import InputError

from .common import EXIT_FAILED_ITEMS, command_errors, device_option, load_net, precision_option, write_atomic
from .infer import infer

# OpenCL libraries of GPU drivers, by ICD file name; a library found but not registered is the usual container case.
GPU_OPENCL_LIBRARIES = {"nvidia": "libnvidia-opencl.so.1", "amdocl64": "libamdocl64.so", "intel": "libigdrcl.so"}
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/nvidia/lib64", "/usr/local/lib",
                "/opt/rocm/lib", "/usr/lib/wsl/lib")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(dlnet.__version__, prog_name="dlnet")
def cli():
    """dlnet: run ONNX models on any OpenCL device."""


cli.add_command(infer)


def _unregistered_gpu_libraries():
    """(icd name, library) for GPU OpenCL libraries on disk that no ICD file names."""
    icd_dirs = [os.environ.get("OCL_ICD_VENDORS") or "", "/etc/OpenCL/vendors"]
    registered = ""
    for d in icd_dirs:
        for icd in glob.glob(os.path.join(d, "*.icd")) if os.path.isdir(d) else []:
            try:
                with open(icd) as f:
                    registered += f.read()
            except OSError:
                continue
    found = []
    for icd_name, lib in GPU_OPENCL_LIBRARIES.items():
        stem = lib[3:].split(".so")[0]
        present = ctypes.util.find_library(stem) or any(os.path.exists(os.path.join(d, lib)) for d in LIBRARY_DIRS)
        if present and os.path.basename(lib).split(".so")[0] not in registered:
            found.append((icd_name, lib))
    return found


@cli.command()
@command_errors
def devices():
    """List OpenCL devices; the index is what --device and DLNET_DEVICE take."""
    from dlnet.kernels.runtime import HOW_TO_GET_A_DEVICE, pick_device

    found = dlnet.devices()
    default = None
    if found:
        try:
            default = pick_device(None).index
        except dlnet.DlnetError as e:
            click.echo(f"dlnet: warning: DLNET_DEVICE: {e}", err=True)
    rows = [("", "device", "platform", "name", "type", "memory", "CUs", "fp16", "fp64")]
    for d in found:
        rows.append(("*" if d.index == default else "", f"ocl:{d.index}", d.platform, d.name, d.type,
                     f"{d.global_mem / 2**30:.1f} GiB", str(d.compute_units), "yes" if d.fp16 else "no",
                     "yes" if d.fp64 else "no"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip())
    if default is not None:
        click.echo("* default (DLNET_DEVICE, else the first GPU, else the first CPU)")
    if not found:
        click.echo(f"dlnet: {HOW_TO_GET_A_DEVICE}", err=True)
    if not any(d.type == "GPU" for d in found):
        for icd_name, lib in _unregistered_gpu_libraries():
            click.echo(f"note: {lib} (a GPU driver's OpenCL library) is installed but no ICD file registers it; "
                       f"fix: mkdir -p /tmp/icd && echo {lib} > /tmp/icd/{icd_name}.icd && "
                       "export OCL_ICD_VENDORS=/tmp/icd", err=True)
    if not found:
        sys.exit(2)


def random_feeds(net, batch=1, seed=0):
    """Seeded inputs: normal floats, small non-negative integers, symbolic dims set to batch."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in net.inputs:
        shape = tuple(batch if isinstance(d, str) else d for d in info.shape)
        dtype = np.dtype(info.dtype)
        if dtype.kind == "f":
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[info.name] = rng.random(shape) < 0.5
        else:
            feeds[info.name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@device_option
@click.option("--iters", type=click.IntRange(min=1), default=20, show_default=True, help="Timed runs.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Untimed runs first.")
@click.option("--profile", is_flag=True, help="Per-layer time table from OpenCL events.")
@click.option("--tune", is_flag=True, help="First measure which GEMM tile each layer runs fastest on, where no "
              "earlier run did (seconds, once per device: kept on disk; see `dlnet tune MODEL`).")
@precision_option
@command_errors
def bench(model, batch, device, iters, warmup, profile, tune, precision):
    """Median latency and images/s of MODEL on random input."""
    net = load_net(model, device, batch=batch, profile=profile, precision=precision, tune=tune or None)
    feeds = random_feeds(net, batch)
    for _ in range(warmup):
        net.run(feeds)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        net.run(feeds)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    click.echo(f"{model}: batch {batch} on {net.ctx.info}")
    click.echo(f"median {median * 1e3:.3f} ms  min {min(times) * 1e3:.3f} ms  {batch / median:.1f} images/s "
               f"({iters} runs after {warmup} warm-up)")
    if profile:
        click.echo(format_profile(profile_layers(net, iters)))


def profile_layers(net, iters):
    """{layer: seconds per run} from the launch list of the last plan (a layer's helper launches, such as im2col or a
    split-K reduction, count with it), its inputs already uploaded by run()."""
    queue = net.ctx.queue
    totals = {}
    for _ in range(iters):
        events = [(launch.layer or launch.label, launch.enqueue(queue)) for launch in net.launches]
        queue.finish()
        for label, ev in events:
            totals[label] = totals.get(label, 0.0) + (ev.profile.end - ev.profile.start) * 1e-9
    return {k: v / iters for k, v in totals.items()}


def format_profile(per_label):
    total = sum(per_label.values()) or 1.0
    width = max([len("layer")] + [len(k) for k in per_label])
    lines = [f"{'layer'.ljust(width)}  {'ms':>9}  {'%':>6}"]
    for label, secs in sorted(per_label.items(), key=lambda kv: -kv[1]):
        lines.append(f"{label.ljust(width)}  {secs * 1e3:9.4f}  {100 * secs / total:6.1f}")
    lines.append(f"{'total'.ljust(width)}  {total * 1e3:9.4f}  {100.0:6.1f}")
    return "\n".join(lines)


def graph_dot(graph):
    """Graphviz text for the IR: a box per node, an edge per activation value."""
    lines = ["digraph dlnet {", "  rankdir=TB;", "  node [shape=box, fontname=monospace];"]
    producer = {}
    for v in graph.inputs:
        lines.append(f'  v{v.id} [shape=ellipse, label="{v.name}\\n{v.type_str()}"];')
        producer[v.id] = f"v{v.id}"
    for k, node in enumerate(graph.nodes):
        label = node.op + (f"\\n{node.name}" if node.name else "")
        lines.append(f'  n{k} [label="{label}"];')
        for v in node.inputs:
            if v is not None and v.id in producer:
                lines.append(f'  {producer[v.id]} -> n{k} [label="{v.type_str()}"];')
        for v in node.outputs:
            producer[v.id] = f"n{k}"
    for v, name in zip(graph.outputs, graph.output_names, strict=False):
        lines.append(f'  out_{v.id} [shape=ellipse, label="{name}"];')
        if v.id in producer:
            lines.append(f"  {producer[v.id]} -> out_{v.id};")
    lines.append("}")
    return "\n".join(lines) + "\n"


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Bind a symbolic batch dimension.")
@click.option("--dot", type=click.Path(dir_okay=False), default=None, help="Also write the graph as Graphviz.")
@device_option
@precision_option
@command_errors
def show(model, batch, dot, device, precision):
    """Print the IR of MODEL after passes, and its memory summary."""
    net = load_net(model, device, batch=batch, precision=precision)
    graph = net.graph
    click.echo(str(graph))
    click.echo(str(net.memory))
    if dot:
        write_atomic(dot, graph_dot(graph.ir))
        click.echo(f"wrote {dot}", err=True)


def _onnx_reference(model_path, feeds):
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(model_path)
    names = [o.name for o in model.graph.output]
    return "onnx.reference", dict(zip(names, ReferenceEvaluator(model).run(None, feeds), strict=False))


def reference_outputs(model_path, feeds):
    """(engine name, outputs) from onnxruntime if installed (and it reads the model), else onnx.reference."""
    try:
        import onnxruntime as ort
    except ImportError:
        return _onnx_reference(model_path, feeds)
    try:
        sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - e.g. an IR version newer than this onnxruntime reads
        click.echo(f"dlnet: onnxruntime cannot load {model_path} ({str(e).splitlines()[0][-100:]}); "
                   "using onnx.reference", err=True)
        return _onnx_reference(model_path, feeds)
    names = [o.name for o in sess.get_outputs()]
    return "onnxruntime", dict(zip(names, sess.run(None, feeds), strict=False))


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--input", "input_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="An .npz with one array per model input name; default: seeded random input.")
@click.option("--tol", type=float, default=1e-4, show_default=True, help="Largest relative L2 error allowed.")
@click.option("--seed", type=int, default=0, show_default=True)
@device_option
@precision_option
@command_errors
def validate(model, input_file, tol, seed, device, precision):
    """Compare MODEL's outputs on dlnet with onnxruntime (or onnx.reference): relative L2 error per output."""
    net = load_net(model, device, precision=precision)
    if input_file:
        with np.load(input_file) as data:
            feeds = {k: data[k] for k in data.files}
    else:
        feeds = random_feeds(net, 1, seed)
    ours = net.run(feeds)
    engine, theirs = reference_outputs(model, feeds)
    worst = 0.0
    for name, y in ours.items():
        if name not in theirs:
            raise InputError(f"{model}: output {name!r} missing from the {engine} result")
        ref = np.asarray(theirs[name], np.float64)
        if ref.shape != y.shape:
            raise InputError(f"{model}: output {name!r} has shape {list(y.shape)} on dlnet, {list(ref.shape)} "
                             f"on {engine}")
        err = float(np.linalg.norm(y.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))
        worst = max(worst, err)
        click.echo(f"{name}: {list(y.shape)} relative L2 error {err:.3e} vs {engine}")
    ok = worst <= tol
    click.echo(f"{'OK' if ok else 'FAIL'}: worst {worst:.3e}, tolerance {tol:.1e}")
    if not ok:
        sys.exit(EXIT_FAILED_ITEMS)


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False), required=False)
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Bind a symbolic batch dimension.")
@device_option
@precision_option
@command_errors
def tune(model, batch, device, precision):
    """Measure the fp32 GPU tiles on DEVICE now (whatever the built-in table or the cache hold) and cache them;
    with MODEL, measure instead which tile each of its layers runs fastest on (at this batch and precision) and
    cache that, for every later run on DEVICE."""
    from dlnet.kernels import rules, tuner

    if model:
        tune_model(model, batch, device, precision)
        return
    ctx = dlnet.Context(device)
    model, seconds, path = tuner.tune(ctx)
    click.echo(f"{ctx.info}; tile: TMxTNxTK/WMxWN per work-item[/cp.async stages]")
    rows = [("shape", "tile", "per_cu", "TFLOP/s", "k0")]
    for shape, m in model.items():
        t = rules.core_tiles(ctx.dev, ctx.options, rules.GEMM_TILES["gpu"][shape], "gemm_core")
        tile = f"{t['TM']}x{t['TN']}x{t['TK']}/{t['WM']}x{t['WN']}" + (f"/{t['STAGES']}" if "STAGES" in t else "")
        rows.append((shape, tile, str(m["per_cu"]), f"{m['rate']:.4g}", f"{m['k0']:g}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = enumerate(zip(r, widths, strict=False))
        click.echo("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in cells))
    click.echo(f"tuned in {seconds:.2f} s; cached in {path}" if path else
               f"tuned in {seconds:.2f} s; not cached (no writable DLNET_CACHE folder)")


def tune_model(model, batch, device, precision):
    from dlnet.kernels import tuner

    ctx = dlnet.Context(device, precision=precision)
    net = dlnet.Net(ctx).load_onnx(model, batch=batch, tune="again")
    if net._last is None:
        raise InputError(f"{model}: input shapes are symbolic: give --batch")
    report = net._last.tuning
    click.echo(f"{model}: {ctx.info}, {precision}")
    if report is None:
        click.echo("no layer to tune: this device runs no tiled GEMM core (CPUs), or the model has no product")
        return
    rows = [("layer (kind M x N x K x batches)", "rule", "measured", "ms", "rule ms")]
    for key, v in report["layers"].items():
        rows.append((key, v["was"], v["tile"], f"{v['ms'].get(v['tile'], float('nan')):.4f}",
                     f"{v['ms'].get(v['was'], float('nan')):.4f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = enumerate(zip(r, widths, strict=False))
        click.echo("  ".join(c.rjust(w) if i > 2 else c.ljust(w) for i, (c, w) in cells))
    path = tuner.layer_cache_path(ctx)
    click.echo(f"products: {report['before']:.3f} ms by rule, {report['after']:.3f} ms as measured; tuned in "
               f"{report['seconds']:.1f} s; " + (f"cached in {path}" if path else "not cached (no DLNET_CACHE folder)"))


# `dlnet train CONFIG` lives in cli/train.py, written separately; the command appears once that module exists.
try:
    from .train import train
except ImportError as e:
    if e.name != f"{__package__}.train":  # the module exists but one of its imports failed: say so when used
        _train_error = f"`dlnet train` is unavailable: {e}"

        @cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
        def train():
            """(unavailable: an import failed; run it to see which)"""
            raise click.ClickException(_train_error)
else:
    cli.add_command(train)

def main(argv=None):
    cli.main(args=argv, prog_name="dlnet")


if __name__ == "__main__":
    main()
