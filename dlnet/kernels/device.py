"""Device facts, resolved once per Context: the only place that reads an OpenCL device's vendor and type and the
precision asked for. Everything else reads a finished `Device`. Also the one place that sets the CPU device's
worker-thread count (PoCL's)."""
import os
import threading
from dataclasses import dataclass

from ..errors import ConfigError

# the matrix cores: gemm_vec.cl (CPUs: register-blocked, no barriers), gemm_core.cl (GPUs: __local tiles) and
# gemm_mma.cl (NVIDIA tensor cores in tf32, inline PTX mma.sync); the last two are "tiled"
TILED_CORES = ("gemm_core", "gemm_mma")


def is_nvidia(vendor, platform=""):
    return "NVIDIA" in vendor.upper() or "NVIDIA" in platform.upper()


@dataclass(frozen=True)
class Device:
    name: str
    is_cpu: bool  # PoCL and other CPU devices: host memory and cores, no __local tiles
    is_nvidia: bool  # inline PTX (cp.async, mma.sync) compiles
    precision: str  # "fp32", "tf32" or "fp16"
    compute_units: int
    local_mem: int  # bytes of __local memory a work-group may take
    core: str  # the matrix core convolutions and products run on: "gemm_vec" or "gemm_core"
    # products and convolutions on the tf32 tensor-core core (gemm_mma.cl) on NVIDIA: precision "tf32", and "fp16"
    # (options.fp16_mma), whose half operands are exact in tf32 (its f16 products: gemm_ldsm.cl where that applies)
    mma: bool = False
    # an NVIDIA Hopper GPU (compute capability 9): wgmma, in PTX built for sm_90a (gemm_wgmma.cl)
    wgmma: bool = False
    # precision "fp32" on NVIDIA's tensor cores (options.fp32_tf32x3; not with matrix_core "portable"): mma is set,
    # and the tf32 cores split each operand in two tf32 halves (mma_tf32.cl's TF32X3); the kernels that would round
    # to tf32 alone (wgmma, attention_mma.cl, gemv_mma.cl, weights rounded at load) stay off: tensor_cores is False
    tf32x3: bool = False
    # tests (options.matrix_core "mma_emulated", precision "tf32" or "fp16", a device without PTX): gemm_mma.cl with
    # its mma.sync and cp.async emulated (mma_emu.cl, gemm_fetch.cl), so the tensor-core core runs on PoCL too
    mma_emulated: bool = False

    @property
    def tensor_cores(self):
        """tf32 products on the tensor cores: precision "tf32" on NVIDIA (elsewhere tf32 means fp32)."""
        return self.precision == "tf32" and self.is_nvidia

    @property
    def ldsm_tf32(self):
        """Float products on gemm_ldsm.cl's tf32 core where rules.ldsm_product takes them: tf32, or fp32 split in
        tf32 halves."""
        return self.tensor_cores or self.tf32x3

    @property
    def half_storage(self):
        """precision "fp16": values whose kernels read and write half are stored in half (graph/passes/half.py),
        arithmetic in fp32 (vload_half / vstore_half are core OpenCL: every device, cl_khr_fp16 or not)."""
        return self.precision == "fp16"

    @property
    def tiled(self):
        """The device runs the tiled GPU cores (GPUs, or any device where options.matrix_core is "portable")."""
        return self.core in TILED_CORES

    @property
    def cp_async(self):
        """Global-to-local copies through cp.async pipelines (NVIDIA)."""
        return self.is_nvidia

    @property
    def kind(self):
        return "cpu" if self.is_cpu else "gpu"

    @staticmethod
    def resolve(info, precision, options, is_cpu=None, nvidia=None):
        """The facts of DeviceInfo `info` (is_cpu / nvidia: what a caller set on the Context instead)."""
        cpu = info.type == "CPU" if is_cpu is None else bool(is_cpu)
        nv = is_nvidia(info.vendor, info.platform) if nvidia is None else bool(nvidia)
        local = info.device.local_mem_size if info.device is not None else 48 << 10
        emulated = options.matrix_core == "mma_emulated" and precision in ("tf32", "fp16") and not nv
        core = "gemm_core" if not cpu or options.matrix_core == "portable" or emulated else "gemm_vec"
        cc = compute_capability(info.device) if nv and not cpu else None
        # (mma.sync on tf32 needs compute capability 8: fp32 on older NVIDIA GPUs, or of unknown capability, stays on
        # the FMA cores)
        x3 = precision == "fp32" and options.fp32_tf32x3 and options.matrix_core != "portable" and (cc or 0) >= 8
        mma = nv and (precision == "tf32" or precision == "fp16" and options.fp16_mma) or x3 or emulated
        return Device(info.name, cpu, nv, precision, info.compute_units, local, core, mma, cc == 9, x3, emulated)


def compute_capability(device):
    """An NVIDIA OpenCL device's compute capability major (cl_nv_device_attribute_query), else None."""
    try:
        return device.compute_capability_major_nv
    except Exception:  # (not NVIDIA's driver, no such query, or a test's stand-in device)
        return None


# PoCL's CPU device runs kernels on this many worker threads, read once, when the OpenCL platform starts in the
# process (the first clGetPlatformIDs). PoCL 3.0 (the pyopencl wheel's) reads POCL_MAX_PTHREAD_COUNT and reports
# the count as the device's compute units; POCL_CPU_MAX_CU_NUM is PoCL 4's name for it, which 3.0 ignores.
THREADS_VARIABLES = ("POCL_MAX_PTHREAD_COUNT", "POCL_CPU_MAX_CU_NUM")
_THREADS = {"fixed": None}
_THREADS_LOCK = threading.Lock()


def _platform_started():
    """Whether PoCL is loaded in this process already (then it has read its thread count)."""
    try:
        with open("/proc/self/maps") as f:
            return any("libpocl" in line for line in f)
    except OSError:
        return False


def _threads_from_env():
    """The count the environment sets (the first of THREADS_VARIABLES that holds a positive integer), else 0."""
    for name in THREADS_VARIABLES:
        text = os.environ.get(name, "").strip()
        if text.isdigit() and int(text) > 0:
            return int(text)
    return 0


def fix_threads(threads=0):
    """The CPU device's worker-thread count for this process, set here before the OpenCL platform first starts:
    `threads` (0: whatever the environment's POCL_MAX_PTHREAD_COUNT says, else one per core). Called by every
    Context before it looks for a device, and by `devices()`. The count cannot change once PoCL has started: asking
    for another one then is a ConfigError."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ConfigError(f"threads={threads!r}: expected a positive integer (the CPU device's worker threads) "
                          "or 0 for one per core")
    with _THREADS_LOCK:
        if _THREADS["fixed"] is None:
            if threads and not _platform_started():
                for name in THREADS_VARIABLES:
                    os.environ[name] = str(threads)
            _THREADS["fixed"] = _threads_from_env() or os.cpu_count() or 1
        fixed = _THREADS["fixed"]
    if threads and threads != fixed:
        raise ConfigError(f"threads={threads}: the CPU device's worker threads were fixed at {fixed} when OpenCL "
                          "started in this process (the first Context or devices() call); a process runs one count, "
                          "so ask for it before anything opens a device, or start a new process")
    return fixed
