"""Keras callbacks of the pipeline: checkpoints with tables, best-model export, eviction."""

from __future__ import annotations

import json
import os
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core import feature_process
from mxrec_pipeline.util import atomic_dir
from mxrec_pipeline.util import initialize


def training_checkpoint(model, sharded: bool = False, **extra) -> tf.train.Checkpoint:
  """A checkpoint of everything training needs to resume a SparseRankingModel.

  Holds the model (dense weights and table rows), both optimizers (dense
  slots and step count; table slots and step count) and the key index of
  every table of the run (keys, rows, admission counters and timestamps), so
  index, rows and slots are saved and restored together; tiered tables add
  the device cache's mapping and every host/SSD row.

  Args:
    model: A compiled SparseRankingModel.
    sharded: The tables are sharded over workers (keras/sharded.py): their
      rows, key indexes and the hash optimizer are saved per shard
      (keras/sharded.ShardCheckpoints), not here.
    **extra: More trackables to save with it (e.g. an epoch counter).
  """
  if sharded:
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer, **extra)
  tables = initialize.get_config_initializer().tables
  key_indexes = {name: table.key_index for name, table in tables.items()}
  tiers = {name: table.tiers for name, table in tables.items() if table.is_tiered}
  generators = random_generators(model)
  return tf.train.Checkpoint(model=model, optimizer=model.optimizer,
                             sparse_optimizer=model.sparse_optimizer, key_indexes=key_indexes,
                             **({"tiers": tiers} if tiers else {}),
                             **({"random_generators": generators} if generators else {}), **extra)


def random_generators(model) -> list:
  """The random number generators of `model`'s random layers (dropout), in layer order.

  Keras saves only layers with weights, so the state of a dropout layer's
  generator is not in the model's checkpoint; saving these with it lets a
  resumed run draw the same dropout masks as an uninterrupted one (when Keras
  uses tf.random.Generator: `tf.keras.backend.experimental.
  enable_tf_random_generator()`, on while a seeded pipeline builds its model).
  """
  # `_random_generator` is the one attribute through which Keras 2's
  # BaseRandomLayer exposes its generator.
  return [
      layer._random_generator for layer in model.submodules  # pylint: disable=protected-access
      if isinstance(layer, tf.keras.__internal__.layers.BaseRandomLayer)
  ]


class TrainingCheckpoint:
  """The checkpoints of a training run: `training_checkpoint` plus the epoch.

  Saved as `<directory>/ckpt-<epochs done>` after every epoch, the newest
  `max_to_keep` kept (tf.train.CheckpointManager). TF writes the files of a
  checkpoint first and the `checkpoint` state file last, so a process killed
  while saving leaves the previous checkpoint current and loadable.

  Args:
    model: A compiled SparseRankingModel.
    directory: The checkpoint directory, e.g. `model_dir/checkpoints`.
    max_to_keep: Checkpoints kept.
    shards: Tables sharded over workers: their keras/sharded.ShardCheckpoints,
      saved and restored with every checkpoint (`shards-<N>` beside `ckpt-<N>`).

  Attributes:
    epoch: int64 variable, the number of epochs trained (saved with the rest).
  """

  def __init__(self, model, directory: str, max_to_keep: int = 3, shards=None):
    self.directory = directory
    self._shards = shards
    # Saves killed mid-write leave ckpt-N_temp* directories: never current, removed here.
    atomic_dir.remove_checkpoint_temp_dirs(directory)
    self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epochs_done")
    self._checkpoint = training_checkpoint(model, sharded=shards is not None, epoch=self.epoch)
    self._manager = tf.train.CheckpointManager(self._checkpoint, directory, max_to_keep=max_to_keep)

  @property
  def latest(self) -> str | None:
    """Path prefix of the newest checkpoint, or None."""
    return self._manager.latest_checkpoint

  def restore(self) -> int:
    """Restores the newest checkpoint; returns its number of epochs done.

    Variables created later (optimizer slots) are restored when created.

    Raises:
      FileNotFoundError: the directory holds no checkpoint.
      ValueError: the checkpoint holds another model (an object it saved has
        no counterpart here, or a shape differs), naming the checkpoint.
    """
    latest = self.latest
    if latest is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    try:
      self._checkpoint.restore(latest).assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as e:
      raise ValueError(f"checkpoint {latest} does not match this model and its tables "
                       f"(another config?): {e}") from e
    if self._shards is not None:
      self._shards.restore(int(self.epoch.numpy()))
    return int(self.epoch.numpy())

  def save(self, epochs_done: int) -> str:
    """Saves everything as `ckpt-<epochs_done>`; returns its path prefix."""
    self.epoch.assign(epochs_done)
    if self._shards is not None:
      self._shards.save(epochs_done)
    path = self._manager.save(checkpoint_number=epochs_done)
    if self._shards is not None:
      self._shards.prune(int(p.rsplit("-", 1)[1]) for p in self._manager.checkpoints)
    return path


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
  """Saves a TrainingCheckpoint at the end of every epoch (after validation).

  Args:
    checkpoint: The run's TrainingCheckpoint.
  """

  def __init__(self, checkpoint: TrainingCheckpoint):
    super().__init__()
    self.checkpoint = checkpoint

  def on_epoch_end(self, epoch, logs=None):
    self.checkpoint.save(epoch + 1)


class BestModelExporter(tf.keras.callbacks.Callback):
  """Exports the model whenever a validation metric improves.

  The best value so far is kept in `<path>/best_metric.json` ({"monitor",
  "value", "epoch"}), so a resumed run exports only when it beats the best
  epoch before the restart.

  Args:
    export_fn: (model, path) -> None, e.g. ModelFitPipeline.export_saved_model.
    path: Export directory, overwritten at each improvement.
    monitor: Keras log key, e.g. "val_ndcg_10".
    higher_is_better: Direction of `monitor`.

  Raises:
    KeyError (at epoch end): `monitor` is not among the logs (named).
  """

  STATE_FILE = "best_metric.json"

  def __init__(self, export_fn: Callable, path: str, monitor: str, higher_is_better: bool):
    super().__init__()
    self.export_fn, self.path, self.monitor = export_fn, path, monitor
    self.higher_is_better = higher_is_better
    self.best = None
    state_path = os.path.join(path, self.STATE_FILE)
    if os.path.exists(state_path):
      with open(state_path, encoding="utf-8") as f:
        state = json.load(f)
      if state.get("monitor") == monitor:
        self.best = float(state["value"])

  def on_epoch_end(self, epoch, logs=None):
    logs = logs or {}
    if self.monitor not in logs:
      raise KeyError(f"BestModelExporter: '{self.monitor}' is not in the logs {sorted(logs)}")
    value = float(logs[self.monitor])
    better = self.best is None or (value > self.best
                                   if self.higher_is_better else value < self.best)
    if better:
      self.best = value
      self.export_fn(self.model, self.path)
      with open(os.path.join(self.path, self.STATE_FILE), "w", encoding="utf-8") as f:
        json.dump({"monitor": self.monitor, "value": value, "epoch": epoch + 1}, f)


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
