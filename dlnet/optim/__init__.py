"""Optimizers (one update launch over every parameter) and learning-rate schedules."""
from .adam import Adam, AdamW
from .schedule import Cosine, Schedule, StepLR, Warmup
from .sgd import SGD, Optimizer

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "Schedule", "StepLR", "Cosine", "Warmup"]
