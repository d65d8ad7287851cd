"""When a training run saves a checkpoint, and whether it saves the tables in full or as a delta.

`SaveSchedule` applies a hparams.CheckpointSchedule at the save points of a
run (epoch ends; partition ends in a continuous run): `wants_save` says
whether this one saves (`delta_every_steps` / `delta_every_s`), `full_due`
whether its tables start a new chain (`full_every_epochs` / `_steps` / `_s`);
`saved` and `restored` keep the chain's state: the step and time of its full
save, recorded in the checkpoint (`chain_record`, kept in
`shards-<N>/chain.json`) so a restarted run keeps the intervals, and of the
last save. Times come from a clock every worker of a synchronous run agrees
on (`agreed_clock`): MultiWorkerMirrored workers then all save, or all skip,
the same epoch, as their collectives require.
"""

from __future__ import annotations

import time
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.hparams import CheckpointSchedule


def agreed_clock(strategy: tf.distribute.Strategy | None) -> Callable[[], float]:
  """A wall clock (seconds) that reads the same on every replica of `strategy`.

  The mean of the replicas' `time.time()`, an all-reduce (every worker must
  call it at the same point, as they do at an epoch end); one host's clock
  when `strategy` is None (a ParameterServerStrategy coordinator decides
  alone: pass None).
  """
  if strategy is None:
    return time.time

  def clock() -> float:
    millis = strategy.reduce(tf.distribute.ReduceOp.SUM,
                             strategy.run(lambda: tf.constant(int(time.time() * 1000), tf.int64)),
                             axis=None)
    return float(millis.numpy()) / 1000 / strategy.num_replicas_in_sync

  return clock


class SaveSchedule:
  """A CheckpointSchedule's decisions, with the state of the current chain.

  Args:
    schedule: The run's hparams.CheckpointSchedule.
    clock: Seconds, the same on every worker (`agreed_clock`); read only when
      the schedule is in seconds.
  """

  def __init__(self, schedule: CheckpointSchedule, clock: Callable[[], float] = time.time):
    self.schedule = schedule
    self._clock = clock
    self._full = None  # (step, time) of the chain's full save; None: no chain to build on.
    self._chain_length = 0
    self._last = None  # (step, time) of the last save or restore.

  def now(self) -> float | None:
    """The clock's seconds when the schedule is in seconds, else None (no clock read)."""
    return self._clock() if self.schedule.uses_clock else None

  def full_due(self, step: int, now: float | None) -> bool:
    """Whether a save at training step `step`, at time `now` (`now()`), saves the tables in full.

    True without a chain to build on (the run's first save, or after a
    restore onto another shard count), else when the schedule's interval
    since the chain's full save has passed.
    """
    if self._full is None:
      return True
    schedule = self.schedule
    if schedule.full_every_steps is not None:
      return step - self._full[0] >= schedule.full_every_steps
    if schedule.full_every_s is not None:
      return self._full[1] is None or now - self._full[1] >= schedule.full_every_s
    return self._chain_length >= schedule.full_every_epochs

  def wants_save(self, step: int, final: bool) -> bool:
    """Whether the save point at training step `step` saves (`final`: the run's last epoch)."""
    schedule = self.schedule
    if final or (schedule.delta_every_steps is None and schedule.delta_every_s is None):
      return True
    now = self.now()
    if self.full_due(step, now) or self._last is None:
      return True
    if schedule.delta_every_steps is not None:
      return step - self._last[0] >= schedule.delta_every_steps
    return self._last[1] is None or now - self._last[1] >= schedule.delta_every_s

  def saved(self, step: int, full: bool, now: float | None) -> None:
    """Records a save at `step`, at time `now` (`full`: it started a chain)."""
    if full:
      self._full, self._chain_length = (step, now), 0
    self._chain_length += 1
    self._last = (step, now)

  def chain_record(self, full_at: tuple[int, float | None] | None = None) -> dict:
    """What a checkpoint records of its chain's full save: {"full_step", "full_time"}.

    Of the current chain, or of a full save at `full_at` (step, time); no
    "full_time" when the schedule reads no clock.
    """
    step, when = full_at or self._full or (None, None)
    return {
        **({"full_step": step} if step is not None else {}),
        **({"full_time": when} if when is not None else {})
    }

  def restored(self, step: int, chain_length: int | None, record: dict | None) -> None:
    """Continues the chain of a restored checkpoint.

    Args:
      step: The restored training step.
      chain_length: Checkpoints in its chain (1: a full save), or None when
        the next save cannot build on it (another shard count; a move).
      record: Its `chain_record` (None or missing fields: a checkpoint of a
        version before schedules, whose chain counts from this restore).
    """
    record = record or {}
    now = self.now()
    self._last = (step, now)
    if chain_length is None:
      self._full, self._chain_length = None, 0
      return
    full_step = record.get("full_step")
    full_time = record.get("full_time")
    self._full = (step if full_step is None else int(full_step),
                  now if full_time is None else float(full_time))
    self._chain_length = chain_length
