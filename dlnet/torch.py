"""The PyTorch bridge: torch modules into dlnet and their weights back, a dlnet graph inside a torch training loop,
and `torch.compile(module, backend="dlnet")`. torch stays optional: `pip install -e '.[torch]'`.

- `from_module(module, example_args)`: a Net of the module, exported in memory (torch's default exporter, with
  the exporter's graph optimisations off so every initializer keeps its module's qualified name; the TorchScript
  exporter where that fails). `load_into(net, module)` writes dlnet's weights back, in place.
- `Module(module, example_args)`: an nn.Module that runs `module` on dlnet through `Function`, an
  autograd.Function whose backward is dlnet's (vjp.py): torch's optimizer, loss and DataLoader work as usual.
- `backend`: the torch.compile backend (registered as "dlnet" by the torch_dynamo_backends entry point).
"""
import inspect
import io
import operator
import warnings

import numpy as np
import torch

from . import cuda_share
from .errors import ModelError
from .kernels.runtime import Context
from .net import Net
from .onnx.importer import check_supported
from .vjp import VJPPlan


def _input_names(module, args):
    """The forward signature's names of the positional example arguments."""
    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"input{i}" for i in range(len(args))]


def _rename_outputs(model, names):
    """Name the graph's outputs `names` (the exporters name them after their last op)."""
    rename = {o.name: n for o, n in zip(model.graph.output, names) if o.name != n}
    for node in model.graph.node:
        node.input[:] = [rename.get(x, x) for x in node.input]
        node.output[:] = [rename.get(x, x) for x in node.output]
    for o in model.graph.output:
        o.name = rename.get(o.name, o.name)


def export(module, example_args, dynamic_batch=True):
    """An onnx ModelProto of module(*example_args), in memory. Inputs take the forward signature's names, outputs
    "output" (or "output0", ...); initializers the module's qualified parameter and buffer names."""
    args = tuple(example_args) if isinstance(example_args, (tuple, list)) else (example_args,)
    names = _input_names(module, args)
    batch = {n: {0: torch.export.Dim("batch")} for n, a in zip(names, args) if dynamic_batch and a.dim() > 0}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, args, dynamo=True, optimize=False, verbose=False,
                                        input_names=names, dynamic_shapes=batch or None)
        model = program.model_proto
    except Exception as dynamo_error:  # noqa: BLE001 (any exporter failure: try the other exporter)
        model = _export_torchscript(module, args, names, dynamic_batch, dynamo_error)
    outs = [o.name for o in model.graph.output]
    _rename_outputs(model, ["output"] if len(outs) == 1 else [f"output{i}" for i in range(len(outs))])
    return model


def _export_torchscript(module, args, names, dynamic_batch, first_error):
    import onnx
    buf = io.BytesIO()
    axes = {n: {0: "batch"} for n in names} if dynamic_batch else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, buf, dynamo=False, opset_version=17, input_names=names,
                              do_constant_folding=False, dynamic_axes=axes)
    except Exception as e:
        raise ModelError(f"{type(module).__name__}: torch could not export it to ONNX ({first_error}; then {e})") \
            from e
    return onnx.load_from_string(buf.getvalue())


def _torch_names(module):
    return dict(module.named_parameters()), dict(module.named_buffers())


def from_module(module, example_args, ctx=None, dynamic_batch=True):
    """A Net of `module` (its current weights). net.torch_params: {initializer: qualified parameter name}; a Trainer
    made from it trains the module's requires_grad parameters (the rest are frozen by default)."""
    model = export(module, example_args, dynamic_batch)
    net = Net(ctx if ctx is not None else Context()).load_onnx(model)
    params, buffers = _torch_names(module)
    inits = {i.name for i in model.graph.initializer}
    net.torch_params = {n: n for n in inits if n in params}
    net.torch_buffers = {n: n for n in inits if n in buffers}
    net.frozen_default = inits - {n for n in net.torch_params if params[n].requires_grad}
    return net


def load_into(net, module):
    """Write the net's current weights (a Trainer's device copy included) and statistics into `module`, in
    place, by name; returns the names written."""
    weights = net.state_dict()
    written = []
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if name in weights:
                t.copy_(torch.from_numpy(np.ascontiguousarray(weights[name])).to(t.dtype))
                written.append(name)
    return written


def state_dict_arrays(state_dict):
    """{name: numpy array} of a torch state_dict (tensors moved to the host)."""
    return {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
            for k, v in state_dict.items()}


