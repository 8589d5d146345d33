"""`dlnet infer MODEL IMAGES...`: classify image files with an ONNX classifier."""
import contextlib
import csv
import io
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import click
import numpy as np

from dlnet.errors import InputError, ModelError
from dlnet.images import find_images, preprocess, read_image

from .common import (
    EXIT_FAILED_ITEMS,
    command_errors,
    device_option,
    fail,
    load_net,
    precision_option,
    threads_option,
    write_atomic,
)
from .progress import Progress, isatty


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
    """How images become the model's input: size, channels, layout and the batch each run takes."""

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
        # a fixed batch (torch's default export gives 1) runs the images in chunks of that size, the last padded
        self.batch = shape[0] if isinstance(shape[0], int) else batch
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


@dataclass
class Row:
    """One input's line in every output: its top classes, or why it has none."""
    path: str
    top: list = None  # [(class, label, score)] once classified
    error: str = None

    @property
    def done(self):
        return self.top is not None or self.error is not None


def _reason(error, path):
    """An InputError's message without the path it starts with."""
    text = str(error)
    return text[len(path) + 2:] if text.startswith(f"{path}: ") else text


class Classifier:
    """Runs images through the net a batch at a time and keeps a Row per input, in input order; where the results
    stream (CSV to stdout), each row is printed as soon as it and every row before it are done."""

    def __init__(self, net, spec, final_op, top_k, label_names, progress, emit=None):
        self.net, self.spec, self.final_op = net, spec, final_op
        self.top_k, self.label_names = top_k, label_names
        self.progress, self.emit = progress, emit
        self.rows, self.pending, self.emitted = [], [], 0
        self.failures, self.not_read = 0, 0

    def classify(self, files, prepare, strict):
        """Read and prepare each file, classifying every full batch as it fills and the rest at the end. A file
        that fails gets its row with the reason (said on stderr too); with `strict` the files after it are not
        read (their rows say so)."""
        for i, path in enumerate(files):
            row = Row(path)
            self.rows.append(row)
            try:
                x = prepare(read_image(path, note=lambda line: self.progress.note(f"dlnet: note: {line}")))
            except InputError as e:
                self.fail(row, _reason(e, path))
                if strict:
                    self.rows += [Row(p, error=f"not read: --strict stopped at {path}") for p in files[i + 1:]]
                    self.not_read = len(files) - i - 1
                    break
                continue
            self.pending.append((row, x))
            if len(self.pending) == self.spec.batch:
                self.run()
        if self.pending:
            self.run()
        self.flush()

    def fail(self, row, reason):
        row.error = reason
        self.failures += 1
        self.progress.note(f"dlnet: {row.path}: {reason}")
        self.progress.step(1)
        self.flush()

    def run(self):
        """The pending (row, array) pairs, one batch."""
        net, pending = self.net, self.pending
        self.pending = []
        y = net.run({self.spec.name: self.spec.stack([x for _, x in pending])})[net.outputs[0].name]
        probs = to_probabilities(y[:len(pending)], self.final_op)
        for (row, _), p in zip(pending, probs, strict=True):
            order = np.argsort(-p, kind="stable")[:self.top_k]
            names = self.label_names
            row.top = [(int(k), names[k] if names and k < len(names) else "", float(p[k])) for k in order]
        self.progress.step(len(pending))
        self.flush()

    def flush(self):
        """Emit the rows that are done and have no unfinished row before them."""
        while self.emitted < len(self.rows) and self.rows[self.emitted].done:
            if self.emit is not None:
                self.emit(self.rows[self.emitted])
            self.emitted += 1

    @property
    def classified(self):
        return sum(row.top is not None for row in self.rows)


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
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Images per run (a model with a fixed batch runs in chunks of its own size).")
@device_option
@threads_option
@precision_option
@click.option("--top-k", "top_k", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--labels", type=click.Path(exists=True, dir_okay=False), default=None, help="One label per line.")
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
@click.option("--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write results here (atomically; never over an input) instead of stdout.")
@click.option("--strict", is_flag=True, help="Stop at the first image that cannot be read.")
@command_errors
def infer(model, images, size, resize, mean, std, scale, bgr, layout, gray, batch, device, threads, precision, top_k,
          labels, fmt, output, strict):
    """Classify IMAGES (files, or directories walked for every format Pillow reads) with the ONNX classifier MODEL.

    Preprocessing is torchvision's Resize -> CenterCrop -> ToTensor -> Normalize (ImageNet mean/std by default).
    CSV (a header, then `path,class,label,score,error` per image; numbered groups with --top-k) or JSON; every
    input gets its row, one that failed with its error. Scores are softmax probabilities.
    Exit status: 0 all classified, 1 some image failed, 2 bad model, device, flag or --output.
    """
    crop = _size(size) if size else None
    mean_v = _floats(mean, "--mean") if mean is not None else None
    std_v = _floats(std, "--std") if std is not None else None
    label_names = read_labels(labels) if labels else None
    files = find_images(images, skipped=lambda path, why: click.echo(f"dlnet: note: {path}: {why}; skipped",
                                                                      err=True))
    if not files:
        fail("no image files found in " + " ".join(images))
    _refuse_output_over_inputs(output, [model, labels, *images, *files])
    if isatty(sys.stderr):  # the build is the silent part of a first run
        click.echo("dlnet: building the model's kernels for the device...", err=True)
    net = load_net(model, device, batch=min(batch, len(files)), precision=precision, threads=threads)
    spec = InputSpec(net, crop, gray, layout, min(batch, len(files)))
    _check_mean_std(spec, mean_v, std_v)
    top_k = min(top_k, _check_labels(net, model, labels, label_names) or top_k)

    stream = output is None and fmt == "csv"
    progress = Progress(len(files))
    stdout_tty = isatty(sys.stdout)

    def emit(row):
        if stdout_tty:  # rows and the bar share the terminal: the bar steps aside (it comes back at the next step)
            progress.clear()
        click.echo(csv_row(row, top_k), nl=False)

    classifier = Classifier(net, spec, ends_in_softmax(net.model), top_k, label_names, progress,
                            emit if stream else None)
    start = time.perf_counter()

    def prepare(img):
        return preprocess(img, spec.size, resize, spec.channels, mean_v, std_v, scale, bgr)

    with _reader_gone():
        if stream:
            click.echo(csv_header(top_k), nl=False)
        classifier.classify(files, prepare, strict)
        elapsed = time.perf_counter() - start
        progress.close()
        if not stream:
            text = format_json(classifier.rows) if fmt == "json" else format_csv(classifier.rows, top_k)
            _write_results(text, output)
    _summary(classifier, elapsed, strict)


@contextlib.contextmanager
def _reader_gone():
    """stdout's reader closed it (`dlnet infer ... | head`): one line saying so, and no second error at exit."""
    try:
        yield
    except BrokenPipeError:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            pass
        fail("stdout: broken pipe (its reader closed it); the results after that were not written")


def _summary(classifier, elapsed, strict):
    """The closing stderr line; exit 1 where an image failed."""
    done, failures = classifier.classified, classifier.failures
    rate = done / elapsed if elapsed > 0 else 0.0
    failed = f", {failures} failed" if failures else ""
    stopped = f" (stopped: --strict; {classifier.not_read} not read)" if strict and failures else ""
    click.echo(f"dlnet: {done} images classified{failed}{stopped}, {elapsed:.2f} s, {rate:.1f} images/s", err=True)
    if failures:
        sys.exit(EXIT_FAILED_ITEMS)


def _check_mean_std(spec, mean_v, std_v):
    """--mean and --std: one value, or one per channel."""
    for name, values in (("--mean", mean_v), ("--std", std_v)):
        if values is not None and len(values) not in (1, spec.channels):
            raise InputError(f"{name}: {len(values)} values for a {spec.channels}-channel input (expected 1 or "
                             f"{spec.channels})")


def _check_labels(net, model, labels, label_names):
    """--labels: one per class, where the model's output says how many classes there are (returned, else None):
    the product of its dimensions after the batch, as to_probabilities flattens them."""
    dims = net.outputs[0].shape[1:]
    n_classes = int(np.prod(dims)) if dims and all(isinstance(d, int) for d in dims) else None
    if label_names is not None and n_classes is not None and len(label_names) != n_classes:
        raise InputError(f"{labels}: {len(label_names)} labels, the model {model} gives {n_classes} classes")
    return n_classes


def _refuse_output_over_inputs(output, inputs):
    """--output must not be the model, the labels or an image: the same resolved path, or the same file (inode)."""
    if output is None:
        return
    target = os.path.realpath(output)
    try:
        out = os.stat(output)
    except OSError:
        out = None
    for path in inputs:
        if path is None:
            continue
        same = os.path.realpath(path) == target
        if not same and out is not None:
            try:
                st = os.stat(path)
                same = (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino)
            except OSError:
                pass
        if same:
            fail(f"--output {output} is the input {path}; refusing to write over it")


@contextlib.contextmanager
def _sigterm_raises():
    """While the output is written, SIGTERM raises SystemExit(143), so the atomic write removes its temp file."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write_results(text, output):
    """All results at once to --output (a temp file beside it, renamed into place) or stdout."""
    if not output:
        click.echo(text, nl=False)
        return
    try:
        with _sigterm_raises():
            write_atomic(output, text)
    except OSError as e:
        fail(f"{output}: cannot write the results ({e.strerror or e})")


def _csv_line(cells):
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cells)
    return buf.getvalue()


def csv_header(top_k):
    names = ("class", "label", "score")
    groups = list(names) if top_k == 1 else [f"{n}_{i}" for i in range(1, top_k + 1) for n in names]
    return _csv_line(["path", *groups, "error"])


def csv_row(row, top_k):
    """path, top_k groups of (class, label, score) (empty where none), error (empty where none)."""
    cells = [row.path]
    top = row.top or []
    for i in range(top_k):
        cells += [top[i][0], top[i][1], f"{top[i][2]:.6f}"] if i < len(top) else ["", "", ""]
    cells.append(row.error or "")
    return _csv_line(cells)


def format_csv(rows, top_k):
    return csv_header(top_k) + "".join(csv_row(row, top_k) for row in rows)


def format_json(rows):
    items = [{"path": row.path,
              "top": [{"class": k, "label": label, "score": round(s, 6)} for k, label, s in row.top or []],
              "error": row.error} for row in rows]
    return json.dumps(items, indent=1) + "\n"
