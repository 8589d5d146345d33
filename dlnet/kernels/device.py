"""Device facts, resolved once per Context: the only place that reads an OpenCL device's vendor and type and the
precision asked for. Everything else reads a finished `Device`."""
from dataclasses import dataclass

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
    precision: str  # "fp32" or "tf32"
    compute_units: int
    local_mem: int  # bytes of __local memory a work-group may take
    core: str  # the matrix core convolutions and products run on: "gemm_vec" or "gemm_core"

    @property
    def tensor_cores(self):
        """tf32 products on the tensor cores: precision "tf32" on NVIDIA (elsewhere tf32 means fp32)."""
        return self.precision == "tf32" and self.is_nvidia

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
        core = "gemm_core" if not cpu or options.matrix_core == "portable" else "gemm_vec"
        return Device(info.name, cpu, nv, precision, info.compute_units, local, core)
