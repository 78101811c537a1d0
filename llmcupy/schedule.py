"""Learning-rate schedules of llm.c's mainline trainer (``-k``): cosine, linear, constant, wsd.

``lr(step)`` for the 0-based step of a run of ``total`` steps, peak ``lr_max``, ``warmup`` steps
of linear warm-up and a final learning rate ``final_frac * lr_max`` (``-q``):

* warm-up (every schedule but constant): ``lr_max * (step + 1) / warmup`` for ``step < warmup``;
* cosine: ``lr_min + 0.5 * (1 + cos(pi * r)) * (lr_max - lr_min)`` with
  ``r = (step - warmup) / (total - warmup)``;
* linear: ``lr_max - r * (lr_max - lr_min)``;
* constant: ``lr_max`` at every step (no warm-up);
* wsd (warm-up, stable, decay): ``lr_max`` until 80 % of the run, then a ``1 - sqrt`` cool-down
  to ``lr_min`` over the last 20 %.

With the defaults (``-u 0``, ``-q 1.0``) every schedule is the constant ``lr_max`` of the FP32
trainer.
"""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "linear", "constant", "wsd")
WSD_DECAY_START = 0.8   # llm.c's wsd: the last 20 % of the steps cool down


class ScheduleError(ValueError):
    pass


class LRSchedule:
    def __init__(self, kind: str, lr_max: float, warmup: int, total: int, final_frac: float):
        if kind not in SCHEDULES:
            raise ScheduleError(f"-k {kind!r}: choose one of {', '.join(SCHEDULES)}")
        if warmup < 0:
            raise ScheduleError(f"-u (warm-up steps) must not be negative (got {warmup})")
        if not 0.0 <= final_frac <= 1.0:
            raise ScheduleError(f"-q (final learning-rate fraction) must lie in [0, 1] (got {final_frac:g})")
        self.kind, self.lr_max, self.warmup, self.total, self.final_frac = kind, float(lr_max), int(warmup), \
            int(total), float(final_frac)

    @property
    def constant(self) -> bool:
        """True when every step gets ``lr_max`` (the FP32 trainer's behaviour)."""
        return self.kind == "constant" or (self.warmup == 0 and self.final_frac == 1.0)

    def __call__(self, step: int) -> float:
        lr_max, lr_min = self.lr_max, self.lr_max * self.final_frac
        if self.constant:
            return lr_max
        if step < self.warmup:
            return lr_max * (step + 1) / self.warmup
        if self.kind == "wsd":
            start = int(WSD_DECAY_START * self.total)
            if step < start:
                return lr_max
            r = (step - start) / max(self.total - start, 1)
            return lr_min + (1.0 - math.sqrt(min(r, 1.0))) * (lr_max - lr_min)
        r = min((step - self.warmup) / max(self.total - self.warmup, 1), 1.0)
        if self.kind == "cosine":
            return lr_min + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr_max - lr_min)
        return lr_max - r * (lr_max - lr_min)   # linear
