"""Matrix products: Gemm and MatMul on the tiled GPU cores (gemm.cl over gemm_core.cl / gemm_mma.cl), gemv.cl and
gemv_rows.cl / gemv_mma.cl for products of few rows, gemv_cols.cl for those of few rows or a short K whose B is
stored by rows (a fully connected layer's gradients), gemm_cpu.cl on CPUs; split-K where a grid cannot fill the
device."""
import numpy as np

from ...errors import ModelError
from ...graph.ops.transformer import element_strides
from ...graph.passes.layout import tf32_exact
from .. import codegen
from ..device import TILED_CORES
from ..emitter import act_macro, defines, gemm_args, gemm_source
from ..half import half_defines, tf32_defines, without_copies
from ..rules import (
    GEMM_CPU_TILES,
    GEMM_TILES,
    GEMV_COLS_TILES,
    GEMV_REG_ROWS,
    GEMV_ROWS_TILES,
    GEMV_TILES,
    GPU_TILE_MODEL,
    OUTER_TILES,
    SPLITK_SCRATCH_MAX,
    WGMMA_K0,
    Pick,
    core_tiles,
    launch_geometry,
    ldsm_f16_tiles,
    ldsm_product,
    pick_splits,
    pick_tiles,
    resident_groups,
    round_up,
    split_mark,
    wgmma_product,
    wgmma_resident,
    wgmma_tiles,
)
from ..runtime import kernel_source
from .elementwise import cpu_math

FLOATS = ("float32", "float16")


