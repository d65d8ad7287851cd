"""DeltaCheckpointHook: full and delta checkpoints on the timers of mxRec's init().

`init(is_incremental_checkpoint=True, save_checkpoint_due_time=F,
save_delta_checkpoints_secs=D)` asks for a full checkpoint every F seconds
and a delta (what changed since the previous save) every D seconds between
them; this hook, in a MonitoredSession's or an Estimator's hooks, makes those
saves with the Saver of saver/saver.py after the training steps.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.saver import saver as saver_lib
from mxrec_pipeline.util import initialize


class DeltaCheckpointHook(tf.compat.v1.train.SessionRunHook):
  """Saves `<checkpoint_dir>/<basename>-<global step>` in full or as a delta, on a timer.

  After the first step a full save; then, after a step, a full save when
  `save_checkpoint_due_time` seconds passed since the last full one, else a
  delta when `save_delta_checkpoints_secs` passed since the last save (with
  `is_incremental_checkpoint`); at the end a last save (a delta when a chain
  is open) unless that step was saved. The timers are init()'s; a run
  without them saves only first and last.

  Args:
    checkpoint_dir: The directory of the checkpoints (created).
    saver: A saver_lib.Saver (None: one built in `begin`, over every variable).
    checkpoint_basename: The checkpoints' name before the step.
    clock: Returns seconds; `time.monotonic` by default (tests pass a fake).

  Attributes:
    saved: (global step, "full" or "delta") of every save, in order.

  Raises:
    RuntimeError (in `begin`): the graph has no global step.
  """

  def __init__(self, checkpoint_dir: str, saver: saver_lib.Saver | None = None,
               checkpoint_basename: str = "model.ckpt", clock: Callable[[],
                                                                        float] = time.monotonic):
    self._path = os.path.join(checkpoint_dir, checkpoint_basename)
    self._directory = checkpoint_dir
    self._saver = saver
    self._clock = clock
    self._config = initialize.get_config_initializer().config
    self._global_step = None
    self._last_full = self._last_save = self._last_step = None
    self.saved: list[tuple[int, str]] = []

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()
    if self._global_step is None:
      raise RuntimeError("DeltaCheckpointHook needs a global step "
                         "(tf.compat.v1.train.get_or_create_global_step())")
    if self._saver is None:
      self._saver = saver_lib.Saver()
    tf.io.gfile.makedirs(self._directory)

  def after_run(self, run_context, run_values):
    del run_values
    kind = self._due(self._clock())
    if kind is not None:
      self._save(run_context.session, kind)

  def end(self, session):
    if self._step(session) != self._last_step:
      delta = self._config.is_incremental_checkpoint and self._last_full is not None
      self._save(session, "delta" if delta else "full")

  def _due(self, now: float) -> str | None:
    config = self._config
    if self._last_full is None:
      return "full"
    if (config.save_checkpoint_due_time is not None and
        now - self._last_full >= config.save_checkpoint_due_time):
      return "full"
    if (config.is_incremental_checkpoint and config.save_delta_checkpoints_secs is not None and
        now - self._last_save >= config.save_delta_checkpoints_secs):
      return "delta"
    return None

  def _step(self, session) -> int:
    return int(session.run(self._global_step))

  def _save(self, session, kind: str) -> None:
    step = self._step(session)
    self._saver.save(session, self._path, global_step=step, save_delta=kind == "delta")
    now = self._clock()
    self._last_save, self._last_step = now, step
    if kind == "full":
      self._last_full = now
    self.saved.append((step, kind))
