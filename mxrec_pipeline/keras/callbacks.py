"""Keras callbacks of the pipeline: checkpoints with tables, best-model export, eviction."""

from __future__ import annotations

import json
import os
import re
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core import feature_process
from mxrec_pipeline.keras import manifest
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.util import atomic_dir
from mxrec_pipeline.util import faults as faults_lib
from mxrec_pipeline.util import storage
from mxrec_pipeline.util import initialize
from mxrec_pipeline.util import model_files


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
      (keras/table_checkpoints.py), not here.
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


class BestMetric:
  """The best validation value so far, its epoch and monitor, as variables.

  Saved with every training checkpoint (`TrainingCheckpoint`), so every
  worker of a job, and a restarted job, agrees on whether an epoch improves
  on it (BestModelExporter). `epoch` 0: no best yet.
  """

  def __init__(self):
    self.value = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="best_metric")
    self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="best_epoch")
    self.monitor = tf.Variable("", dtype=tf.string, trainable=False, name="best_monitor")

  def trackables(self) -> dict:
    return {"best_metric": self.value, "best_epoch": self.epoch, "best_monitor": self.monitor}

  def get(self, monitor: str) -> float | None:
    """The best value of `monitor`, or None (none yet, or the best of another monitor)."""
    if int(self.epoch.numpy()) == 0 or self.monitor.numpy().decode() != monitor:
      return None
    return float(self.value.numpy())

  def set(self, monitor: str, value: float, epoch: int) -> None:
    self.monitor.assign(monitor)
    self.value.assign(value)
    self.epoch.assign(epoch)


_PLACEMENTS = {
    "one_host": "one host (no sharding)", "workers": "workers (MultiWorkerMirroredStrategy shards)",
    "parameter_servers": "ps tasks (ParameterServerStrategy shards)"
}


class CheckpointError(ValueError):
  """No checkpoint of a run can be restored, or one was written by another config (named)."""


def checkpoint_number(prefix: str) -> int:
  """N of a checkpoint path prefix `.../ckpt-N`."""
  return int(prefix.rsplit("-", 1)[1])


def restorable_checkpoint(
    directory: str, shards_path: Callable[[int], str] | None = None
) -> tuple[str | None, bool, list[tuple[str, str]]]:
  """The newest checkpoint of `directory` that is complete: (prefix, legacy, skipped).

  A checkpoint is complete when its manifest is written and its files have
  the sizes it lists (keras/manifest.py). One without a manifest is a
  checkpoint of a version before manifests (legacy, returned as such) when it
  holds no BestMetric; otherwise its save did not finish. `skipped` lists the
  newer checkpoints passed over, with the reason.

  Args:
    directory: The checkpoint directory.
    shards_path: Checkpoint number -> its `shards-N` directory (sharded runs).
  """
  prefixes = sorted((p[:-len(".index")]
                     for p in tf.io.gfile.glob(os.path.join(directory, "ckpt-*.index"))
                     if re.fullmatch(r"ckpt-\d+\.index", os.path.basename(p))),
                    key=checkpoint_number, reverse=True)
  skipped = []
  for prefix in prefixes:
    number = checkpoint_number(prefix)
    if not tf.io.gfile.exists(manifest.path(prefix)) and is_legacy(prefix):
      return prefix, True, skipped
    reason = manifest.problem(prefix, shards_path(number) if shards_path else None)
    if reason is None:
      return prefix, False, skipped
    skipped.append((prefix, reason))
  return None, False, skipped


def is_legacy(prefix: str) -> bool:
  """Whether checkpoint `prefix` was written by a version before manifests (holds no BestMetric)."""
  try:
    names = {name for name, _ in tf.train.list_variables(prefix)}
  except (tf.errors.OpError, ValueError):
    return False
  return not any(name.startswith("best_metric/") for name in names)


