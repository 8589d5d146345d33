"""Learning-rate schedules: a factor of the base rate per optimizer step (0-based)."""
import math


class Schedule:
    def factor(self, step):
        return 1.0


class StepLR(Schedule):
    """lr * gamma ** (step // step_size)  (torch.optim.lr_scheduler.StepLR, counted in steps)"""

    def __init__(self, step_size, gamma=0.1, warmup=0):
        self.step_size, self.gamma, self.warmup = int(step_size), float(gamma), int(warmup)

    def factor(self, step):
        return _warm(step, self.warmup) * self.gamma ** (step // self.step_size)


class Cosine(Schedule):
    """lr * (min_factor + (1 - min_factor) * (1 + cos(pi * t / total)) / 2), after a linear warm-up"""

    def __init__(self, total_steps, min_factor=0.0, warmup=0):
        self.total, self.min_factor, self.warmup = max(int(total_steps), 1), float(min_factor), int(warmup)

    def factor(self, step):
        t = min(max(step - self.warmup, 0), self.total)
        cos = (1 + math.cos(math.pi * t / self.total)) / 2
        return _warm(step, self.warmup) * (self.min_factor + (1 - self.min_factor) * cos)


class Warmup(Schedule):
    """lr * min(1, (step + 1) / warmup): linear warm-up, then constant"""

    def __init__(self, warmup):
        self.warmup = int(warmup)

    def factor(self, step):
        return _warm(step, self.warmup)


def _warm(step, warmup):
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
