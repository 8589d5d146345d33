"""The emitter: argument and scratch machinery for the kernel families (families/), and the generated sources' shared
pieces (GEMM program text, defines, fused activations). No decisions: the rules and the schedule make them."""
import numpy as np

from ..errors import ModelError
from ..graph.ir import Node
from ..graph.ops import get_op
from . import codegen
from .compile_worker import WGMMA_MARK
from .device import TILED_CORES
from .launch import Deferred, Launch, PendingKernel
from .rules import b_vec_fits, round_up
from .runtime import DTYPE_TO_C, cl, kernel_source


def core_source(core, tiles=None):
    """The text of a GEMM core with what it needs before it (tiles: the core's, whose MMA_EMULATED, tests on a device
    without PTX, brings mma_emu.cl)."""
    if core == "gemm_mma":
        emu = "#define NT NTHREADS\n" + kernel_source("mma_emu") if tiles and tiles.get("MMA_EMULATED") else ""
        return kernel_source("gemm_fetch") + kernel_source("mma_tf32") + emu + kernel_source(core)
    if core in ("gemm_ldsm", "gemm_wgmma"):  # (gemm.cl's batch index and one store of two columns; no split-K)
        return "#define ZID get_group_id(2)\n#ifndef STORE2\n#define STORE2(m, n, v0, v1) { STORE(m, n, v0); " \
               "if ((n) + 1 < NN) STORE(m, (n) + 1, v1); }\n#endif\n" \
               "#define LDSM_ARGS KERNEL_ARGS, __global float* ws, ulong ws_off\n" + kernel_source("mma_tf32") + \
            kernel_source("ptx_lanes") + kernel_source(core)
    return kernel_source("gemm_fetch") + kernel_source(core) if core in TILED_CORES else kernel_source(core)


def wgmma_macro(tn, tf32=False, trans_a=False, trans_b=False):
    """gemm_wgmma.cl's WGMMA(d, da, db): d[0 .. tn / 2) += A B over one k step of an m64 block, A and B by
    shared-memory descriptors da, db: wgmma.mma_async m64n<tn>k16 on f16, A K-major or M-major (trans_a), B K-major or
    N-major (trans_b), or (tf32) m64n<tn>k8 on floats read as tf32 (K-major only: no transpose immediates). The
    instruction sits inside a PTX comment marked compile_worker.WGMMA_MARK, which compile_worker.sm90a_ptx takes out
    (its operands wired by the compiler)."""
    n = tn // 2
    regs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n))
    kind, tail = ("k8.f32.tf32.tf32", "p, 1, 1") if tf32 else \
        ("k16.f32.f16.f16", f"p, 1, 1, {int(trans_a)}, {int(trans_b)}")
    body = (f"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 2}, 0;\\n{WGMMA_MARK}wgmma.mma_async.sync.aligned."
            f"m64n{tn}{kind} {{{regs}}}, %{n}, %{n + 1}, {tail};\\n}}")
    return f'#define WGMMA(d, da, db) asm volatile("{body}" : {outs} : "l"(da), "l"(db), "r"(1) : "memory")\n'


def defines(d):
    return "".join(f"#define {k} {v}\n" for k, v in d.items())


GEOMETRY_NAMES = ("HC", "WC", "OHC", "OWC", "KHC", "KWC", "SHC", "SWC", "PHC", "PWC", "DHC", "DWC")


def compiled_geometry(values):
    """The head of a kernel whose geometry (H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW, in that order) is compiled
    in: their macros and geometry.cl's GEOMETRY, which a kernel states first to use them (cl/geometry.cl says why)."""
    return defines(dict(zip(GEOMETRY_NAMES, (int(v) for v in values), strict=True))) + kernel_source("geometry")


