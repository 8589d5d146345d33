"""InferenceSession: onnxruntime's Python interface over a Net, so that code written for onnxruntime runs on dlnet
by changing its import.

    sess = InferenceSession("model.onnx", providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    name = sess.get_inputs()[0].name                 # .name, .shape (ints, names of symbolic dims), .type
    probs, = sess.run(None, {name: x})               # a list of numpy arrays, in the order asked (None: all)

Providers are onnxruntime's names mapped to OpenCL devices: "CPUExecutionProvider" is the CPU (through PoCL), a GPU
provider's name ("CUDAExecutionProvider", "OpenCLExecutionProvider", "ROCMExecutionProvider", ...) the GPU its
`device_id` option counts (among GPUs), and a dlnet device ("cpu", "gpu", "ocl:N") or Context is taken as it is.
As in onnxruntime, they are tried in order, one not available is passed over with a warning, and the CPU is the last
resort.
"""
import warnings

from .errors import InputError, ModelError
from .kernels.options import Options
from .kernels.runtime import Context, devices, is_nvidia
from .net import Net

CPU_PROVIDER = "CPUExecutionProvider"
# onnxruntime's providers that run on a GPU (or a GPU-like accelerator): each maps to an OpenCL GPU here
GPU_PROVIDERS = ("CUDAExecutionProvider", "OpenCLExecutionProvider", "ROCMExecutionProvider",
                 "MIGraphXExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider",
                 "DmlExecutionProvider", "WebGpuExecutionProvider", "CoreMLExecutionProvider")
DLNET_DEVICES = ("cpu", "gpu")  # and "ocl:N"


class NodeArg:
    """An input or output as onnxruntime describes it: name, shape (ints, strings for symbolic dims, None for a dim
    with neither), type ("tensor(float)", "tensor(int64)", ...)."""

    def __init__(self, name, shape, type):
        self.name = name
        self.shape = shape
        self.type = type

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class ModelMetadata:
    """onnxruntime's ModelMetadata: what the model file says about itself."""

    def __init__(self, model):
        self.producer_name = model.producer_name
        self.graph_name = model.graph.name
        self.domain = model.domain
        self.description = model.doc_string
        self.graph_description = model.graph.doc_string
        self.version = model.model_version
        self.custom_metadata_map = {p.key: p.value for p in model.metadata_props}


def get_available_providers():
    """onnxruntime's get_available_providers(): the providers this machine's OpenCL devices stand for."""
    return _available(devices())


class InferenceSession:
    """onnxruntime.InferenceSession over a dlnet Net.

    path_or_bytes: a file path, the model's bytes or an onnx.ModelProto. providers: onnxruntime's names (or
    (name, options) pairs), a dlnet device spec or a Context; None: the Context() default (DLNET_DEVICE, else the
    first GPU, else the CPU). provider_options: one dict per provider (onnxruntime's form; `device_id` is read).
    sess_options: a dlnet.Options for the Context the session opens (onnxruntime's SessionOptions are accepted and
    ignored). batch, tune, precision: Net.load_onnx's and Context's own.
    """

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, batch=None, tune=None,
                 precision="fp32"):
        options = sess_options if isinstance(sess_options, Options) else None
        ctx, self._providers = _resolve_providers(providers, provider_options, options, precision)
        if isinstance(path_or_bytes, (bytearray, memoryview)):
            path_or_bytes = bytes(path_or_bytes)
        self.net = Net(ctx).load_onnx(path_or_bytes, batch=batch, tune=tune)  # (a path, Path, bytes or ModelProto)
        self._inputs, self._outputs = _node_args(self.net.model)
        self._output_names = [o.name for o in self._outputs]

    # onnxruntime's interface --------------------------------------------------------------------------------------
    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_overridable_initializers(self):
        return []

    def get_providers(self):
        """The providers in use, onnxruntime's way: the one asked for first (a GPU name also where its GPU is an
        OpenCL device), then the CPU, which runs the host steps. `session.device` names the OpenCL device."""
        return list(self._providers)

    def get_provider_options(self):
        return {p: {} for p in self._providers}

    def get_modelmeta(self):
        return ModelMetadata(self.net.model)

    def run(self, output_names, input_feed, run_options=None):
        """[arrays of output_names, in that order] (None or []: every output) for {input name: array}."""
        names = list(output_names) if output_names else list(self._output_names)
        unknown = [n for n in names if n not in self._output_names]
        if unknown:
            raise InputError(f"{self.net.path}: invalid output name {unknown[0]!r}; the model's outputs are "
                             f"{self._output_names}")
        outs = self.net.run(input_feed, outputs=None if output_names is None else names)
        return [outs[n] for n in names]

    # dlnet's ------------------------------------------------------------------------------------------------------
    @property
    def device(self):
        """The OpenCL device the session runs on."""
        return self.net.ctx.info

    def close(self):
        """Release the session's device memory (Net.close); idempotent."""
        self.net.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _resolve_providers(providers, provider_options, options, precision):
    """(Context, [onnxruntime provider names in use]) for InferenceSession's providers argument."""
    if providers is None:
        ctx = Context(precision=precision, options=options)
        return ctx, _names_for(ctx, None)
    if isinstance(providers, (str, Context)):
        providers = [providers]
    provider_options = list(provider_options or [])
    found = None
    for i, p in enumerate(providers):
        if isinstance(p, Context):
            return p, _names_for(p, None)
        name, opts = (p[0], dict(p[1])) if isinstance(p, (tuple, list)) else (p, {})
        if i < len(provider_options):
            opts.update(provider_options[i] or {})
        if not isinstance(name, str):
            raise InputError(f"providers: expected provider names, (name, options) pairs or a Context, got {p!r}")
        if name.lower() in DLNET_DEVICES or name.lower().startswith("ocl:"):
            ctx = Context(name, precision=precision, options=options)
            return ctx, _names_for(ctx, None)
        found = devices() if found is None else found
        info = _device_for(name, opts, found)
        if info is not None:
            ctx = Context(info, precision=precision, options=options)
            return ctx, _names_for(ctx, name)
        warnings.warn(f"Specified provider {name!r} is not in available provider names. Available providers: "
                      f"'{', '.join(_available(found))}'", stacklevel=3)
    cpu = next((d for d in found or devices() if d.type == "CPU"), None)
    ctx = Context(cpu, precision=precision, options=options)  # onnxruntime's last resort: the CPU (else the default)
    return ctx, _names_for(ctx, None)