class MatmulFamily:
    def gemm(self, node):
        a, b = node.inputs[0], node.inputs[1]
        c = node.inputs[2] if len(node.inputs) > 2 else None
        y = node.outputs[0]
        if a.dtype not in FLOATS or b.dtype not in FLOATS:  # (float16: half storage, precision "fp16")
            raise ModelError(f"node {node.name} ({node.op}): float32 only, got {a.dtype} x {b.dtype}")
        at = node.attrs
        ta, tb = at.get("transA", 0), at.get("transB", 0)
        M, N = y.shape[-2], y.shape[-1]
        K = a.shape[-2] if ta else a.shape[-1]
        batch = y.shape[:-2]
        nb = int(np.prod(batch, dtype=np.int64))

        def mat_strides(v):  # (a TransposeView read through its strides)
            s = codegen.broadcast_strides(v.shape, batch + v.shape[-2:], element_strides(v))
            return s[:-2], s[-2], s[-1]

        sa_b, sa0, sa1 = mat_strides(a)
        sb_b, sb0, sb1 = mat_strides(b)
        sam, sak = (sa1, sa0) if ta else (sa0, sa1)
        sbk, sbn = (sb1, sb0) if tb else (sb0, sb1)
        cs = codegen.broadcast_strides(c.shape, y.shape) if c is not None else [0] * y.rank
        algo = node.schedule["algo"]  # (schedule.py; Lowerer.lower makes sure there is one)
        if algo == "gemm_cpu":
            self.gemm_cpu(node, a, b, c, y, M, N, K, sam, sak, sbk, sbn, cs)
            return
        sc_b, scm, scn = cs[:-2], cs[-2], cs[-1]
        skinny = {"gemv_cols": self.gemv_cols, "gemm_outer": self.gemm_outer}.get(
            algo, self.gemv if algo.startswith("gemv") else None)
        if skinny is not None and skinny(a, b, c, y, M, N, K, sam, sak, sbk, sbn, scm, scn, at, node.name):
            return
        if algo != "gemm":  # (a view's offset not a multiple of 4 floats: gemv.cl cannot read it)
            node.schedule["algo"] = "gemm"
        table = np.zeros((max(nb, 1), 4), np.int64)
        for bi, idx in enumerate(np.ndindex(*batch) if batch else [()]):
            table[bi] = [sum(i * s for i, s in zip(idx, sa_b)), sum(i * s for i, s in zip(idx, sb_b)),
                         sum(i * s for i, s in zip(idx, sc_b)), bi * M * N]
        idx = self.index_type(a.size, b.size, y.size, c.size if c is not None else 0)
        self._gemm_launch(self.args(a), self.args(b), self.args(c) if c is not None else None, self.args(y), table,
                          M, N, K, (sam, sak, sbk, sbn, scm, scn), idx, at.get("act"), at.get("alpha", 1.0),
                          at.get("beta", 1.0), f"{node.name} Gemm",
                          halves=self._operand_defines(node, a, b, c, y, M, N, K))

    def _operand_defines(self, node, a, b, c, y, M, N, K):
        """gemm.cl's defines for how the operands are stored: in half (precision "fp16"), or, in a product wgmma
        takes on tf32, B a weight already rounded to tf32 (B_TF32: layout.tf32_weights; gemm_wgmma.cl then rounds A
        alone), A or y stored rounded to tf32 (tf32_defines)."""
        defs = dict(half_defines(A=a, B=b, C=c, Y=y), **tf32_defines(node)) or None
        if self.dev.tensor_cores and b.const is not None and not b.param and \
                wgmma_product(self.dev, self.options, M, N, K) and tf32_exact(b.const):
            defs = dict(defs or {}, B_TF32=1)
        return defs

    def _gemm_launch(self, aa, ba, ca, ya, table, M, N, K, strides, idx, act, alpha, beta, label, where="gemm",
                     halves=None):
        """gemm.cl on the device's core: len(table) products y = act(alpha A B + beta C), M x N x K, addressed by
        (buffer, offset) arguments aa..ya (ca None: no C), per-batch offsets `table` and element strides
        (sam, sak, sbk, sbn, scm, scn); y is row-major with N columns. where: the kind of product, for the tuner
        (with the operands' layout: A's rows and B's columns contiguous or not)."""
        nb = len(table)
        offs = np.asarray(table).reshape(nb, 4)
        aligned = (aa[1] % 4 == 0 and not (offs[:, 0] % 4).any(), ba[1] % 4 == 0 and not (offs[:, 1] % 4).any())
        sam, sak, sbk, sbn = strides[:4]
        f16 = self._ldsm_f16(aa, ba, offs, M, N, K, strides, halves, act) if where == "gemm" else None
        if f16 is not None:
            pick = self._pick_ldsm(M, N, f16, "wgmma" if "WG" in f16 else "ldsm_f16")
        elif where == "gemm" and self.dev.ldsm_tf32 and sak == 1 and sbk == 1 and sam % 4 == 0 and \
                sbn % 4 == 0 and all(aligned) and (wgmma_product(self.dev, self.options, M, N, K) or
                                                   ldsm_product(self.dev, self.options, M, N, K)):
            tiles = wgmma_tiles(self.dev, self.options, M, N, K, act)  # (Hopper: wgmma on tf32)
            pick = self._pick_ldsm(M, N, tiles, "wgmma") if tiles else \
                self._pick_ldsm(M, N, GEMM_TILES["ldsm_tf32"]["huge"], "ldsm")
        else:
            layout = f"{'r' if sak == 1 else 'c'}{'r' if sbn == 1 else 'c'}"
            pick = self.pick(M, N, K, nb, True, f"{where} {layout}")
        core, tiles, lsize, (g0, g1) = pick
        if core not in ("gemm_ldsm", "gemm_wgmma"):
            tiles = without_copies(tiles, halves, ("A", "B"))  # (precision "fp16")
        elif N % 2 == 0 and ya[1] % 2 == 0:  # (y's rows contiguous, N columns: pairs of columns stored as one)
            halves = dict(halves or {}, Y_PAIRS=1)
            if core == "gemm_wgmma" and self.options.wgmma_staged_y and ca is not None and N % 8 == 0 and \
                    ya[1] % 8 == 0 and not (offs[:, 3] % 8).any():  # (... runs of 8 from __local memory: Options)
                halves["Y_ROWS8"] = 1
                if self.node is not None:
                    self.record_tile(self.node.schedule["tile"] + "/y8")
        src = gemm_source(core, tiles, strides, idx, act, ca is not None, aligned, halves)
        args = gemm_args(aa, ba, ca if ca is not None else self.dummy(), ya, self.meta(np.asarray(table).ravel()), M,
                         N, K, strides, idx, alpha, beta)
        self._matrix(src, "gemm", args, pick, tiles, (g0, g1, nb), M, N, K, label)

    def _pick_ldsm(self, M, N, tiles, name):
        """A tile of gemm_ldsm.cl (rules.GEMM_TILES["ldsm_tf32"] / ["ldsm_f16"]) or, named "wgmma", of
        gemm_wgmma.cl: whole K, no split, not tuned per layer."""
        core = "gemm_wgmma" if name == "wgmma" else "gemm_ldsm"
        tiles = core_tiles(self.dev, self.options, tiles, core)
        lsize, grid = launch_geometry(core, tiles, M, N)
        self.record_tile(f"{name}{tiles['TM']}x{tiles['TN']}{split_mark(tiles)}")
        return Pick(core, tiles, lsize, grid, f"{name}:{tiles['TM']}")

    def _ldsm_f16(self, aa, ba, offs, M, N, K, strides, halves, act=None):
        """gemm_ldsm.cl's f16 tiles where A and B are stored in half (precision "fp16" on NVIDIA), A's rows or columns
        (A_ALONG_M: a weight gradient's activations) and B's rows or columns contiguous and every row 16-byte aligned
        (B_NK: B stored [N, K]); on Hopper gemm_wgmma.cl's tiles (Options.wgmma_mn: for A and B along M and N too);
        else None."""
        sam, sak, sbk, sbn = strides[:4]
        if not halves or "A_HALF" not in halves or "B_HALF" not in halves or (sak != 1 and sam != 1) or \
                (sbn != 1 and sbk != 1):
            return None
        starts = [aa[1], ba[1]] + [int(o) for o in offs[:, :2].ravel()]
        if any(v % 8 for v in starts + [sam if sak == 1 else sak, sbk if sbn == 1 else sbn]):
            return None
        # Hopper's wgmma where it runs: A [M, K] and B [N, K], and with Options.wgmma_mn A [K, M] or B [K, N] (its
        # transposed operands) in products at least a tile wide (attention's products by v, d 64, stay on ldsm)
        if sbk == 1 and sak == 1 or self.options.wgmma_mn and N >= 128:
            tiles = wgmma_tiles(self.dev, self.options, M, N, K, act)
            if tiles is not None:
                return tiles if sbk == 1 else {k: v for k, v in tiles.items() if k != "B_NK"}
        tiles = ldsm_f16_tiles(self.dev, self.options, M, N, K, len(offs), k_rows=sak == 1 or sbk == 1)
        return None if tiles is None else dict(tiles, **({"B_NK": 1} if sbn != 1 else {}))

    def gemv(self, a, b, c, y, M, N, K, sam, sak, sbk, sbn, scm, scn, at, name):
        """A product of at most GEMV_MAX_ROWS rows on a GPU, with B's columns contiguous along k (Gemm transB=1
        weights): gemv.cl (at most GEMV_REG_ROWS rows) or gemv_rows.cl streams B once. False where it does not
        apply (the GEMM core takes it)."""
        if M > self.options.gemv_max_rows or sak != 1 or sbk != 1 or K % 4 or sam % 4 or sbn % 4 or \
                self.loc(a)[1] % 4 or self.loc(b)[1] % 4 or max(a.size, b.size, y.size) >= 2**31:
            return False
        if M > GEMV_REG_ROWS:
            self.gemv_rows(a, b, c, y, M, N, K, sam, sbn, scm, scn, at, name)
            return True
        LK, LN, NC = GEMV_TILES
        if -(-N // (LN * NC)) < 2 * self.dev.compute_units:
            NC = 1  # fewer columns per work-group where the grid would leave compute units idle
        defs = {"MR": M, "LK": LK, "LN": LN, "NC": NC, **half_defines(A=a, B=b, C=c, Y=y)}
        if c is not None:
            defs["HAS_C"] = 1
        src = defines(defs) + act_macro(at.get("act")) + kernel_source("gemv_half") + kernel_source("gemv")
        args = self._operands(a, b, c, y) + [
            np.int32(v) for v in (M, N, K, sam, sbn, scm, scn)] + [
            np.float32(at.get("alpha", 1.0)), np.float32(at.get("beta", 1.0))]
        groups = -(-N // (LN * NC))
        self.record_tile(f"{LK}x{LN}x{NC}")
        self.emit(src, "gemv", args, (groups * LK, LN), (LK, LN), f"{name} Gemm gemv")
        return True

    def gemv_rows(self, a, b, c, y, M, N, K, sam, sbn, scm, scn, at, name):
        """gemv.cl's product for more rows: gemv_mma.cl on NVIDIA tensor cores in tf32 mode, else gemv_rows.cl; K
        split into slices where the column blocks alone leave resident work-group slots idle (partial sums in a free
        block of the arena, else in scratch, summed by gemv_rows_reduce)."""
        mma, rows_tiles = self.options.gemv_mma, self.options.gemv_rows_tiles or GEMV_ROWS_TILES
        if mma and (-(-M // 16) * 16 * mma["KC"] // 4) % (32 * mma["WARPS"]):
            mma = None  # (a chunk of A is whole float4s per work-item)
        if self.dev.tensor_cores and mma:
            kernel, tiles = "gemv_mma", mma
            KC = tiles["KC"]
            lsize, cols = (32 * tiles["WARPS"], 1), 8 * tiles["WARPS"] * tiles["NBW"]
            defs = {"MR": M, "WARPS": tiles["WARPS"], "NBW": tiles["NBW"], "KC": KC}
        else:
            kernel, tiles = "gemv_rows", rows_tiles[min([r for r in rows_tiles if r >= M] or [max(rows_tiles)])]
            LK, LN, NC, KC = tiles["LK"], tiles["LN"], tiles["NC"], tiles["KC"]
            while 4 * M * KC > self.dev.local_mem and KC > 4 * LK:
                KC //= 2
            KC4 = KC // 4
            lsize, cols = (LK, LN), LN * NC
            red_rows = max(1, min(M, M * KC // (LN * NC * (LK + 1))))  # rows of partial sums per pass of lane sums
            defs = {"MR": M, "LK": LK, "LN": LN, "NC": NC, "KC4": KC4, "RED_ROWS": red_rows,
                    "LOCAL4": max(M * KC4, -(-LN * NC * red_rows * (LK + 1) // 4))}
            if tiles.get("pf") and (M * KC4) % (LK * LN) == 0:
                defs["PREFETCH_A"] = 1
        blocks, chunks = -(-N // cols), -(-K // KC)
        splits, per_split = self._skinny_splits(blocks, chunks, tiles["per_cu"], M, N)
        defs["SPLITS"] = splits
        if c is not None:
            defs["HAS_C"] = 1
        defs.update(half_defines(A=a, B=b, C=c, Y=y))  # (gemv_rows.cl; gemv_mma.cl reads float32: schedule.Gemv)
        src = defines(defs) + act_macro(at.get("act")) + kernel_source("gemv_half") + kernel_source("gemv_epilogue") + (
            kernel_source("mma_tf32") if kernel == "gemv_mma" else "") + kernel_source(kernel)
        args = self._operands(a, b, c, y) + [
            np.int32(v) for v in (N, K, sam, sbn, scm, scn)] + [
            np.float32(at.get("alpha", 1.0)), np.float32(at.get("beta", 1.0)), np.int32(per_split)]
        label = f"{name} Gemm {kernel}"
        self.record_tile(f"{M}x{cols}x{KC}" + (f"/{splits}" if splits > 1 else ""))
        grid = (blocks * lsize[0], lsize[1] * splits)
        self._skinny_launches(src, kernel, args, args, grid, lsize, label, M, N, splits)

    def _skinny_splits(self, blocks, chunks, per_cu, M, N):
        """(slices, chunks per slice) of K for a skinny product of `blocks` column blocks over `chunks` chunks of
        K: Options.gemv_rows_splits, else whole waves of the resident slots, each work-group costing its chunks and
        about one more; the partial sums fit the arena's free room or the split-K scratch."""
        max_splits = min(chunks, max(1, max(self.arena_room(), SPLITK_SCRATCH_MAX) // (4 * M * N)))
        if self.options.gemv_rows_splits:
            splits = min(self.options.gemv_rows_splits, max_splits)
        else:
            slots = per_cu * self.dev.compute_units
            splits = min(range(1, max_splits + 1),
                         key=lambda s: (-(-blocks * s // slots) * (-(-chunks // s) + 1), s))
        per_split = -(-chunks // splits)
        return -(-chunks // per_split), per_split  # (no empty slices)

    def _skinny_launches(self, src, kernel, args, reduce_args, grid, lsize, label, M, N, splits):
        """A skinny product's launch; with splits > 1 its partial sums [splits, M, N] go to a free block of the
        arena (else the split-K scratch), and gemv_rows_reduce (gemv_epilogue.cl) adds them and applies the
        epilogue (reduce_args: its arguments before the partial sums')."""
        if splits == 1:
            self.emit(src, kernel, args + self.dummy(), grid, lsize, label)
            return
        nbytes = 4 * splits * M * N
        off = self.arena_block(nbytes)
        ws = [self.act_buf, np.uint64(off // 4)] if off is not None else self.dummy()
        self.emit(src, kernel, args + ws, grid, lsize, label + f" splitK{splits}")
        self.emit(src, "gemv_rows_reduce", reduce_args + ws, (round_up(N, 64), M), (64, 1), label + " reduce")
        if off is None:
            self.use_scratch(self.launches[-2].kernel, len(args), nbytes, "splitk")
            self.use_scratch(self.launches[-1].kernel, len(reduce_args), nbytes, "splitk")

    def _operands(self, a, b, c, y):
        """The skinny products' first arguments: A, B, C (a dummy where there is none) and y, each with its offset."""
        return self.args(a) + self.args(b) + (self.args(c) if c is not None else self.dummy()) + self.args(y)

    @staticmethod
    def _cols_source(defs, a, b, c, y, at):
        """gemv_cols.cl's program with `defs`, the operands' storage (half or float), C and the activation."""
        defs = dict(defs, **half_defines(A=a, B=b, C=c, Y=y), **({"HAS_C": 1} if c is not None else {}))
        return defines(defs) + act_macro(at.get("act")) + kernel_source("gemv_half") + \
            kernel_source("gemv_epilogue") + kernel_source("gemv_cols")

    def _by_rows(self, a, b, y, N, sbk, sbn):
        """Can gemv_cols.cl read B [K, N] (rows contiguous along n) and write y four floats at a time (its strides
        and columns in int)?"""
        return sbn == 1 and N % 4 == 0 and sbk % 4 == 0 and self.loc(b)[1] % 4 == 0 and self.loc(y)[1] % 4 == 0 \
            and max(a.size, b.size, y.size) < 2**31

    def gemv_cols(self, a, b, c, y, M, N, K, sam, sak, sbk, sbn, scm, scn, at, name):
        """A product of at most Options.gemv_cols_max_rows rows with B [K, N] stored by rows (dX = dy W of a fully
        connected layer: W changes every step): gemv_cols.cl streams B once, K split into slices where the column
        blocks alone leave resident work-group slots idle. False where B's layout does not allow it, or K is 0."""
        if K == 0 or not self._by_rows(a, b, y, N, sbk, sbn):
            return False
        t = GEMV_COLS_TILES
        LN, LK, KC = t["LN"], t["LK"], t["KC"]
        red = max(1, M * KC // (4 * LN * LK))  # rows of y per pass of the lanes' sums
        blocks, chunks = -(-N // (4 * LN)), -(-K // KC)
        splits, per_split = self._skinny_splits(blocks, chunks, t["per_cu"], M, N)
        defs = {"MR": M, "LN": LN, "LK": LK, "KC": KC, "RED": red, "SPLITS": splits,
                "LOCALF": max(M * KC, 4 * red * LN * LK)}
        src = self._cols_source(defs, a, b, c, y, at)
        head = self._operands(a, b, c, y)
        tail = [np.float32(at.get("alpha", 1.0)), np.float32(at.get("beta", 1.0)), np.int32(per_split * KC)]
        args = head + [np.int32(v) for v in (N, K, sam, sak, sbk, scm, scn)] + tail
        reduce_args = head + [np.int32(v) for v in (N, K, sam, sbn, scm, scn)] + tail
        self.record_tile(f"{M}x{4 * LN}x{KC}" + (f"/{splits}" if splits > 1 else ""))
        self._skinny_launches(src, "gemv_cols", args, reduce_args, (blocks * LN, LK * splits), (LN, LK),
                              f"{name} Gemm gemv_cols", M, N, splits)
        return True

    def gemm_outer(self, a, b, c, y, M, N, K, sam, sak, sbk, sbn, scm, scn, at, name):
        """A product over a short K (dW = dy^T x of a fully connected layer at a small batch) with B [K, N] stored
        by rows: gemv_cols.cl's gemm_outer, a work-item per RM rows x 4 columns, bound by writing y. False where
        B's layout does not allow it."""
        if not self._by_rows(a, b, y, N, sbk, sbn):
            return False
        LN, RM = OUTER_TILES["LN"], OUTER_TILES["RM"]
        src = self._cols_source({"LN": LN, "RM": RM, "SPLITS": 1}, a, b, c, y, at)
        args = self._operands(a, b, c, y) + [
            np.int32(v) for v in (M, N, K, sam, sak, sbk, scm, scn)] + [
            np.float32(at.get("alpha", 1.0)), np.float32(at.get("beta", 1.0))]
        self.record_tile(f"{RM}x{4 * LN}")
        self.emit(src, "gemm_outer", args, (round_up(N // 4, LN), -(-M // RM)), (LN, 1), f"{name} Gemm outer")
        return True

    def gemm_cpu(self, node, a, b, c, y, M, N, K, sam, sak, sbk, sbn, cs):
        """A 2-D Gemm on a CPU device: a constant B packed here, once, into panels of NR columns; any other B (a
        parameter, an activation) packed so by gemm_cpu_pack before each run (cpu_product)."""
        at = node.attrs
        packed = None
        if b.const is not None and not b.param:
            NR = 8 * GEMM_CPU_TILES["NV"]
            NB = -(-N // NR)
            bmat = np.lib.stride_tricks.as_strided(np.asarray(b.const, np.float32).ravel(), (K, N),
                                                   (4 * sbk, 4 * sbn))
            panels = np.zeros((K, NB * NR), np.float32)
            panels[:, :N] = bmat
            packed = [self.meta(panels.reshape(K, NB, NR).transpose(1, 0, 2).ravel(), np.float32), np.uint64(0)]
        self.cpu_product(self.args(a), packed or self.args(b), self.args(c) if c is not None else None, self.args(y),
                         M, N, K, (sam, sak, sbk, sbn, cs[-2], cs[-1]), half_defines(A=a, B=b, C=c, Y=y),
                         f"{node.name} Gemm", at.get("act"), at.get("alpha", 1.0), at.get("beta", 1.0),
                         packed=packed is not None)

    def cpu_product(self, a, b, c, y, M, N, K, strides, halves, label, act=None, alpha=1.0, beta=0.0, packed=False,
                    pools=None):
        """gemm_cpu.cl's y = act(alpha A B + beta C), M x N x K, y's rows contiguous: a, b, c, y are (buffer, element
        offset) argument pairs (c None: no C), strides (sam, sak, sbk, sbn, scm, scn); b already in panels (packed)
        or packed into the plan's "pack" scratch by gemm_cpu_pack first (and an A whose rows are not contiguous into
        "pack_a" in panels of MR rows: Options.gemm_cpu_pack_a, the tile's "/pa"); pools: {"a" | "b" | "y": (pool,
        bytes)}, operands in a scratch pool of the plan (their pair's buffer a placeholder, bound at finish). Records
        the node's tile."""
        sam, sak, sbk, sbn, scm, scn = strides
        MR, NV = min(M, GEMM_CPU_TILES["rows"]), GEMM_CPU_TILES["NV"]
        NR = 8 * NV
        NB = -(-N // NR)
        pools = pools or {}
        pack_a = sak != 1 and M > MR and NB > 1 and self.options.gemm_cpu_pack_a  # (A read by NB column blocks)
        self.record_tile(f"{MR}x{NR}" + ("/pa" if pack_a else ""))
        defs = {"MR": MR, "NV": NV, **(halves or {})}
        if c is not None:
            defs["HAS_C"] = 1
        if sak == 1 and self.options.gemm_cpu_unit_k:
            defs["A_UNIT_K"] = 1
        if pack_a:
            defs["A_PACKED"] = 1
        act = act_macro(act)  # (a GELU epilogue: cpu_math.cl's erf, not PoCL's out-of-line one)
        src = defines(defs) + cpu_math(act) + act + kernel_source("gemm_cpu")
        pack_bytes = 4 * K * NB * NR
        if pack_a:  # (gemm_cpu_pack on A^T, in panels of MR)
            MB = -(-M // MR)
            pack_src = defines({"MR": MR, "NV": NV, "PW": MR, **({"B_HALF": 1} if "A_HALF" in defs else {})}) + \
                act_macro(None) + kernel_source("gemm_cpu")
            self.emit(pack_src, "gemm_cpu_pack", a + self.dummy() + [np.int32(M), np.int32(K), np.int64(sak),
                                                                      np.int64(sam)], (MB,), (1,), label + " pack A")
            self.use_scratch(self.launches[-1].kernel, 2, 4 * K * MB * MR, "pack_a")
            if "a" in pools:
                self.use_scratch(self.launches[-1].kernel, 0, pools["a"][1], pools["a"][0])
            a, pools = self.dummy(), dict(pools, a=("pack_a", 4 * K * MB * MR))
        if not packed:
            self.emit(src, "gemm_cpu_pack", b + self.dummy() + [np.int32(N), np.int32(K), np.int64(sbk),
                                                                 np.int64(sbn)], (NB,), (1,), label + " pack")
            self.use_scratch(self.launches[-1].kernel, 2, pack_bytes, "pack")
            if "b" in pools:
                self.use_scratch(self.launches[-1].kernel, 0, pools["b"][1], pools["b"][0])
            b = self.dummy()
        self.emit(src, "gemm_cpu", a + b + (c if c is not None else self.dummy()) + y + [
            np.int32(M), np.int32(N), np.int32(K), np.int64(sam), np.int64(sak), np.int64(scm), np.int64(scn),
            np.float32(alpha), np.float32(beta)], (-(-M // MR), NB), (1, 1), label)
        kernel = self.launches[-1].kernel
        if not packed:
            self.use_scratch(kernel, 2, pack_bytes, "pack")
        for name, index in (("a", 0), ("y", 6)):
            if name in pools:
                self.use_scratch(kernel, index, pools[name][1], pools[name][0])

    def pick(self, M, N, K, batches, deep, where):
        """rules.pick_tiles with this device's measurements; the node being lowered records the tile it took."""
        pick = pick_tiles(self.dev, self.options, M, N, K, batches, deep, where, self.measured)
        self.record_tile(pick.label)
        return pick

    def _matrix(self, src, name, args, pick, tiles, grid, M, NN, KK, label):
        """Launch a GEMM-shaped kernel; on GPUs split K when the grid alone cannot fill the device. Its launches
        carry the tunable product's (layer key, tile, choices) for tuner.tune_layers."""
        start = len(self.launches)
        self._matrix_launches(src, name, args, pick.core, tiles, pick.lsize, grid, M, NN, KK, label)
        tile = (pick.key, pick.name, pick.choices) if pick.key else None
        for launch in self.launches[start:]:
            launch.tile = tile

    def _matrix_launches(self, src, name, args, core, tiles, lsize, grid, M, NN, KK, label):
        groups = grid[0] // (lsize[0] if lsize else 1) * grid[1] * grid[2]
        per_split = 4 * grid[2] * M * NN  # bytes of partial sums per slice
        room = max(self.arena_room(), SPLITK_SCRATCH_MAX)
        splits = 1
        if core in TILED_CORES:  # every resident slot of the device busy
            model = self.measured.tile_model if self.measured is not None else GPU_TILE_MODEL
            target = resident_groups(tiles, model, self.options) * self.dev.compute_units
            splits = pick_splits(groups, target, KK, max_splits=room // per_split)
        elif core == "gemm_wgmma" and 0 < self.options.wgmma_split_k <= KK:  # (a weight gradient: few tiles, deep)
            target = wgmma_resident(tiles) * self.dev.compute_units
            splits = pick_splits(groups, target, KK, k0=WGMMA_K0, max_splits=room // per_split)
        if splits <= 1:
            self.emit(src, name, args + [self.dummy()[0], np.uint64(0)], grid, lsize, label)
            if core == "gemm_vec":  # the CPU conv path reads im2col's output from the work buffer
                self.use_scratch(self.launches[-1].kernel, len(args), 0, "work")
            return
        src = f"#define SPLITS {splits}\n" + src + kernel_source("gemm_reduce")
        nbytes = per_split * splits
        at = self.arena_block(nbytes)  # the partial sums: a free block of the arena, else their own buffer
        ws = [self.act_buf, np.uint64(at // 4)] if at is not None else [self.dummy()[0], np.uint64(0)]
        self.emit(src, name, args + ws, (grid[0], grid[1], grid[2] * splits), lsize, label + f" splitK{splits}")
        self.emit(src, name + "_reduce", args + ws, (round_up(NN, 64), M, grid[2]), (64, 1, 1), label + " reduce")
        if at is None:
            for launch in self.launches[-2:]:
                self.use_scratch(launch.kernel, len(args), nbytes, "splitk")

