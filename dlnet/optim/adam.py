"""Adam and AdamW with PyTorch's bias correction."""
import numpy as np

from .sgd import Optimizer


class Adam(Optimizer):
    """m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps)

    weight_decay adds wd * p to g (L2, torch.optim.Adam)."""
    kernel = "adam"
    max_norm_at = 8  # index of clip_norm in hyper()
    slots = ("exp_avg", "exp_avg_sq")
    decoupled = False

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, schedule=None, clip_norm=None):
        super().__init__(lr, weight_decay, schedule, clip_norm)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)

    def hyper(self, step):
        t = step + 1
        b1, b2 = self.betas
        return np.array([self.lr_at(step), b1, b2, self.eps, self.weight_decay, 1 - b1 ** t, 1 - b2 ** t,
                         float(self.decoupled), float(self.clip_norm or 0.0)], np.float32)


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= 1 - lr * wd before the Adam step (torch.optim.AdamW)."""
    decoupled = True

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, schedule=None, clip_norm=None):
        super().__init__(lr, betas, eps, weight_decay, schedule, clip_norm)
