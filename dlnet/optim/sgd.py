"""SGD with momentum, Nesterov and weight decay (torch.optim.SGD semantics)."""
import numpy as np


class Optimizer:
    """Holds hyper-parameters; the trainer binds one update launch over every parameter (dlnet/kernels/cl/optim.cl)
    and rewrites `hyper(step)` each step."""
    kernel = None
    max_norm_at = None
    slots = ()  # per-parameter state buffers, in kernel-argument order

    def __init__(self, lr, weight_decay=0.0, schedule=None, clip_norm=None):
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.schedule = schedule
        self.clip_norm = clip_norm

    def lr_at(self, step):
        return self.lr * (self.schedule.factor(step) if self.schedule is not None else 1.0)

    def hyper(self, step):
        raise NotImplementedError


class SGD(Optimizer):
    """d = g + wd * p;  b = momentum * b + (1 - dampening) * d (b = d at the first step);  p -= lr * (nesterov ? d +
    momentum * b : b)"""
    kernel = "sgd"
    max_norm_at = 5  # index of clip_norm in hyper()

    def __init__(self, lr=0.01, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, schedule=None,
                 clip_norm=None):
        super().__init__(lr, weight_decay, schedule, clip_norm)
        self.momentum, self.dampening, self.nesterov = float(momentum), float(dampening), bool(nesterov)
        self.slots = ("momentum_buffer",) if self.momentum else ()

    def hyper(self, step):
        return np.array([self.lr_at(step), self.momentum, self.dampening, self.weight_decay, float(self.nesterov),
                         float(self.clip_norm or 0.0), float(step == 0), 0.0, 0.0], np.float32)
