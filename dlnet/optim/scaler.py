"""Dynamic loss scaling for fp16 training, as torch.amp.GradScaler does it.

The trainer multiplies the loss by `scale` before the backward (the gradients, and the half activation gradients on
the way, are `scale` times larger, so small ones do not flush to zero in half). On the device, before the update,
one reduction over every gradient (optim.cl sumsq, then unscale: no gradient comes back to the host) writes the
factor 1/scale the update kernels multiply the gradients by, and a flag where some gradient is inf or NaN: the
update kernels then skip themselves. The flag (4 bytes) comes back with the loss, and `update` moves the scale on
the host: halved after a skipped step, doubled after `growth_interval` good steps in a row.
"""
import math

from ..errors import InputError


class LossScaler:
    """scale starts at init_scale; a step with an inf/NaN gradient is skipped and the scale multiplied by
    backoff_factor; after growth_interval good steps in a row it is multiplied by growth_factor (torch.amp.GradScaler's
    defaults)."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise InputError(f"LossScaler(init_scale={init_scale!r}): expected a finite number > 0")
        if not self.growth_factor > 1.0 or not 0.0 < self.backoff_factor < 1.0 or self.growth_interval < 1:
            raise InputError(f"LossScaler(growth_factor={growth_factor!r}, backoff_factor={backoff_factor!r}, "
                             f"growth_interval={growth_interval!r}): expected growth_factor > 1, 0 < backoff_factor "
                             "< 1 and growth_interval >= 1")
        self.good_steps = 0  # good steps since the last change (GradScaler's growth tracker)
        self.skipped = 0  # steps skipped so far
        self.last_skipped = False

    def update(self, found_inf):
        """After a step: found_inf says whether some gradient was inf or NaN (the update was skipped)."""
        self.last_skipped = bool(found_inf)
        if found_inf:
            self.skipped += 1
            self.scale *= self.backoff_factor
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            grown = self.scale * self.growth_factor
            if math.isfinite(grown):  # (GradScaler keeps the scale where growing it would overflow float32)
                self.scale = grown
            self.good_steps = 0

    def state_dict(self):
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped}

    def load_state_dict(self, state):
        """What state_dict returned (a checkpoint's); an InputError where it is not that."""
        try:
            scale, good, skipped = float(state["scale"]), int(state["good_steps"]), int(state.get("skipped", 0))
        except (TypeError, KeyError, ValueError):
            raise InputError(f"loss scale state {state!r}: expected {{'scale': float, 'good_steps': int}}") from None
        if not (math.isfinite(scale) and scale > 0) or good < 0:
            raise InputError(f"loss scale state {state!r}: expected a finite scale > 0 and good_steps >= 0")
        self.scale, self.good_steps, self.skipped = scale, good, skipped
