"""Probe: can NVIDIA's OpenCL run PTX for sm_90a (Hopper's wgmma) handed to it as a program binary? Builds a kernel
from OpenCL C (whose compiler targets sm_90, where ptxas rejects wgmma), takes its PTX, swaps placeholder comments
left by inline asm for wgmma instructions, retargets it to sm_90a, and builds and runs it from the binary. Prints
what worked; asserts nothing.

    python3 bench/probes/ptx_sm90a.py
"""
import numpy as np
import pyopencl as cl

SRC = r"""
__kernel void k(__global float* y) {
    const int i = get_global_id(0);
    asm volatile("// @FENCE");
    asm volatile("// @COMMIT");
    asm volatile("// @WAIT");
    y[i] = 2.0f * i;
}
"""
SWAPS = {"// @FENCE": "wgmma.fence.sync.aligned;", "// @COMMIT": "wgmma.commit_group.sync.aligned;",
         "// @WAIT": "wgmma.wait_group.sync.aligned 0;"}


def main():
    plat = next(p for p in cl.get_platforms() if "NVIDIA" in p.name)
    dev = plat.get_devices()[0]
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, SRC).build()
    ptx = prg.get_info(cl.program_info.BINARIES)[0].decode()
    print("target line:", [ln for ln in ptx.splitlines() if ln.startswith(".target")])
    for variant in ("as is", "sm_90a", "sm_90a + wgmma"):
        text = ptx
        if variant != "as is":
            text = text.replace(".target sm_90", ".target sm_90a")
        if variant.endswith("wgmma"):
            for a, b in SWAPS.items():
                text = text.replace(a, b)
        try:
            p2 = cl.Program(ctx, [dev], [text.encode()]).build()
            y = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 256)
            p2.k(q, (256,), (128,), y)
            out = np.empty(256, np.float32)
            cl.enqueue_copy(q, out, y)
            print(f"{variant}: built and ran, correct={np.array_equal(out, 2.0 * np.arange(256))}")
        except Exception as e:  # (a probe: print what the driver said)
            print(f"{variant}: failed: {str(e)[:600]}")


if __name__ == "__main__":
    main()