def _device_for(name, opts, found):
    """The OpenCL device an onnxruntime provider name stands for here, or None where there is none."""
    if name == CPU_PROVIDER:
        return next((d for d in found if d.type == "CPU"), None)
    if name not in GPU_PROVIDERS:
        return None
    gpus = [d for d in found if d.type == "GPU"]
    index = int(opts.get("device_id", 0))
    return gpus[index] if 0 <= index < len(gpus) else None


def _available(found):
    gpus = [d for d in found if d.type == "GPU"]
    names = ["CUDAExecutionProvider"] if any(is_nvidia(d.vendor, d.platform) for d in gpus) else []
    names += ["OpenCLExecutionProvider"] if gpus else []
    return names + ([CPU_PROVIDER] if any(d.type == "CPU" for d in found) else [])


def _names_for(ctx, asked):
    """onnxruntime's get_providers() for a session on ctx's device: the GPU provider asked for (or
    OpenCLExecutionProvider) and the CPU, or the CPU alone."""
    if ctx.is_cpu:
        return [CPU_PROVIDER]
    return [asked or "OpenCLExecutionProvider", CPU_PROVIDER]


def _node_args(model):
    """(inputs, outputs) as onnxruntime's NodeArgs: initializers are not inputs; an output whose type the model
    leaves out takes onnx's inferred one, as onnxruntime's does."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [_node_arg(v) for v in model.graph.input if v.name not in inits]
    declared = list(model.graph.output)
    if any(not _complete(v) for v in declared):
        inferred = _inferred_outputs(model)
        declared = [_merge(v, inferred.get(v.name)) for v in declared]
    return inputs, [_node_arg(v) for v in declared]


def _complete(vi):
    t = vi.type.tensor_type
    return bool(t.elem_type) and t.HasField("shape") and all(d.HasField("dim_value") or d.dim_param
                                                             for d in t.shape.dim)


def _inferred_outputs(model):
    from onnx import shape_inference
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception:  # a model onnx cannot infer (a custom domain, over 2 GiB): the declared types stay
        return {}
    return {v.name: v for v in inferred.graph.output}


def _merge(declared, inferred):
    """The declared output type, filled from the inferred one where it leaves the element type or dims out."""
    if inferred is None:
        return declared
    from onnx import ValueInfoProto
    vi = ValueInfoProto()
    vi.CopyFrom(declared)
    t, u = vi.type.tensor_type, inferred.type.tensor_type
    if not t.elem_type:
        t.elem_type = u.elem_type
    if not t.HasField("shape") and u.HasField("shape"):
        t.shape.CopyFrom(u.shape)
    elif len(t.shape.dim) == len(u.shape.dim):
        for d, e in zip(t.shape.dim, u.shape.dim):
            if not d.HasField("dim_value") and not d.dim_param:
                d.CopyFrom(e)
    for d in t.shape.dim:
        if d.dim_param.startswith("unk__"):  # onnx's name for a dim it could not infer: onnxruntime's None
            d.Clear()
    return vi


def _node_arg(vi):
    from onnx import TensorProto
    if not vi.type.HasField("tensor_type"):
        raise ModelError(f"{vi.name!r}: only tensor inputs and outputs are supported")
    t = vi.type.tensor_type
    shape = None
    if t.HasField("shape"):
        shape = [int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
    type_name = TensorProto.DataType.Name(t.elem_type).lower() if t.elem_type else "undefined"
    return NodeArg(vi.name, shape if shape is not None else [], f"tensor({type_name})")
