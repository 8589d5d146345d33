"""Optimizers (one update launch over every parameter) and learning-rate schedules."""
from .adam import Adam, AdamW
from .scaler import LossScaler
from .schedule import Cosine, Schedule, StepLR, Warmup
from .sgd import SGD, Optimizer

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "LossScaler", "Schedule", "StepLR", "Cosine", "Warmup"]
