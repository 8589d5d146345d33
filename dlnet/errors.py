"""One exception family for everything a user can cause."""


class DlnetError(Exception):
    """Base of every error a user can cause: bad model, bad input, bad config, missing device."""


class ModelError(DlnetError):
    """The model file or graph is not what dlnet can run."""


class InputError(DlnetError):
    """Arguments given to run() or a command do not match what the model expects."""


class DeviceError(DlnetError):
    """No usable OpenCL device, or the device failed."""


class ConfigError(DlnetError):
    """A training or command configuration is invalid."""


def where(path=None, node=None):
    """Prefix for messages: 'model.onnx: node conv1 (Conv): '."""
    parts = []
    if path:
        parts.append(str(path))
    if node is not None:
        parts.append(f"node {node}")
    return (": ".join(parts) + ": ") if parts else ""