class TrainingCheckpoint:
  """The checkpoints of a training run: `training_checkpoint`, the epoch and the best metric.

  Saved as `<directory>/ckpt-<epochs done>` after every epoch, the newest
  `max_to_keep` kept (tf.train.CheckpointManager), each completed by its
  manifest, written last (keras/manifest.py): restores take the newest
  complete checkpoint (`restorable_checkpoint`), saying which newer ones they
  skipped and why. A full disk during a save raises StorageFullError with the
  previous checkpoint intact.

  Args:
    model: A compiled SparseRankingModel.
    directory: The checkpoint directory, e.g. `model_dir/checkpoints`.
    max_to_keep: Checkpoints kept.
    shards: Sharded tables: their keras/table_checkpoints.TableCheckpoints,
      saved and restored with every checkpoint (`shards-<N>` beside `ckpt-<N>`).
    run_info: JSON-able description of the run recorded in every manifest;
      its "tables" (name -> spec fields) are compared on restore.
    faults: The run's util/faults.FaultPoints (checkpoint_shards, checkpoint_files).

  Attributes:
    epoch: int64 variable, the number of epochs trained (saved with the rest).
    best: BestMetric (saved with the rest).
  """

  def __init__(self, model, directory: str, max_to_keep: int = 3, shards=None,
               run_info: dict | None = None, faults: faults_lib.FaultPoints | None = None):
    self.directory = directory
    self._shards = shards
    self._run_info = dict(run_info or {})
    self._faults = faults or faults_lib.FaultPoints()
    # Saves killed mid-write leave ckpt-N_temp* directories: never current, removed here.
    atomic_dir.remove_checkpoint_temp_dirs(directory)
    self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epochs_done")
    self.best = BestMetric()
    self.restored = None  # The checkpoint `restore` restored.
    sharded = shards is not None
    self._checkpoint = training_checkpoint(model, sharded=sharded, epoch=self.epoch,
                                           **self.best.trackables())
    # Checkpoints of versions before manifests hold no best metric.
    self._legacy_checkpoint = training_checkpoint(model, sharded=sharded, epoch=self.epoch)
    self._manager = tf.train.CheckpointManager(self._checkpoint, directory, max_to_keep=max_to_keep)
    if shards is not None:  # Shards of saves that never completed (a crash before ckpt-N).
      shards.prune(
          checkpoint_number(p) for p in self._manager.checkpoints
          if tf.io.gfile.exists(manifest.path(p)) or is_legacy(p))

  def newest(self) -> str | None:
    """Path prefix of the newest checkpoint, complete or not, or None."""
    prefixes = [
        p[:-len(".index")] for p in tf.io.gfile.glob(os.path.join(self.directory, "ckpt-*.index"))
    ]
    return max(prefixes, key=checkpoint_number, default=None)

  def exists(self) -> bool:
    """Whether the directory holds any checkpoint, complete or not."""
    return self.newest() is not None

  @property
  def latest(self) -> str | None:
    """Path prefix of the newest complete checkpoint, or None."""
    return restorable_checkpoint(self.directory, self._shards_path)[0]

  def _shards_path(self, number: int) -> str | None:
    return self._shards.path(number) if self._shards is not None else None

  def restore(self) -> int:
    """Restores the newest complete checkpoint; returns its number of epochs done.

    Prints each newer checkpoint it skips and why. Variables created later
    (optimizer slots) are restored when created.

    Raises:
      FileNotFoundError: the directory holds no checkpoint.
      CheckpointError: checkpoints exist but none is complete (each named with
        its reason), or the newest complete one was written with other tables
        (what differs named), or holds another model (an object it saved has
        no counterpart here, or a shape differs).
    """
    latest, legacy, skipped = restorable_checkpoint(self.directory, self._shards_path)
    for prefix, reason in skipped:
      print(f"Skipping checkpoint {prefix}: {reason}", flush=True)
    if latest is None:
      if skipped:
        raise CheckpointError(
            f"no checkpoint in {self.directory} can be restored ("
            f"{'; '.join(f'{os.path.basename(p)}: {r}' for p, r in skipped)}); nothing was "
            "removed: restore the files, or start over with --fresh")
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    recorded = manifest.read(latest) if not legacy else None
    if recorded is not None and self._run_info.get("tables") is not None:
      differences = manifest.differences(recorded.get("run", {}), self._run_info)
      if differences:
        raise CheckpointError(f"checkpoint {latest} was written with another config: "
                              f"{'; '.join(differences)}")
    if recorded is not None:
      self._check_placement(latest, recorded.get("run", {}).get("placement") or {})
    checkpoint = self._legacy_checkpoint if legacy else self._checkpoint
    try:
      # Values nothing here uses (an earlier version's export state) are fine: expect_partial.
      checkpoint.restore(latest).assert_existing_objects_matched().expect_partial()
    except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as e:
      raise CheckpointError(f"checkpoint {latest} does not match this model and its tables "
                            f"(another config?): {e}") from e
    except (tf.errors.OpError, IndexError) as e:  # Unreadable files the manifest could not vouch.
      reason = e.message if isinstance(e, tf.errors.OpError) else str(e)
      raise CheckpointError(f"checkpoint {latest} cannot be read: {reason.splitlines()[0]}; "
                            "move it aside to resume from the one before") from e
    if self._shards is not None:
      self._shards.restore(int(self.epoch.numpy()))
    self.restored = latest
    return int(self.epoch.numpy())

  def _check_placement(self, prefix: str, saved: dict) -> None:
    """Refuses a checkpoint whose tables live elsewhere than this run can read them.

    Tables saved in the checkpoint itself (one host) and tables saved per
    shard (`shards-N`, over workers or ps tasks) are restored by different
    code; a move between the two is not supported (docs/restarts.md).

    Raises:
      CheckpointError: naming the checkpoint, both placements and what to do.
    """
    now = (self._run_info.get("placement") or {}).get("tables")
    before = saved.get("tables")
    if now is None or before is None or (before == "one_host") == (now == "one_host"):
      return
    raise CheckpointError(
        f"checkpoint {prefix} holds tables placed on {_PLACEMENTS[before]}; this run places them "
        f"on {_PLACEMENTS[now]}: a restore between the two is not supported. Resume it where it "
        "was trained, or start this run from its tables with pipeline.warm_start (one-host runs)")

  def save(self, epochs_done: int) -> str:
    """Saves everything as `ckpt-<epochs_done>`, its manifest last; returns its path prefix.

    Raises:
      StorageFullError: the disk filled up; the previous checkpoint is intact.
    """
    self.epoch.assign(epochs_done)
    prefix = os.path.join(self.directory, f"ckpt-{epochs_done}")
    previous = self._manager.latest_checkpoint
    intact = (f"the previous checkpoint {os.path.basename(previous)} is intact"
              if previous else "no earlier checkpoint was touched")
    with storage.full_storage_named(f"checkpoint {os.path.basename(prefix)}", self.directory,
                                    intact):
      # A manifest of an earlier save of this number (a retrained epoch) must not vouch for it.
      if tf.io.gfile.exists(manifest.path(prefix)):
        tf.io.gfile.remove(manifest.path(prefix))
      if self._shards is not None:
        self._shards.save(epochs_done)
      self._faults.reach("checkpoint_shards")
      path = self._manager.save(checkpoint_number=epochs_done)
      self._faults.reach("checkpoint_files")
      manifest.write(path, self._run_info, self._shards_path(epochs_done))
    kept = [checkpoint_number(p) for p in self._manager.checkpoints]
    for stale in tf.io.gfile.glob(os.path.join(self.directory, "ckpt-*" + manifest.SUFFIX)):
      if checkpoint_number(stale[:-len(manifest.SUFFIX)]) not in kept:
        tf.io.gfile.remove(stale)
    if self._shards is not None:
      self._shards.prune(kept)
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

  def on_epoch_end(self, epoch, logs=None):
    logs = logs or {}
    if self.monitor not in logs:
      raise KeyError(f"BestModelExporter: '{self.monitor}' is not in the logs {sorted(logs)}")
    value = float(logs[self.monitor])
    best = self.best
    better = best is None or (value > best if self.higher_is_better else value < best)
    if better:
      written = self.export_fn(self.model, self.path)
      self.state.set(self.monitor, value, epoch + 1)
      if written is None:  # Another process of the cluster writes the export.
        return
      model_files.write_text_atomically(  # A reader never sees it half-written.
          os.path.join(self.path, self.STATE_FILE),
          json.dumps({"monitor": self.monitor, "value": value, "epoch": epoch + 1}))


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
