"""What a plan is made of: launches bound at plan time, kernels whose programs build later, buffers named before
the device's context exists."""
from dataclasses import dataclass

import numpy as np

from .runtime import cl


class Deferred:
    """A device buffer named before it exists: a Plan lowers its graph while the device's context is still opening
    (on its thread), and its launches take the buffers when they are bound (PendingKernel.bind), once it is open."""
    __slots__ = ("make", "value")

    def __init__(self, make):
        self.make, self.value = make, None

    def get(self):
        if self.value is None:
            self.value = self.make()
        return self.value


class PendingKernel:
    """A kernel whose program is built later, with the rest of its plan's (Context.build_all); its arguments are
    recorded until then and bound by `bind`."""

    def __init__(self, source, name, options=()):
        self.key = (source, tuple(options))
        self.name = name
        self.args = []

    def set_args(self, *args):
        self.args = list(args)

    def set_arg(self, index, value):
        self.args[index] = value

    def bind(self, ctx):
        k = ctx.kernel(self.key[0], self.name, self.key[1])
        k.set_args(*[a.get() if isinstance(a, Deferred) else a for a in self.args])
        return k


@dataclass
class Launch:
    """One kernel enqueue with its arguments bound at plan time."""
    kernel: object
    gsize: tuple
    lsize: tuple | None
    label: str = ""
    layer: str = ""  # the node this launch belongs to ("name Op"); helper launches (im2col, reduce) share it
    wait: tuple | None = None  # (graph input index, chunk): the upload it waits for, where it goes in chunks
    tile: tuple | None = None  # a tunable product's (layer key, tile name, tile options): tuner.tune_layers
    pending: object = None  # the PendingKernel it was bound from (its program text and arguments: persist.py)

    def enqueue(self, queue, events=None):
        """events: {(input index, chunk): the upload's event} of a run whose inputs went up in chunks."""
        wait = [events[self.wait]] if events and self.wait in events else None
        return cl.enqueue_nd_range_kernel(queue, self.kernel, self.gsize, self.lsize, wait_for=wait)


def chunk_table(rows, chunk):
    """Rows (offset, offset, offset, elements) of tensors -> the int64 table [-1, 4] of the same rows cut into chunks
    of at most `chunk` elements, each offset moved along: the table kernels that give work-group r row r read
    (optim.cl, reduce_ranks.cl)."""
    chunks = [(a + c, b + c, s + c, min(chunk, n - c)) for a, b, s, n in rows for c in range(0, n, chunk)]
    return np.array(chunks, np.int64).reshape(-1, 4)