# ------------------------------------------------------------------------------------ dlnet inside autograd -------
class _Runner:
    """The VJP plans of one ONNX model, per input shapes; parameters stay on the device while their torch version
    counters do not change."""

    def __init__(self, ctx, model, name, input_names, param_names, buffers=None):
        self.ctx, self.model, self.name = ctx, model, name
        self.input_names, self.param_names = input_names, param_names
        self.buffers = buffers or {}  # initializer name -> the module's tensor its running statistic updates
        self.plans = {}
        self.last = None
        self.share = None  # cuda_share.CudaShare where torch's CUDA tensors and ctx share memory

    def sharing(self, tensors):
        """The CudaShare of this runner's context where every tensor is on CUDA and the device can share memory with
        torch (turned on at the first such call, before any plan of the context's is made); else None."""
        if self.share is None and tensors and all(t.is_cuda for t in tensors) and not self.plans:
            from .cuda_share import share_with_torch
            self.share = share_with_torch(self.ctx)
        return self.share if tensors and all(t.is_cuda for t in tensors) else None

    def plan(self, arrays, wrt):
        key = (tuple(tuple(a.shape) for a in arrays), wrt)
        vjp = self.plans.get(key)
        if vjp is None:
            shapes = dict(zip(self.input_names, (tuple(a.shape) for a in arrays)))
            vjp = VJPPlan(self.ctx, self.model, self.name, shapes,
                          [n for n, w in zip(self.input_names, wrt) if w], self.param_names)
            vjp.versions = {}
            self.plans[key] = vjp
        return vjp

    def changed_params(self, vjp, params):
        """{name: tensor} of the parameters and running statistics whose device copy is stale (a torch version counter
        moved), marked fresh."""
        changed = {}
        stats = [(n, t) for n, t in self.buffers.items() if n in vjp.state_values]  # (running statistics)
        for name, t in list(zip(self.param_names, params)) + stats:
            stamp = (t.data_ptr(), t._version)
            if (name in vjp.params or name in vjp.state_values) and vjp.versions.get(name) != stamp:
                changed[name] = t.detach()
                vjp.versions[name] = stamp
        return changed

    def upload_params(self, vjp, params):
        for name, t in self.changed_params(vjp, params).items():
            vjp.set_param(name, t.cpu().numpy())


class Function(torch.autograd.Function):
    """y = the dlnet graph of `runner` on its inputs and parameters; dx, dparams = dlnet's vector-Jacobian products.
    The activations stay on the device between forward and backward (vjp.py)."""

    @staticmethod
    def forward(ctx, runner, n_inputs, *tensors):
        inputs, params = tensors[:n_inputs], tensors[n_inputs:]
        share = runner.sharing(tensors)
        arrays = inputs if share is not None else [t.detach().cpu().numpy() for t in inputs]
        vjp = runner.plan(arrays, tuple(t.requires_grad for t in inputs))
        ctx.vjp, ctx.n_inputs, ctx.inputs, ctx.runner = vjp, n_inputs, inputs, runner
        ctx.devices = [t.device for t in tensors]
        runner.last = vjp
        ctx.share = share if cuda_share.shared_plan(share, vjp.plan) and vjp.split is not None else None
        if ctx.share is not None:  # (on the GPU: nothing crosses the host)
            return tuple(cuda_share.vjp_forward(share, vjp, [t.detach() for t in inputs],
                                                runner.changed_params(vjp, params)))
        if share is not None:
            arrays = [t.detach().cpu().numpy() for t in inputs]
        runner.upload_params(vjp, params)
        outs = vjp.forward(arrays)
        device = inputs[0].device if inputs else "cpu"
        return tuple(torch.from_numpy(o).to(device) for o in outs)

    @staticmethod
    def backward(ctx, *dys):
        vjp = ctx.vjp
        if ctx.share is not None:
            grads, states = cuda_share.vjp_backward(ctx.share, vjp, [d.detach() for d in dys])
        else:
            grads, states = vjp.backward([d.detach().cpu().numpy() for d in dys])
            grads = {n: torch.from_numpy(g) for n, g in grads.items()}
            states = [torch.from_numpy(s) for s in states]
        targets = [ctx.inputs[vjp.input_names.index(name)] if name in vjp.input_names[:ctx.n_inputs]
                   else ctx.runner.buffers.get(name) for name in vjp.state_names]
        pairs = [(t, v) for t, v in zip(targets, states) if t is not None]
        with torch.no_grad():  # BatchNorm's running statistics, updated in place as torch does (on the GPU, from
            # views of the plan's memory, in a few launches)
            cuda_share.copy_all([t for t, _ in pairs], [v for _, v in pairs])
        in_grads = [grads[n].to(dev) if n in grads else None for n, dev in zip(vjp.input_names, ctx.devices)]
        p_grads = [grads[n].to(dev) if n in grads else None
                   for n, dev in zip(vjp.param_names, ctx.devices[ctx.n_inputs:])]
        return (None, None, *in_grads[:ctx.n_inputs], *p_grads)


