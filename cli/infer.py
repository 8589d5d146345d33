"""`dlnet infer MODEL IMAGES...`: classify image files with an ONNX classifier."""
import csv
import io
import json
import sys
import time

import click
import numpy as np

from dlnet.errors import InputError, ModelError
from dlnet.images import find_images, preprocess, read_image

from .common import EXIT_FAILED_ITEMS, command_errors, device_option, fail, load_net, precision_option, write_atomic


def _floats(text, name):
    try:
        return [float(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected numbers separated by commas", param_hint=name) from None


def _size(text):
    parts = text.lower().replace("x", " ").replace(",", " ").split()
    if len(parts) not in (1, 2) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise click.BadParameter(f"{text!r}: expected N or HxW with positive integers", param_hint="--size")
    return (int(parts[0]), int(parts[-1]))


def read_labels(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\r\n") for line in f]
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not a UTF-8 labels file (byte {e.start}); expected one label per line") from None


def ends_in_softmax(model):
    """'Softmax', 'LogSoftmax' or None: the op that produces the model's first output."""
    out = model.graph.output[0].name
    for node in model.graph.node:
        if out in node.output:
            return node.op_type if node.op_type in ("Softmax", "LogSoftmax") else None
    return None


def to_probabilities(y, final_op):
    y = y.reshape(y.shape[0], -1).astype(np.float64)
    if final_op == "Softmax":
        return y
    if final_op == "LogSoftmax":
        return np.exp(y)
    e = np.exp(y - y.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class InputSpec:
    """How images become the model's input: size, channels, layout and batch."""

    def __init__(self, net, size, gray, layout, batch):
        if len(net.inputs) != 1:
            raise ModelError(f"{net.path}: {len(net.inputs)} inputs; `dlnet infer` needs a model with one image input")
        info = net.inputs[0]
        self.name, shape = info.name, info.shape
        if info.dtype != "float32":
            raise ModelError(f"{net.path}: input {info.name!r} is {info.dtype}, expected float32")
        if len(shape) != 4:
            raise ModelError(f"{net.path}: input {info.name!r} has shape {list(shape)}, expected rank 4 (N,C,H,W)")
        if layout is None:
            layout = "nhwc" if shape[1] not in (1, 3) and shape[3] in (1, 3) else "nchw"
        self.layout = layout
        c, h, w = (shape[1], shape[2], shape[3]) if layout == "nchw" else (shape[3], shape[1], shape[2])
        if gray:
            c = 1 if not isinstance(c, int) or c == 1 else c
            if c != 1:
                raise InputError(f"--gray: the model's input {info.name!r} has {c} channels, expected 1")
        self.channels = c if isinstance(c, int) else 3
        if size is None:
            if not (isinstance(h, int) and isinstance(w, int)):
                raise InputError(f"{net.path}: input {info.name!r} has symbolic size {list(shape)}; give --size")
            size = (h, w)
        elif isinstance(h, int) and isinstance(w, int) and (h, w) != size:
            raise InputError(f"--size {size[0]}x{size[1]}: the model's input {info.name!r} is fixed at {h}x{w}")
        self.size = size
        fixed_batch = shape[0] if isinstance(shape[0], int) else None
        if fixed_batch is not None and batch != fixed_batch:
            if batch != 1:
                raise InputError(f"--batch {batch}: the model's input {info.name!r} has a fixed batch of {fixed_batch}")
            batch = fixed_batch
        self.batch = batch
        self.net, self.pinned = net, None

    def stack(self, arrays):
        """CxHxW arrays -> one batch, padded with zeros to the batch size (rows are independent), written into one
        pinned host array that every batch reuses (run() has finished with it when it returns)."""
        if self.pinned is None:
            shape = (self.batch, self.channels) + self.size
            self.pinned = self.net.input_array(self.name, shape if self.layout == "nchw" else
                                               (shape[0], shape[2], shape[3], shape[1]))
        x = self.pinned.transpose(0, 3, 1, 2) if self.layout == "nhwc" else self.pinned
        x[:len(arrays)] = np.stack(arrays)
        x[len(arrays):] = 0
        return self.pinned


class Progress:
    """A one-line bar on stderr, only for more than 5 images on a terminal."""

    def __init__(self, total):
        self.total, self.done = total, 0
        self.on = total > 5 and sys.stderr.isatty()

    def clear(self):
        if self.on:
            sys.stderr.write("\r\033[K")

    def step(self, n):
        self.done += n
        if self.on:
            filled = 30 * self.done // self.total
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}")
            sys.stderr.flush()


class Classifier:
    """Runs images through the net a batch at a time and keeps each one's top-k classes; where the results stream
    (CSV to stdout), prints each one as it comes."""

    def __init__(self, net, spec, final_op, top_k, label_names, stream, progress):
        self.net, self.spec, self.final_op = net, spec, final_op
        self.top_k, self.label_names = top_k, label_names
        self.stream, self.progress = stream, progress
        self.results, self.failures = [], 0

    def classify(self, files, prepare, strict):
        """Read and prepare each file (an image that cannot be read is reported and counted; with `strict` it
        stops the run), classifying every full batch as it fills and the last part-batch at the end."""
        pending = []
        for path in files:
            try:
                img = read_image(path)
                pending.append((path, prepare(img)))
            except InputError as e:
                self.failures += 1
                self.progress.clear()
                click.echo(f"dlnet: {e}", err=True)
                self.progress.step(1)
                if strict:
                    break
                continue
            if len(pending) == self.spec.batch:
                self.run(pending)
                pending = []
        if pending and not (strict and self.failures):
            self.run(pending)

    def run(self, pending):
        """One batch of (path, array)."""
        net = self.net
        y = net.run({self.spec.name: self.spec.stack([x for _, x in pending])})[net.outputs[0].name]
        probs = to_probabilities(y[:len(pending)], self.final_op)
        for (path, _), p in zip(pending, probs, strict=False):
            self.emit(path, p)
        self.progress.step(len(pending))

    def emit(self, path, probs):
        """Keep one image's top-k classes; print them where the results stream."""
        order = np.argsort(-probs, kind="stable")[:self.top_k]
        label_names = self.label_names
        top = [(int(k), label_names[k] if label_names and k < len(label_names) else "", float(probs[k]))
               for k in order]
        self.results.append((path, top))
        if self.stream:
            self.progress.clear()
            click.echo(csv_row(path, top), nl=False)


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("images", nargs=-1, required=True)
@click.option("--size", default=None, metavar="N|HxW", help="Crop size; default: the model's input size.")
@click.option("--resize", type=click.IntRange(min=1), default=None,
              help="Shorter side before the centre crop; default size/0.875 (256 for 224).")
@click.option("--mean", default=None, help="Per-channel mean after scaling; default ImageNet (0.449 for gray).")
@click.option("--std", default=None, help="Per-channel std; default ImageNet (0.226 for gray).")
@click.option("--scale", type=float, default=1.0, show_default=True, help="Pixels are scaled to [0, SCALE].")
@click.option("--bgr", is_flag=True, help="Feed channels as BGR.")
@click.option("--layout", type=click.Choice(["nchw", "nhwc"]), default=None, help="Default: from the input shape.")
@click.option("--gray", is_flag=True, help="One-channel input (automatic when the model has 1 channel).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Images per run.")
@device_option
@precision_option
@click.option("--top-k", "top_k", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--labels", type=click.Path(exists=True, dir_okay=False), default=None, help="One label per line.")
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
@click.option("--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write results here (atomically) instead of stdout.")
@click.option("--strict", is_flag=True, help="Stop at the first image that cannot be read.")
@command_errors
def infer(model, images, size, resize, mean, std, scale, bgr, layout, gray, batch, device, precision, top_k, labels,
          fmt, output, strict):
    """Classify IMAGES (files or directories; PPM/PGM/PNG/JPEG) with the ONNX classifier MODEL.

    Prints `path,class_index,label,score` per image (more groups with --top-k); scores are softmax probabilities.
    Exit status: 0 all classified, 1 some image failed, 2 bad model, device or flag.
    """
    crop = _size(size) if size else None
    mean_v = _floats(mean, "--mean") if mean is not None else None
    std_v = _floats(std, "--std") if std is not None else None
    label_names = read_labels(labels) if labels else None
    net = load_net(model, device, precision=precision)
    spec = InputSpec(net, crop, gray, layout, batch)
    _check_mean_std(spec, mean_v, std_v)
    final_op = ends_in_softmax(net.model)
    _check_labels(net, model, labels, label_names)

    files = find_images(images)
    if not files:
        fail("no image files found in " + " ".join(images))
    stream = output is None and fmt == "csv"
    progress = Progress(len(files))
    classifier = Classifier(net, spec, final_op, top_k, label_names, stream, progress)
    start = time.perf_counter()

    def prepare(img):
        return preprocess(img, spec.size, resize, spec.channels, mean_v, std_v, scale, bgr)

    classifier.classify(files, prepare, strict)
    elapsed = time.perf_counter() - start
    progress.clear()

    results, failures = classifier.results, classifier.failures
    if not stream:
        _write_results(results, fmt, output)
    rate = len(results) / elapsed if elapsed > 0 else 0.0
    failed = f", {failures} failed" if failures else ""
    stopped = " (stopped: --strict)" if strict and failures else ""
    click.echo(f"dlnet: {len(results)} images classified{failed}{stopped}, {elapsed:.2f} s, {rate:.1f} images/s",
               err=True)
    if failures:
        sys.exit(EXIT_FAILED_ITEMS)


def _check_mean_std(spec, mean_v, std_v):
    """--mean and --std: one value, or one per channel."""
    for name, values in (("--mean", mean_v), ("--std", std_v)):
        if values is not None and len(values) not in (1, spec.channels):
            raise InputError(f"{name}: {len(values)} values for a {spec.channels}-channel input (expected 1 or "
                             f"{spec.channels})")


def _check_labels(net, model, labels, label_names):
    """--labels: one per class, where the model's output says how many classes there are."""
    out_shape = net.outputs[0].shape
    n_classes = out_shape[-1] if isinstance(out_shape[-1], int) else None
    if label_names is not None and n_classes is not None and len(label_names) != n_classes:
        raise InputError(f"{labels}: {len(label_names)} labels, the model {model} gives {n_classes} classes")


def _write_results(results, fmt, output):
    """All results at once, as CSV or JSON, to --output (atomically) or stdout."""
    text = format_json(results) if fmt == "json" else "".join(csv_row(p, t) for p, t in results)
    if output:
        write_atomic(output, text)
    else:
        click.echo(text, nl=False)


def csv_row(path, top):
    buf = io.StringIO()
    row = [path]
    for k, label, score in top:
        row += [k, label, f"{score:.6f}"]
    csv.writer(buf, lineterminator="\n").writerow(row)
    return buf.getvalue()


def format_json(results):
    items = [{"path": p, "top": [{"class": k, "label": label, "score": round(s, 6)} for k, label, s in top]}
             for p, top in results]
    return json.dumps(items, indent=1) + "\n"
