"""What every subcommand shares: --debug, --device, one-line errors and exit statuses."""
import functools
import os
import sys
import tempfile

import click

from dlnet.errors import DlnetError

EXIT_OK, EXIT_FAILED_ITEMS, EXIT_USAGE = 0, 1, 2


def fail(message, code=EXIT_USAGE):
    """Print one line on stderr and exit."""
    click.echo(f"dlnet: error: {message}", err=True)
    sys.exit(code)


def command_errors(f):
    """Add --debug; turn a DlnetError (or an OS error) into one stderr line and exit 2, traceback only with --debug."""

    @click.option("--debug", is_flag=True, help="Show the full traceback on errors.")
    @functools.wraps(f)
    def wrapper(*args, debug=False, **kwargs):
        try:
            return f(*args, **kwargs)
        except (DlnetError, OSError) as e:
            if debug:
                raise
            fail(str(e) if isinstance(e, DlnetError) else f"{getattr(e, 'filename', '') or ''}: {e.strerror or e}")

    return wrapper


device_option = click.option("--device", metavar="DEVICE", default=None,
                             help="ocl:N (see `dlnet devices`), gpu or cpu; default DLNET_DEVICE, else first GPU.")
threads_option = click.option("--threads", type=click.IntRange(min=1), default=None, metavar="N",
                               help="Worker threads of the CPU device (PoCL); default one per core.")
precision_option = click.option("--precision", type=click.Choice(["fp32", "tf32", "fp16"]), default="fp32",
                                show_default=True,
                                help="tf32: tensor cores for matrix layers on NVIDIA (about 1e-3 from fp32); fp16: "
                                "activations and weights stored in half, fp32 arithmetic (about 1e-3 from fp32).")


def write_atomic(path, text):
    """Write text to a temporary file beside path, then os.replace it into place."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".dlnet-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_net(model, device=None, batch=None, profile=False, precision="fp32", tune=None, threads=None):
    import dlnet

    ctx = dlnet.Context(device, precision=precision, profile=profile, threads=threads)
    return dlnet.Net(ctx).load_onnx(model, batch=batch, tune=tune)
