"""Lowering: each node of a scheduled, planned graph becomes kernel launches with arguments bound once.

The Lowerer is the emitter (emitter.py) with every kernel family (families/) mixed in; an op's `lower` names the
family entry that runs it, and the entry follows the node's schedule (schedule.py)."""
from ..graph.ir import BatchSlice, Node
from .emitter import Emitter
from .families.attention import AttentionFamily
from .families.conv import ConvFamily
from .families.conv_cpu import ConvCpuFamily
from .families.conv_grad import ConvGradFamily
from .families.elementwise import ElementwiseFamily
from .families.indexing import IndexFamily
from .families.matmul import MatmulFamily
from .families.norm_pool import NormPoolFamily
from .families.reduce import ReduceFamily
from .families.sampling import SamplingFamily
from .families.training import TrainingFamily
from .families.winograd import WinogradFamily
from .schedule import algorithm, data_inputs


class Lowerer(Emitter, ElementwiseFamily, ConvFamily, ConvCpuFamily, WinogradFamily, ConvGradFamily, MatmulFamily,
              NormPoolFamily, ReduceFamily, IndexFamily, TrainingFamily, SamplingFamily, AttentionFamily):
    def lower(self, graph, prefix=None):
        """Lower every node of `graph` in order; the chunked prefix's nodes slice by slice of the batch. Records each
        node's launches (node_launches: index -> (first, end); the prefix's nodes share their block's)."""
        self.node_launches = {}
        for i, node in enumerate(graph.nodes):
            start = len(self.launches)
            if prefix and prefix.start <= i < prefix.stop:
                if i == prefix.start:
                    self.lower_in_chunks(graph.nodes[prefix.start:prefix.stop], prefix)
                    for j in range(prefix.start, prefix.stop):
                        self.node_launches[j] = (start, len(self.launches))
                continue
            self.layer, self.node = f"{node.name} {node.op}".strip(), node
            algorithm(node, self.dev, self.options)  # (a graph lowered without schedule(): chosen now)
            node.spec.lower(node, self)
            self.node_launches[i] = (start, len(self.launches))
        return self

    def lower_in_chunks(self, nodes, prefix):
        """Lower nodes (a chunked_prefix) once per slice of the batch, slice after slice, each slice's launches
        awaiting that slice's upload ((input index, chunk), Plan.run)."""
        x = self.graph.inputs[prefix.input]
        per = x.size // x.shape[0]
        self.input_chunks[prefix.input] = [(b0 * per, (b0 + nb) * per) for b0, nb in prefix.chunks]
        for c, (b0, nb) in enumerate(prefix.chunks):
            for node in nodes:
                self.layer, self.node = f"{node.name} {node.op}".strip(), node
                algorithm(node, self.dev, self.options)
                data = {v.id for v in data_inputs(node) + node.outputs}
                def part_of(v):  # (a value handed on within the chain has a block of one slice)
                    return BatchSlice(v, 0 if v.id in self.plan.per_slice else b0, nb)
                part = Node(node.op, [part_of(v) if v is not None and v.id in data else v for v in node.inputs],
                            [part_of(v) for v in node.outputs], node.attrs, node.name, node.schedule)
                start = len(self.launches)
                node.spec.lower(part, self)
                for launch in self.launches[start:]:
                    launch.wait = (prefix.input, c)
                    launch.label += f" images {b0}+{nb}"

