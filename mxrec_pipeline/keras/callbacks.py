"""Keras callbacks of the pipeline: checkpoint saves, table statistics, best export, early
stopping, eviction."""

from __future__ import annotations

import json
import os
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core import feature_process
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.keras.checkpoints import BestMetric, TrainingCheckpoint, improves
from mxrec_pipeline.util import faults as faults_lib
from mxrec_pipeline.util import initialize
from mxrec_pipeline.util import model_files


def table_stats(table) -> dict[str, float]:
  """A table's statistics as Python numbers, for logs and TensorBoard.

  Keys: size, capacity, admissions, evictions, pending (core/admission.py);
  for tiered tables also the device cache's occupied rows, hits, misses,
  hit_rate (hits / lookups since creation), swap_outs, swap_ins and the tiers'
  host_rows_used, ssd_rows_used, host_bytes, ssd_bytes (core/tiers.py).
  """
  stats = {name: float(value) for name, value in admission.table_stats(table).items()}
  if table.is_tiered:
    stats |= {name: float(value) for name, value in table.tiers.stats().items()}
    lookups = stats["hits"] + stats["misses"]
    stats["hit_rate"] = stats["hits"] / lookups if lookups else 0.0
  return stats


class TableStatsLogger(tf.keras.callbacks.Callback):
  """Writes every table's statistics (`table_stats`) to TensorBoard.

  Scalars `tables/<table>/<stat>` at the end of every epoch and, with
  `every_n_batches`, every that many training batches; the step is the
  model's optimizer step count (so a resumed run continues the curve), or the
  batches seen by this callback without a model.

  Args:
    log_dir: TensorBoard directory (a `tables` subdirectory is written).
    every_n_batches: Also log during epochs; None: per epoch only.
    tables: Table name -> a sharded table of the protocol
      (core/table_protocol.Table): its `stats()`, the key-index counters
      summed over its shards (every ps shard on the PS coordinator; over
      workers, each worker's own summed by an all-reduce of `strategy`, so
      every worker must log at the same points). None: the run's tables
      (`table_stats`, tier statistics included).
    strategy: The run's strategy, for tables sharded over workers.
  """

  def __init__(self, log_dir: str, every_n_batches: int | None = None, tables=None,
               strategy: tf.distribute.Strategy | None = None):
    super().__init__()
    self.log_dir = log_dir
    self.every_n_batches = every_n_batches
    self._tables = tables
    self._strategy = strategy
    self._writer = None
    self._batches = 0
    self.last = {}

  def _log(self, step: int):
    if self._writer is None:
      self._writer = tf.summary.create_file_writer(f"{self.log_dir}/tables")
    if self._tables is not None:
      self.last = {
          name: {stat: float(value) for stat, value in table.stats().items()}
          for name, table in self._tables.items()
      }
      if any(len(t.local_shards()) < t.num_shards for t in self._tables.values()):
        flat = [int(v) for stats in self.last.values() for v in stats.values()]
        summed = iter(table_checkpoints.summed_over_workers(self._strategy, flat))
        self.last = {
            name: {stat: float(next(summed)) for stat in stats} for name, stats in self.last.items()
        }
    else:
      tables = initialize.get_config_initializer().tables
      self.last = {name: table_stats(table) for name, table in tables.items()}
    with self._writer.as_default(step=step):
      for name, stats in self.last.items():
        for stat, value in stats.items():
          tf.summary.scalar(f"tables/{name}/{stat}", value)
    self._writer.flush()

  def _step(self) -> int:
    """The optimizer's step count (restored on resume), else the batches seen here."""
    optimizer = getattr(getattr(self, "model", None), "optimizer", None)
    iterations = getattr(optimizer, "iterations", None)
    return self._batches if iterations is None else int(iterations.numpy())

  def on_train_batch_end(self, batch, logs=None):
    self._batches += 1
    if self.every_n_batches and self._batches % self.every_n_batches == 0:
      self._log(self._step())

  def on_epoch_end(self, epoch, logs=None):
    self._log(self._step())


