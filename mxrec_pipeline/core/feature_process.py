"""EvictHook, as in mx_rec.core.feature_process.

Runs feature eviction (core/admission.py) every `evict_step_interval` steps or
`evict_time_interval` seconds of wall time, whichever comes first, in
tf.compat.v1 sessions and Estimators. Keras users add
`mxrec_pipeline.keras.callbacks.EvictCallback` instead.
"""

from __future__ import annotations

import time
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.core import admission

DEFAULT_EVICT_TIME_INTERVAL_S = 24 * 60 * 60
_MAX_INT32 = 2**31 - 1


class EvictSchedule:
  """When to evict: every `step_interval` steps or `time_interval_s` seconds.

  Args:
    time_interval_s: Wall-clock seconds between evictions, in [1, 2^31 - 1].
    step_interval: Steps between evictions, in [1, 2^31 - 1], or None.
    clock: Returns seconds; `time.monotonic` by default (tests pass a fake).

  Raises:
    ValueError: an interval out of range (named).
  """

  def __init__(self, time_interval_s: int, step_interval: int | None,
               clock: Callable[[], float] = time.monotonic):
    for name, value in (("evict_time_interval", time_interval_s), ("evict_step_interval",
                                                                   step_interval)):
      if value is None and name == "evict_step_interval":
        continue
      if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_INT32:
        raise ValueError(f"`{name}` must be an int in [1, {_MAX_INT32}], got {value!r}")
    self.time_interval_s = time_interval_s
    self.step_interval = step_interval
    self._clock = clock
    self._steps = 0
    self._last = clock()

  def restart(self) -> None:
    """Starts the wall-clock interval again from now."""
    self._last = self._clock()

  def step(self) -> bool:
    """Counts one step; True when eviction is due (then the interval restarts)."""
    self._steps += 1
    now = self._clock()
    due = now - self._last >= self.time_interval_s or (self.step_interval is not None and
                                                       self._steps % self.step_interval == 0)
    if due:
      self._last = now
    return due


class EvictHook(tf.compat.v1.train.SessionRunHook):
  """Evicts idle keys of every table with an `eviction_threshold` (mxRec's EvictHook).

  Eviction removes keys last seen more than the table's eviction_threshold
  seconds (on the data's timestamps) before the latest batch, and resets their
  rows and optimizer slots (see core/admission.py). It runs after a step when
  `evict_step_interval` steps or `evict_time_interval` seconds have passed.

  Args:
    evict_enable: False makes the hook a no-op.
    evict_time_interval: Seconds of wall time between evictions, in [1, 2^31 - 1].
    evict_step_interval: Steps between evictions, in [1, 2^31 - 1], or None.
    clock: Returns seconds; `time.monotonic` by default.

  Attributes:
    last_freed: Table name -> rows freed by the latest eviction (NumPy).

  Raises:
    ValueError: a bad argument (named).
  """

  def __init__(self, evict_enable: bool = False,
               evict_time_interval: int = DEFAULT_EVICT_TIME_INTERVAL_S,
               evict_step_interval: int | None = None, *, clock: Callable[[],
                                                                          float] = time.monotonic):
    if not isinstance(evict_enable, bool):
      raise ValueError(f"`evict_enable` must be a bool, got {evict_enable!r}")
    self._enable = evict_enable
    self._schedule = EvictSchedule(evict_time_interval, evict_step_interval, clock)
    self._evict_ops = {}
    self.last_freed = {}

  def begin(self):
    # The graph is complete (tables, train op and slots) and not yet finalized.
    if self._enable:
      self._evict_ops = admission.evict_all()

  def after_create_session(self, session, coord):
    del session, coord
    self._schedule.restart()

  def after_run(self, run_context, run_values):
    del run_values
    if self._enable and self._evict_ops and self._schedule.step():
      self.last_freed = run_context.session.run(self._evict_ops)
