"""Keras callbacks of the pipeline: checkpoints with tables, best-model export, eviction."""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core import feature_process
from mxrec_pipeline.util import initialize


def training_checkpoint(model) -> tf.train.Checkpoint:
  """A checkpoint of everything training needs to resume a SparseRankingModel.

  Holds the model (dense weights and table rows), both optimizers (dense
  slots; table slots and step count) and the key index of every table of the
  run, so index, rows and slots are saved and restored together.
  """
  tables = initialize.get_config_initializer().tables
  key_indexes = {name: table.key_index for name, table in tables.items()}
  # Tiered tables: the device cache's mapping and every host/SSD row.
  tiers = {name: table.tiers for name, table in tables.items()
           if getattr(table, "tiers", None) is not None}
  return tf.train.Checkpoint(model=model, optimizer=model.optimizer,
                             sparse_optimizer=model.sparse_optimizer, key_indexes=key_indexes,
                             **({"tiers": tiers} if tiers else {}))


def table_stats(table) -> dict[str, float]:
  """A table's statistics as Python numbers, for logs and TensorBoard.

  Keys: size, capacity, admissions, evictions, pending (core/admission.py);
  for tiered tables also the device cache's occupied rows, hits, misses,
  hit_rate (hits / lookups since creation), swap_outs, swap_ins and the tiers'
  host_rows_used, ssd_rows_used, host_bytes, ssd_bytes (core/tiers.py).
  """
  stats = {name: float(value) for name, value in admission.table_stats(table).items()}
  if getattr(table, "tiers", None) is not None:
    stats |= {name: float(value) for name, value in table.tiers.stats().items()}
    lookups = stats["hits"] + stats["misses"]
    stats["hit_rate"] = stats["hits"] / lookups if lookups else 0.0
  return stats


class TableStatsLogger(tf.keras.callbacks.Callback):
  """Writes every table's statistics (`table_stats`) to TensorBoard.

  Scalars `tables/<table>/<stat>` at the end of every epoch and, with
  `every_n_batches`, every that many training batches (step = batches so far).

  Args:
    log_dir: TensorBoard directory (a `tables` subdirectory is written).
    every_n_batches: Also log during epochs; None: per epoch only.
  """

  def __init__(self, log_dir: str, every_n_batches: int | None = None):
    super().__init__()
    self.log_dir = log_dir
    self.every_n_batches = every_n_batches
    self._writer = None
    self._batches = 0
    self.last = {}

  def _log(self, step: int):
    if self._writer is None:
      self._writer = tf.summary.create_file_writer(f"{self.log_dir}/tables")
    tables = initialize.get_config_initializer().tables
    self.last = {name: table_stats(table) for name, table in tables.items()}
    with self._writer.as_default(step=step):
      for name, stats in self.last.items():
        for stat, value in stats.items():
          tf.summary.scalar(f"tables/{name}/{stat}", value)
    self._writer.flush()

  def on_train_batch_end(self, batch, logs=None):
    self._batches += 1
    if self.every_n_batches and self._batches % self.every_n_batches == 0:
      self._log(self._batches)

  def on_epoch_end(self, epoch, logs=None):
    self._log(self._batches)


class SparseCheckpoint(tf.keras.callbacks.Callback):
  """Saves `training_checkpoint(model)` at the end of every epoch.

  TF checkpoints are written to temporary files and made current last, so a
  process killed while saving leaves the previous checkpoint loadable.

  Args:
    directory: Checkpoint directory (tf.train.CheckpointManager's).
    max_to_keep: Checkpoints kept.
  """

  def __init__(self, directory: str, max_to_keep: int = 3):
    super().__init__()
    self.directory = directory
    self.max_to_keep = max_to_keep
    self._manager = None

  def on_epoch_end(self, epoch, logs=None):
    if self._manager is None:
      self._manager = tf.train.CheckpointManager(
          training_checkpoint(self.model), self.directory, max_to_keep=self.max_to_keep)
    self._manager.save(checkpoint_number=epoch + 1)


class BestModelExporter(tf.keras.callbacks.Callback):
  """Exports the model whenever a validation metric improves.

  Args:
    export_fn: (model, path) -> None, e.g. ModelFitPipeline.export_saved_model.
    path: Export directory, overwritten at each improvement.
    monitor: Keras log key, e.g. "val_ndcg_10".
    higher_is_better: Direction of `monitor`.

  Raises:
    KeyError (at epoch end): `monitor` is not among the logs (named).
  """

  def __init__(self, export_fn: Callable, path: str, monitor: str, higher_is_better: bool):
    super().__init__()
    self.export_fn, self.path, self.monitor = export_fn, path, monitor
    self.higher_is_better = higher_is_better
    self.best = None

  def on_epoch_end(self, epoch, logs=None):
    logs = logs or {}
    if self.monitor not in logs:
      raise KeyError(f"BestModelExporter: '{self.monitor}' is not in the logs {sorted(logs)}")
    value = float(logs[self.monitor])
    better = self.best is None or (value > self.best if self.higher_is_better
                                   else value < self.best)
    if better:
      self.best = value
      self.export_fn(self.model, self.path)


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
               evict_step_interval: int | None = None, *,
               clock: Callable[[], float] | None = None):
    super().__init__()
    self._schedule = feature_process.EvictSchedule(
        evict_time_interval, evict_step_interval,
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
