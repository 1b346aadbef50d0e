"""Learning-rate schedule of the paper: linear warm-up, then cosine or linear decay to 0."""

import math

import keras
from keras import ops

DECAYS = ("cosine", "linear")  # after the warm-up


@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`base * step / warmup` during warm-up, then decays from `base` to 0 at `total_steps`.

    Args:
        base: learning rate at the end of warm-up.
        warmup_steps: steps of linear warm-up from 0.
        total_steps: step at which the rate reaches 0 (and stays).
        decay: "cosine" or "linear".
    """

    def __init__(self, base, warmup_steps, total_steps, decay="cosine"):
        if decay not in DECAYS:
            raise ValueError(f"decay must be one of {DECAYS}, got {decay!r}.")
        if not 0 <= warmup_steps <= total_steps or total_steps <= 0:
            raise ValueError(f"Need 0 <= warmup_steps ({warmup_steps}) <= total_steps "
                             f"({total_steps}) and total_steps > 0.")
        self.base = float(base)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warm = self.base * step / max(self.warmup_steps, 1)
        progress = ops.clip(
            (step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1), 0.0, 1.0)
        if self.decay == "cosine":
            decayed = self.base * 0.5 * (1.0 + ops.cos(math.pi * progress))
        else:
            decayed = self.base * (1.0 - progress)
        return ops.where(step < self.warmup_steps, warm, decayed)

    def get_config(self):
        return {"base": self.base, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "decay": self.decay}