def gemm_source(core, tiles, strides, idx, act=None, has_c=False, aligned=(True, True), halves=None):
    """gemm.cl's program on a GEMM core: the tiles; C or not; the operand layout, by which of the strides (sam, sak,
    sbk, sbn, ...) are 1; operands in half (halves: {"A_HALF": 1, ...}); 16-byte copies of rows in the STAGES
    pipelines where rows are contiguous and every product's A / B offset is a multiple of 4 floats (aligned); IDX; a
    fused activation (act_macro)."""
    sam, sak, sbk, sbn = strides[:4]
    defs = dict(tiles)
    if has_c:
        defs["HAS_C"] = 1
    if sbn == 1:
        defs["B_ROWS"] = 1
    elif sbk == 1:
        defs["B_ALONG_K"] = 1
    if sam == 1 and sak != 1:
        defs["A_ALONG_M"] = 1
    if "STAGES" in tiles and core not in ("gemm_ldsm", "gemm_wgmma"):  # (gemm_fetch.cl)
        if core == "gemm_mma" and sak == 1 and sam % 4 == 0 and aligned[0]:
            defs["A_VEC"] = 1  # (the fp32 core's A tile is k-major: 4-byte copies)
        elif core == "gemm_mma" and sam == 1 and sak % 4 == 0 and aligned[0] and \
                tiles["TM"] // (16 * tiles["WARPS_M"]) % 2 == 0:
            defs["A_MVEC"] = 1  # (gemm_mma.cl's A tile k-major, its rows permuted: two m16 blocks a float4)
        if sbn == 1 and sbk % 4 == 0 and aligned[1] and b_vec_fits(core, tiles):
            defs["B_VEC"] = 1
        elif core == "gemm_mma" and sbk == 1 and sbn % 4 == 0 and aligned[1]:
            defs["B_KVEC"] = 1  # (gemm_mma.cl's B tile n-major: a weight read [N, K] as stored)
    defs["IDX"] = idx
    defs.update(halves or {})  # (precision "fp16": the operands stored in half, half.half_defines)
    head = wgmma_macro(tiles["TN"], "TF32" in tiles, "A_ALONG_M" in defs, "B_NK" not in tiles) \
        if core == "gemm_wgmma" else ""
    return defines(defs) + head + act_macro(act) + kernel_source("tf32_store") + kernel_source("gemm") + \
        core_source(core, tiles)


def gemm_args(aa, ba, ca, ya, boff, M, N, K, strides, idx, alpha=1.0, beta=0.0):
    """gemm.cl's arguments before the split-K workspace: (buffer, offset) lists aa..ya, the per-batch offset table
    `boff`, and element strides (sam, sak, sbk, sbn, scm, scn) as IDX; y is row-major with N columns."""
    I = np.int32 if idx == "int" else np.int64
    return aa + ba + ca + ya + [boff, np.int32(M), np.int32(N), np.int32(K)] + [I(v) for v in strides] + [
        I(N), I(1), np.float32(alpha), np.float32(beta)]


def act_macro(act, T="float"):
    """ACT(v) for a fused unary pointwise epilogue given as (op name, attrs) or None."""
    if not act:
        return "#define ACT(v) (v)\n"
    op, attrs = act
    node = Node(op, [], [], dict(attrs))
    return f"#define ACT(v) {get_op(op).c(node.attrs, ['(v)'], T)}\n"