class Module(torch.nn.Module):
    """`module` run on dlnet (forward and backward) inside an ordinary torch training loop: its parameters stay the
    module's (a torch optimizer updates them; dlnet re-reads one only after it changed)."""

    def __init__(self, module, example_args, ctx=None):
        super().__init__()
        self.inner = module
        args = tuple(example_args) if isinstance(example_args, (tuple, list)) else (example_args,)
        model = export(module, args)
        params = dict(module.named_parameters())
        inits = [i.name for i in model.graph.initializer]
        self._names = [n for n in inits if n in params]
        ctx = ctx if ctx is not None else Context()
        self._runner = _Runner(ctx, model, type(module).__name__, _input_names(module, args), self._names,
                               dict(module.named_buffers()))
        self._single = len(model.graph.output) == 1

    def forward(self, *args):
        params = [self.inner.get_parameter(n) for n in self._names]
        outs = Function.apply(self._runner, len(args), *args, *params)
        return outs[0] if self._single else outs


# ------------------------------------------------------------------------------------ torch.compile ---------------
_COMPILED = {}  # (graph code digest, input shapes and dtypes) -> the compiled callable
_SUPPORT = {}  # an FX node's (target, constant arguments, input ranks and dtypes) -> dlnet runs its ONNX form


def _example(v):
    """A real tensor shaped like an FX value's example (dynamo's fake tensors); a tuple of them (None kept) for a
    node that returns several (split, multi_head_attention_forward)."""
    meta = v.meta.get("example_value") if hasattr(v, "meta") else None
    if isinstance(meta, (tuple, list)):
        return tuple(_tensor_like(m) if isinstance(m, torch.Tensor) else None for m in meta)
    return _tensor_like(meta) if isinstance(meta, torch.Tensor) else None


def _tensor_like(meta):
    if meta.dtype.is_floating_point:
        return torch.randn(tuple(int(d) for d in meta.shape), dtype=meta.dtype)
    return torch.zeros(tuple(int(d) for d in meta.shape), dtype=meta.dtype)


def _is_tensors(example):
    """A tensor, or a tuple of tensors and Nones with one tensor at least (what one FX node may return)."""
    if isinstance(example, tuple):
        return any(e is not None for e in example) and all(e is None or isinstance(e, torch.Tensor) for e in example)
    return isinstance(example, torch.Tensor)


class _OneNode(torch.nn.Module):
    """An FX node's call alone, its tensor arguments made inputs (for its ONNX export)."""

    def __init__(self, node):
        super().__init__()
        self.node = node

    def forward(self, *tensors):
        it = iter(tensors)

        def fill(a):
            if isinstance(a, torch.fx.Node):
                return next(it)
            if isinstance(a, (list, tuple)):
                return type(a)(fill(x) for x in a)
            return a
        args, kwargs = fill(self.node.args), {k: fill(v) for k, v in self.node.kwargs.items()}
        if self.node.op == "call_method":
            out = getattr(args[0], self.node.target)(*args[1:], **kwargs)
        else:
            out = self.node.target(*args, **kwargs)
        # several results: the tensors (multi_head_attention_forward's weights are None when not asked for)
        return tuple(o for o in out if o is not None) if isinstance(out, (tuple, list)) else out


def _node_inputs(node):
    found = []
    torch.fx.node.map_arg((node.args, node.kwargs), found.append)
    return found


