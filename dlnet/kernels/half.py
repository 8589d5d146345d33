"""precision="fp16": what each kernel can read and write in half, and the device check.

Every kernel family declares its half I/O once, as a `HalfIO` (on the algorithm classes of schedule.py's ALGOS, and
in the HALF_IO table of the families for ops without a table); schedule.half_io looks them up, and the graph pass
(graph/passes/half.py) stores a float32 value in half where its producer writes half and every reader reads it.
Kernels read half with vload_half and write it with vstore_half (core OpenCL since 1.0, cl_khr_fp16 or not) under an
X_HALF define per operand, never in a second copy of the kernel; the arithmetic and accumulators stay float.
"""
from dataclasses import dataclass

from ..errors import DeviceError

ALL = "all"


@dataclass(frozen=True)
class HalfIO:
    """reads: the input indices the kernel reads in half (ALL: every one); writes: its float outputs in half (True:
    every one, or a tuple of output indices)."""
    reads: object = ()
    writes: object = False

    def reads_input(self, index):
        return self.reads == ALL or index in self.reads

    def writes_output(self, index):
        return self.writes is True or (isinstance(self.writes, tuple) and index in self.writes)


NONE = HalfIO()
EVERY = HalfIO(ALL, True)
READS = HalfIO(ALL, False)  # autocast's fp32 list (softmax, normalisation, reductions): half in, float32 out


def copy_pipeline_io(dev, io, reads=()):
    """`io` of a GEMM path as it runs on dev: on NVIDIA's tensor cores (dev.mma) its operands are read in float32,
    but for `reads`, for the cp.async pipeline (through registers half loads ran 2.4x slower: vgg16 features.7 fp16
    1.37 ms against 0.58); what it writes in half stays so."""
    return HalfIO(reads, io.writes) if dev.mma else io


def half_defines(**values):
    """{NAME_HALF: 1} for each keyword whose value (a graph Value or None) is stored in half."""
    return {f"{name}_HALF": 1 for name, v in values.items() if v is not None and v.dtype == "float16"}


def tf32_defines(node):
    """precision "tf32": Y_TF32 where node's kernel stores y rounded to tf32 (its schedule's tf32_y), A_TF32 where a
    product reads such an A (tf32_a; schedule.tf32_producers)."""
    return {name: 1 for name, key in (("Y_TF32", "tf32_y"), ("A_TF32", "tf32_a")) if node.schedule.get(key)}


def without_copies(tiles, halves, operands):
    """The GEMM core's tiles without the cp.async pipeline (STAGES, NVIDIA: its 4- and 16-byte copies move floats)
    where one of `operands` ("A", "B", "X", "W") is stored in half: the register-staged path, which loads through
    LOAD_A / LOAD_B, then."""
    if "STAGES" in tiles and any(f"{name}_HALF" in (halves or {}) for name in operands):
        return {k: v for k, v in tiles.items() if k != "STAGES"}
    return tiles


PROBE = """__kernel void probe(__global const half* x, __global half* y, __global float* z) {
    const float8 v = vload_half8(0, x);
    vstore_half8(v * 2.0f, 0, y);
    vstore_half(vload_half(1, x) + 1.0f, 8, y);
    z[0] = vload_half(3, x);
}"""
_CHECKED = {}


def check_half_io(ctx):
    """A DeviceError where ctx's device cannot build or run half loads and stores (checked once per device)."""
    key = (ctx.info.platform, ctx.info.name, ctx.info.index)
    if key not in _CHECKED:
        _CHECKED[key] = _probe(ctx)
    if _CHECKED[key]:
        raise DeviceError(f"precision 'fp16' on {ctx.info.name}: the device cannot load and store half values "
                          f"({_CHECKED[key]}); use precision 'fp32' or 'tf32'")


def _probe(ctx):
    """'' where a vload_half / vstore_half kernel builds and gives the right numbers on ctx's device, else why not."""
    import numpy as np

    from .runtime import cl
    try:
        x = np.arange(1, 10, dtype=np.float16) / 4
        mf = cl.mem_flags
        bx = cl.Buffer(ctx.cl, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
        by, bz = cl.Buffer(ctx.cl, mf.READ_WRITE, 2 * 9), cl.Buffer(ctx.cl, mf.READ_WRITE, 4)
        program = cl.Program(ctx.cl, PROBE).build()
        program.probe(ctx.queue, (1,), None, bx, by, bz)
        y, z = np.empty(9, np.float16), np.empty(1, np.float32)
        cl.enqueue_copy(ctx.queue, y, by)
        cl.enqueue_copy(ctx.queue, z, bz, is_blocking=True)
    except cl.Error as e:
        return f"a vload_half / vstore_half kernel failed: {str(e).splitlines()[0]}"
    want = np.concatenate([x[:8] * 2, x[1:2] + 1])
    if not np.array_equal(y, want) or z[0] != np.float32(x[3]):
        return "a vload_half / vstore_half kernel gave wrong values"
    return ""