class Emitter:
    """The argument and scratch machinery the kernel families emit through: where a value lives (loc, args),
    small constant tables (meta), launches (emit), blocks of the arena free at a node (arena_block) and scratch
    pools bound once their sizes are known (finish). It decides nothing.

    measured: the tuner's tile model and per-layer tiles for this device (tuner.Measured), or None: the rules'."""

    def __init__(self, ctx, graph, plan, act_buf, const_buf, measured=None):
        self.ctx = ctx
        self.dev = ctx.dev
        self.options = ctx.options
        self.measured = measured
        self.graph = graph
        self.plan = plan
        self.act_buf = act_buf
        self.const_buf = const_buf
        self.launches = []
        self.keepalive = []  # small metadata buffers the launches read
        self.layer = ""  # the node being lowered, for per-layer profiles
        self.node = None  # ... and the node itself
        self.scratch = {}  # pool name -> buffer: "work" (im2col/colgrad), "splitk" (partial sums)
        self.scratch_users = []  # (kernel, argument index, pool)
        self.scratch_bytes = {}
        self.input_chunks = {}  # graph input index -> [(first, end) element of each chunk] (lower_in_chunks)

    # locations ---------------------------------------------------------------
    def loc(self, v):
        """(buffer, element offset) of a value (of its slice, for a BatchSlice)."""
        item = np.dtype(v.dtype).itemsize
        weight = self.plan.const_alias.get(v.id, v.id)  # a Reshape of a weight views the weight arena
        if v.const is not None or weight != v.id:
            return self.const_buf, self.plan.const_offsets[weight] // item
        rid, eoff = self.plan.alias_of.get(v.id, (v.id, 0))
        first = getattr(v, "first", 0)
        start = first * (v.size // v.shape[0]) if first else 0
        return self.act_buf, self.plan.act_offsets[rid] // item + eoff + start


    def args(self, v, image=0):
        """[buffer, element offset] of v (from its image `image` on: v.size / batch elements each)."""
        buf, off = self.loc(v)
        return [buf, np.uint64(off + image * (v.size // v.shape[0] if image else 0))]

    def dummy(self):
        return [self.const_buf, np.uint64(0)]

    @staticmethod
    def strides(v):
        return codegen.contiguous_strides(v.shape)

    @staticmethod
    def index_type(*sizes):
        """C type of generated index arithmetic: 32-bit while every operand's extent fits (offsets into the arena
        are separate 64-bit arguments; GPUs emulate 64-bit division), else 64-bit."""
        return "int" if max([1] + [int(s) for s in sizes]) < 2**31 - 1 else "long"

    def meta(self, values, dtype=np.int64, flags=cl.mem_flags.READ_ONLY):
        """A device buffer holding `values` (made once the device is open), kept for the plan's life."""
        arr = np.asarray(values, dtype=dtype)
        if arr.size == 0:
            arr = np.zeros(1, dtype)
        buf = Deferred(lambda: cl.Buffer(self.ctx.cl, flags | cl.mem_flags.COPY_HOST_PTR, hostbuf=arr))
        self.keepalive.append(buf)
        return buf

    def state(self, count, dtype=np.int32):
        """A device buffer of `count` zeros that this plan's kernels may write and that stays theirs from run to run
        (attention's counts of finished splits, which the last split sets back to 0)."""
        return self.meta(np.zeros(count, dtype), dtype, cl.mem_flags.READ_WRITE)

    def emit(self, source, name, args, gsize, lsize=None, label="", options=()):
        """Append a launch; its program is built in finish(), with every other program of the plan."""
        k = PendingKernel(source, name, options)
        k.set_args(*args)
        self.launches.append(Launch(k, tuple(int(g) for g in gsize), None if lsize is None else tuple(lsize), label,
                                    self.layer or label))

    def record_tile(self, label):
        """Write the tile the node being lowered runs with on it (node.schedule["tile"], printed in the IR)."""
        if self.node is not None:
            self.node.schedule["tile"] = label

    def written_in_place(self, x, y):
        """x's producer already wrote it inside y (the planner placed x in y's block)."""
        rid, _ = self.plan.alias_of.get(x.id, (x.id, 0))
        return rid == self.plan.alias_of.get(y.id, (y.id, 0))[0] and rid != x.id

    def arena_room(self):
        """Bytes of the largest block of the activation arena free while the current node runs."""
        return max([stop - start for start, stop in self._free_blocks()] + [0])

    def arena_block(self, nbytes):
        """Byte offset of `nbytes` in the activation arena that are free while the current node runs (the
        planner's plan.free_at), or None where no free block holds them."""
        for start, stop in self._free_blocks():
            if start + nbytes <= stop:
                return start
        return None

    def _free_blocks(self):
        if self.node is None or not self.node.outputs:
            return []
        return [(round_up(off, 256), off + size if size is not None else self.plan.act_bytes)
                for off, size in self.plan.free_at.get(self.node.outputs[0].id, [])]

    def use_scratch(self, kernel, index, nbytes, pool):
        """Argument `index` of `kernel` is the plan's scratch buffer `pool`, which must hold at least `nbytes`."""
        self.scratch_users.append((kernel, index, pool))
        self.scratch_bytes[pool] = max(self.scratch_bytes.get(pool, 0), nbytes)

    def finish(self):
        """Bind the scratch buffers (one per pool for the plan: its launches run in order) once sizes are known,
        build every program of the plan at once, and bind each launch's arguments to its kernel."""
        for pool, nbytes in self.scratch_bytes.items():
            self.scratch[pool] = self.ctx.alloc(nbytes)
        for kernel, index, pool in self.scratch_users:
            kernel.set_arg(index, self.scratch[pool])
        pending = [launch for launch in self.launches if isinstance(launch.kernel, PendingKernel)]
        self.ctx.build_all([launch.kernel.key for launch in pending])
        for launch in pending:
            try:
                launch.pending, launch.kernel = launch.kernel, launch.kernel.bind(self.ctx)
            except cl.Error as e:
                raise ModelError(f"{launch.label}: binding kernel {launch.kernel.name} arguments failed: {e}") from e
        self.keepalive = [b.get() if isinstance(b, Deferred) else b for b in self.keepalive]

    def _typed(self, source, dtype, idx_dtype=None):
        d = {"T": DTYPE_TO_C[dtype]}
        if idx_dtype:
            d["IT"] = DTYPE_TO_C[idx_dtype]
        head = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if dtype == "float64" else ""
        return head + defines(d) + kernel_source(source)