class RunCallbacks(tf.keras.callbacks.CallbackList):
  """The callbacks of a run that calls model.fit once per epoch.

  Keras calls `on_train_begin` / `on_train_end` in every fit; a RunCallbacks
  passes them on once, at `begin_run()` and `end_run()`, so callbacks that
  keep state over a run (History, EarlyStopping, TensorBoard's writers, the
  progress bar's "Epoch e/N") see one training run. Keras adds History and,
  when `verbose` is not 0, a progress bar, as model.fit does.

  Args:
    callbacks: The run's Keras callbacks.
    model: The model they observe.
    verbose: model.fit verbosity (0, 1, 2).
    epochs: Epochs of the run (for the progress bar).
  """

  def __init__(self, callbacks, model, verbose: int, epochs: int):
    super().__init__(list(callbacks), add_history=True, add_progbar=verbose != 0, model=model,
                     verbose=verbose, epochs=epochs, steps=None)

  @property
  def history(self) -> tf.keras.callbacks.History:
    """The run's History (epochs and logs of every fit of this run)."""
    return next(c for c in self.callbacks if isinstance(c, tf.keras.callbacks.History))

  def set_epoch_steps(self, steps: int | None) -> None:
    """Steps of the next epoch (None: unknown), for the progress bar."""
    self.set_params({**self.params, "steps": steps})

  def on_train_begin(self, logs=None):
    """Called by each model.fit: passed on by `begin_run` only."""

  def on_train_end(self, logs=None):
    """Called by each model.fit: passed on by `end_run` only."""

  def begin_run(self) -> None:
    super().on_train_begin()

  def end_run(self, logs=None) -> None:
    super().on_train_end(logs)


class SparseCheckpoint(tf.keras.callbacks.Callback):
  """Saves a TrainingCheckpoint at epoch ends (after validation), as its schedule says.

  Every epoch by default; with `pipeline.checkpoint.delta_every_steps` or
  `delta_every_s`, the epochs its SaveSchedule picks, and the run's last epoch
  at `on_train_end` (RunCallbacks.end_run: after the last epoch, or an early
  stop) when its own epoch end did not save it.

  Args:
    checkpoint: The run's TrainingCheckpoint.
  """

  def __init__(self, checkpoint: TrainingCheckpoint):
    super().__init__()
    self.checkpoint = checkpoint
    self._unsaved = None  # Epochs done at the last epoch end that saved nothing.

  def on_epoch_end(self, epoch, logs=None):
    self._unsaved = None
    if self.checkpoint.wants_save():
      self.checkpoint.save(epoch + 1)
    else:
      self._unsaved = epoch + 1

  def on_train_end(self, logs=None):
    if self._unsaved is not None:
      self.checkpoint.save(self._unsaved)
      self._unsaved = None


class BestModelExporter(tf.keras.callbacks.Callback):
  """Exports the model whenever a validation metric improves.

  The best value so far is a `BestMetric`, which the training checkpoint
  saves: a resumed run, and every worker of a cluster, exports only when an
  epoch beats the best before it. Put it before the checkpoint callback, so
  that a checkpoint holds the best of its own epoch. `<path>/best_metric.json`
  ({"monitor", "value", "epoch"}) records the export for people and for runs
  resumed from checkpoints of versions before BestMetric.

  Args:
    export_fn: (model, path) -> the path written, or None when another
      process writes the export; e.g. ModelFitPipeline.export_saved_model.
    path: Export directory, overwritten at each improvement.
    monitor: Keras log key, e.g. "val_ndcg_10".
    higher_is_better: Direction of `monitor`.
    best: The run's BestMetric (`TrainingCheckpoint.best`); None: a new one.

  Attributes:
    current: Whether this process wrote the export at the last epoch end of
      the run (so it serves the model as it is now).

  Raises:
    KeyError (at epoch end): `monitor` is not among the logs (named).
  """

  STATE_FILE = "best_metric.json"

  def __init__(self, export_fn: Callable, path: str, monitor: str, higher_is_better: bool,
               best: BestMetric | None = None):
    super().__init__()
    self.export_fn, self.path, self.monitor = export_fn, path, monitor
    self.higher_is_better = higher_is_better
    self.state = best or BestMetric()
    self.current = False

  @property
  def best(self) -> float | None:
    """The best value of `monitor` so far, or None."""
    value = self.state.get(self.monitor)
    if value is None and int(self.state.epoch.numpy()) == 0:
      value = self._recorded()
    return value

  def _recorded(self) -> float | None:
    """The best_metric.json of an export by a version that did not checkpoint it."""
    state_path = os.path.join(self.path, self.STATE_FILE)
    if not tf.io.gfile.exists(state_path):
      return None
    with tf.io.gfile.GFile(state_path) as f:
      state = json.load(f)
    return float(state["value"]) if state.get("monitor") == self.monitor else None

  def on_train_begin(self, logs=None):
    self.current = False

  def on_epoch_end(self, epoch, logs=None):
    logs = logs or {}
    if self.monitor not in logs:
      raise KeyError(f"BestModelExporter: '{self.monitor}' is not in the logs {sorted(logs)}")
    value = float(logs[self.monitor])
    better = improves(value, self.best, self.higher_is_better)
    self.current = False
    if better:
      written = self.export_fn(self.model, self.path)
      self.state.set(self.monitor, value, epoch + 1)
      if written is None:  # Another process of the cluster writes the export.
        return
      self.current = True
      model_files.write_text_atomically(  # A reader never sees it half-written.
          os.path.join(self.path, self.STATE_FILE),
          json.dumps({"monitor": self.monitor, "value": value, "epoch": epoch + 1}))


