"""dlnet: a static-graph deep-learning microframework. ONNX in, OpenCL kernel launches out."""
from . import optim
from .errors import ConfigError, DeviceError, DlnetError, InputError, ModelError
from .generate import generate
from .kernels.options import Options
from .kernels.runtime import Context, devices
from .net import Net
from .session import InferenceSession, get_available_providers
from .train import Trainer

__all__ = ["ConfigError", "Context", "DeviceError", "DlnetError", "InferenceSession", "InputError", "ModelError", "Net",
           "Options", "Trainer", "devices", "generate", "get_available_providers", "optim"]
__version__ = "0.1.0"


def __getattr__(name):
    """dlnet.torch (the PyTorch bridge) imports torch, so it loads on first use."""
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'dlnet' has no attribute {name!r}")