def node_supported(node):
    """Does dlnet import every ONNX op of this FX node's export? (cached per target and argument kinds)"""
    if node.op not in ("call_function", "call_method"):
        return False
    inputs = _node_inputs(node)
    examples = [_example(v) for v in inputs]
    if node.target is operator.getitem and len(inputs) == 1 and isinstance(examples[0], tuple):
        # one result of a node that returns several: with that node (a partition holds both), never alone
        index = node.args[1]
        return isinstance(index, int) and -len(examples[0]) <= index < len(examples[0]) and \
            examples[0][index] is not None and node_supported(inputs[0])
    if not all(isinstance(e, torch.Tensor) for e in examples) or not _is_tensors(_example(node)):
        return False
    key = (str(node.target), repr([a for a in node.args if not isinstance(a, torch.fx.Node)]),
           repr(sorted(node.kwargs.items(), key=str)), tuple((e.dim(), e.dtype) for e in examples))
    if key not in _SUPPORT:
        _SUPPORT[key] = _exports_to_dlnet(_OneNode(node), examples)
    return _SUPPORT[key]


def _exports_to_dlnet(module, examples):
    """The TorchScript exporter first (fast), then torch's default one (what the partition's export uses)."""
    import onnx
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(module, tuple(examples), buf, dynamo=False, opset_version=17)
            check_supported(onnx.load_from_string(buf.getvalue()))
            return True
        except Exception:  # noqa: BLE001 (not exportable this way, or an op dlnet does not import)
            pass
        try:
            check_supported(torch.onnx.export(module, tuple(examples), dynamo=True, optimize=False,
                                              verbose=False).model_proto)
            return True
        except Exception:  # noqa: BLE001 (it stays in eager)
            return False


class _Compiled:
    """One partition of a torch.compile graph on dlnet: inference through a Net, training through Function."""

    def __init__(self, gm, ctx):
        self.gm, self.ctx = gm, ctx
        self.nets, self.runner = {}, None
        self.single = True

    def __call__(self, *args):
        tensors = list(args)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            if self.runner is None:
                model = export(self.gm, tuple(tensors), dynamic_batch=False)
                names = [i.name for i in model.graph.input if i.name not in {x.name for x in model.graph.initializer}]
                self.runner = _Runner(self.ctx, model, "torch.compile graph", names, [])
            outs = Function.apply(self.runner, len(tensors), *tensors)
        else:
            key = tuple((tuple(t.shape), t.dtype) for t in tensors)
            net = self.nets.get(key)
            if net is None:
                net = self.nets[key] = Net(self.ctx).load_onnx(export(self.gm, tuple(tensors), dynamic_batch=False))
            res = net.run({i.name: t.detach().cpu().numpy() for i, t in zip(net.inputs, tensors)})
            device = tensors[0].device if tensors else "cpu"  # (a partition of constants takes no input)
            outs = tuple(torch.from_numpy(np.asarray(res[o.name])).to(device) for o in net.outputs)
        return outs[0] if self.single and len(outs) == 1 else outs


def backend(gm, example_inputs, ctx=None, **kwargs):
    """torch.compile's backend "dlnet": the FX graph's supported nodes (each one's ONNX form imports into dlnet) run
    on dlnet in partitions, the rest stays in eager (one warning lists them); compiled partitions are cached by the
    graph's code and the shapes and dtypes of its inputs. Training runs dlnet's own backward (Function): the
    partition's forward graph is differentiated by dlnet's autodiff, not aot_autograd's (whose backward graphs are
    aten backward ops the ONNX exporters cannot write)."""
    import hashlib

    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node):
            return node_supported(node)
    key = (hashlib.sha256(gm.code.encode()).hexdigest(),
           tuple((tuple(t.shape), t.dtype) for t in example_inputs if isinstance(t, torch.Tensor)))
    if key in _COMPILED:
        return _COMPILED[key]
    unsupported = sorted({str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")
                          and not node_supported(n)})
    if unsupported:
        warnings.warn(f"dlnet: {len(unsupported)} kind(s) of node stay in eager: {', '.join(unsupported)}",
                      stacklevel=2)
    fused = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True).partition_and_fuse()
    ctx = ctx if ctx is not None else Context()
    for name, sub in list(fused.named_children()):
        if name.startswith("fused_"):
            compiled = _Compiled(sub, ctx)
            compiled.single = not _returns_tuple(sub)
            setattr(fused, name, _Wrap(compiled))
    fused.recompile()
    _COMPILED[key] = fused.forward
    return fused.forward


def _returns_tuple(gm):
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return isinstance(out.args[0], (tuple, list))


class _Wrap(torch.nn.Module):
    def __init__(self, compiled):
        super().__init__()
        self.compiled = compiled

    def forward(self, *args):
        return self.compiled(*args)