class EarlyStopper(tf.keras.callbacks.Callback):
  """Stops training `patience` epochs after the best validation epoch (hparams.EarlyStopping).

  tf.keras.callbacks.EarlyStopping's rule (min_delta 0), its state the run's
  BestMetric, which every checkpoint saves: a resumed run counts the epochs
  since its best on, and `stopped(best, epochs_done)` tells a rerun that its
  run had already stopped. Put it after the BestModelExporter of the same
  monitor (which then updates the BestMetric) and before the checkpoint
  callback (whose checkpoint then holds the epoch's state).

  Args:
    monitor: Keras log key, e.g. "val_ndcg_10".
    higher_is_better: Direction of `monitor`.
    patience: Epochs without improvement before stopping, > 0.
    best: The run's BestMetric (`TrainingCheckpoint.best`).
    track: Update `best` at improvements (no BestModelExporter does).

  Attributes:
    stopped_epoch: The epoch (1-based) training stopped after, or 0.

  Raises:
    KeyError (at epoch end): `monitor` is not among the logs (named).
  """

  def __init__(self, monitor: str, higher_is_better: bool, patience: int, best: BestMetric,
               track: bool):
    super().__init__()
    self.monitor, self.higher_is_better, self.patience = monitor, higher_is_better, patience
    self.best, self.track = best, track
    self.stopped_epoch = 0

  def stopped(self, epochs_done: int) -> bool:
    """Whether a run with `epochs_done` epochs and this BestMetric had stopped early."""
    if self.best.get(self.monitor) is None:
      return False
    return epochs_done - int(self.best.epoch.numpy()) >= self.patience

  def on_epoch_end(self, epoch, logs=None):
    logs = logs or {}
    if self.monitor not in logs:
      raise KeyError(f"EarlyStopper: '{self.monitor}' is not in the logs {sorted(logs)}")
    if self.track:
      value = float(logs[self.monitor])
      if improves(value, self.best.get(self.monitor), self.higher_is_better):
        self.best.set(self.monitor, value, epoch + 1)
    if self.stopped(epoch + 1):
      self.stopped_epoch = epoch + 1
      self.model.stop_training = True


class FaultCallback(tf.keras.callbacks.Callback):
  """Reaches the run's fault points `train_batch` and `validation` (util/faults.py)."""

  def __init__(self, faults: faults_lib.FaultPoints):
    super().__init__()
    self.faults = faults

  def on_train_batch_end(self, batch, logs=None):
    self.faults.reach("train_batch")

  def on_test_begin(self, logs=None):
    self.faults.reach("validation")


class EvictCallback(tf.keras.callbacks.Callback):
  """Feature eviction for Keras training, like mx_rec's EvictHook.

  After a training batch, when `evict_step_interval` batches or
  `evict_time_interval` seconds have passed, evicts idle keys of every table
  with an eviction_threshold and resets their rows and the slots of
  `model.sparse_optimizer` (see mxrec_pipeline.core.admission).

  Args:
    evict_time_interval: Seconds of wall time between evictions, in [1, 2^31 - 1].
    evict_step_interval: Batches between evictions, in [1, 2^31 - 1], or None.
    clock: Returns seconds; `time.monotonic` by default.

  Attributes:
    last_freed: Table name -> rows freed by the latest eviction (NumPy).
  """

  def __init__(self, evict_time_interval: int = feature_process.DEFAULT_EVICT_TIME_INTERVAL_S,
               evict_step_interval: int | None = None, *, clock: Callable[[], float] | None = None):
    super().__init__()
    self._schedule = feature_process.EvictSchedule(evict_time_interval, evict_step_interval,
                                                   *([] if clock is None else [clock]))
    self.last_freed = {}

  def on_train_begin(self, logs=None):
    self._schedule.restart()

  def on_train_batch_end(self, batch, logs=None):
    if not self._schedule.step():
      return
    optimizer = getattr(self.model, "sparse_optimizer", None)
    freed = admission.evict_all(None if optimizer is None else [optimizer])
    self.last_freed = {name: rows.numpy() for name, rows in freed.items()}
