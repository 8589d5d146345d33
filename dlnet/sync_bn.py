"""Synchronised BatchNormalization for data-parallel training (`Trainer(sync_bn=True)` on several ranks), as
torch.nn.SyncBatchNorm: every rank normalises by the global batch's statistics, and its backward by the global
batch's two per-channel sums, so N ranks compute the gradients of one process on the global batch.

A training step is a launch list. BatchNormTrain lowers to partial sums, the per-channel statistics and the
normalisation (dlnet/kernels/families/training.py); BatchNormTrainGrad to partial sums, the per-channel sums
(dbias = sum dy, dscale = sum dy * xhat) and dx. A *point* is the place before such a node's last launch: the host
reads the layer's per-channel values there, exchanges them with the other ranks, writes the global ones back, and
the launch list goes on. Layers whose points fall at the same launch share one exchange.

- Forward: each rank sends (count, mean [C], biased variance [C]) of its shard; every rank combines the gathered
  rows in rank order in float64 (Chan et al.'s pairwise form: the global variance is the count-weighted mean of
  the ranks' variances plus the spread of their means about the global mean), the same result on every rank.
- Backward: each rank sends its (dbias, dscale); the sum over the ranks, times (this rank's count / the global
  count), goes back. dx's kernel divides by its own count, so it sees the global batch's means; dscale and dbias
  (the parameters' gradients) become the ranks' mean, which the gradient average keeps.

The exchanges are all-gathers, not all-reduces: the sum is done in one fixed order on every rank. Where the
running variance is updated, its unbiasing counts the global batch (grad_nn.batchnorm_global_count).
"""
import time

import numpy as np

from .errors import ModelError
from .kernels.runtime import cl

FORWARD, BACKWARD = "BatchNormTrain", "BatchNormTrainGrad"


def combine_statistics(counts, means, variances):
    """Per-rank count [R], mean [R, C] and biased variance [R, C] -> the global batch's (count, mean [C], biased
    variance [C]) in float64, summed in rank order."""
    n = np.asarray(counts, np.float64)
    means, variances = np.asarray(means, np.float64), np.asarray(variances, np.float64)
    total = n.sum()
    mean = (n[:, None] * means).sum(axis=0) / total
    var = (n[:, None] * (variances + (means - mean) ** 2)).sum(axis=0) / total
    return total, mean, var


def combine_gradient_sums(sums, count, total):
    """Per-rank per-channel sums [R, K] -> their sum over the ranks (rank order, float64) x count / total: what a
    rank of `count` elements writes back so that dividing by its own count divides the global sum by `total`."""
    return np.asarray(sums, np.float64).sum(axis=0) * (count / total)


class _Layer:
    """One BatchNorm node's place in the plan: the two per-channel values the host exchanges."""

    def __init__(self, lowerer, node):
        self.forward = node.op == FORWARD
        self.channels = node.inputs[0].shape[1] if self.forward else node.inputs[1].shape[1]
        x = node.inputs[0] if self.forward else node.inputs[1]
        self.count = x.size // max(self.channels, 1)
        # forward: (mean, var); backward: (dbias, dscale); the key links a backward layer to its forward's count
        first, second = (node.outputs[1], node.outputs[2]) if self.forward else (node.outputs[2], node.outputs[1])
        self.key = node.outputs[1].id if self.forward else node.inputs[3].id
        self.locs = [lowerer.loc(first), lowerer.loc(second)]

    @property
    def width(self):
        """Elements this layer sends: the count too going forward."""
        return 2 * self.channels + (1 if self.forward else 0)


class _Point:
    def __init__(self, at, layers, size):
        self.at, self.layers = at, layers
        width = sum(layer.width for layer in layers)
        self.host = [np.zeros(2 * layer.channels, np.float32) for layer in layers]  # read and written back
        self.send = np.zeros(width, np.float64)
        self.recv = np.zeros((size, width), np.float64)


class BatchNormSync:
    """The points of one training plan (none where it has no BatchNorm) and the host's work at each."""

    def __init__(self, comm, graph, plan):
        self.comm = comm
        by_launch = {}
        for i, node in enumerate(graph.nodes):
            if node.op not in (FORWARD, BACKWARD):
                continue
            start, end = plan.node_launches[i]
            label = f"{node.name} {node.op}".strip()
            at = next((j for j in range(start, end) if plan.launches[j].label == label), None)
            if at is None:
                raise ModelError(f"node {node.name} ({node.op}): sync_bn found no launch {label!r} to stop before; "
                                 "its lowering changed (dlnet/kernels/families/training.py)")
            by_launch.setdefault(at, []).append(_Layer(plan.lowerer, node))
        self.points = [_Point(at, layers, comm.size) for at, layers in sorted(by_launch.items())]
        self.totals = {}  # forward layer key -> the global count of the last forward exchange
        self.seconds = 0.0  # the time spent exchanging at the points (the device idle), summed until reset

    def between(self, start, end):
        """The points at launch indices in [start, end), in order."""
        return [p for p in self.points if start <= p.at < end]

    def run(self, point, queue, wait):
        """At `point` (the launches before it enqueued on `queue`): read, exchange, combine, write back. wait(event)
        waits for the device (letting MPI move other collectives on meanwhile)."""
        event = None
        for layer, host in zip(point.layers, point.host):
            c = layer.channels
            for half, (buf, off) in enumerate(layer.locs):
                event = cl.enqueue_copy(queue, host[half * c:(half + 1) * c], buf, src_offset=4 * off,
                                        is_blocking=False)
        queue.flush()
        wait(event)
        t0 = time.perf_counter()  # from here to the writes the device's queue is empty: the cost of the point
        at = 0
        for layer, host in zip(point.layers, point.host):
            if layer.forward:
                point.send[at] = layer.count
                at += 1
            point.send[at:at + host.size] = host
            at += host.size
        self.comm.iallgather(point.send, point.recv).Wait()
        at = 0
        for layer, host in zip(point.layers, point.host):
            c = layer.channels
            if layer.forward:
                counts, rows = point.recv[:, at], point.recv[:, at + 1:at + 1 + 2 * c]
                total, mean, var = combine_statistics(counts, rows[:, :c], rows[:, c:])
                self.totals[layer.key] = total
                host[:c], host[c:] = mean, var
                at += 1 + 2 * c
            else:
                total = self.totals.get(layer.key, layer.count * self.comm.size)
                host[:] = combine_gradient_sums(point.recv[:, at:at + 2 * c], layer.count, total)
                at += 2 * c
            for half, (buf, off) in enumerate(layer.locs):
                cl.enqueue_copy(queue, buf, host[half * c:(half + 1) * c], dst_offset=4 * off, is_blocking=False)
        queue.flush()
        self.seconds += time.perf_counter() - t0
