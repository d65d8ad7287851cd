"""A training run's checkpoints: what they hold, which one restores, and moves between placements.

`TrainingCheckpoint` saves `ckpt-<epochs done>` after every epoch (dense
model, optimizers, epoch, best metric; one-host tables too) with every
table's shards by key in `shards-<N>` (keras/table_checkpoints.py), its
manifest written last (keras/manifest.py); `restorable_checkpoint` finds the
newest complete one. A checkpoint written on another placement (one host,
workers, ps tasks) restores through its placement-independent entries:
`dense_variables` and the table shards. See docs/restarts.md.
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import Callable

import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint_management  # pylint: disable=g-direct-tensorflow-import

from mxrec_pipeline.hparams import CheckpointSchedule
from mxrec_pipeline.keras import manifest
from mxrec_pipeline.keras import save_schedule
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.util import atomic_dir
from mxrec_pipeline.util import faults as faults_lib
from mxrec_pipeline.util import initialize
from mxrec_pipeline.util import model_files
from mxrec_pipeline.util import storage


def one_host_checkpoint(model, **extra) -> tf.train.Checkpoint:
  """What `ckpt-N` of a one-host run holds (checkpoint format 3): all but the flat tables.

  The dense model under placement-independent names (`dense_model/<i>`,
  `dense_variables`) and its optimizer, the sparse optimizer's step count,
  the dropout layers' generators and every tiered table whole: its device
  rows, slots, key index and tiers (the device cache's mapping, which a
  bit-exact resume needs). Flat tables are saved in `shards-N` alone, their
  used keys' rows, slots and admission state (keras/table_checkpoints.py),
  and restored there onto their saved rows, so a checkpoint's bytes follow
  the keys, not the tables' capacity.

  Args:
    model: A compiled SparseRankingModel (or any compiled Keras model).
    **extra: More trackables to save with it (e.g. an epoch counter).
  """
  optimizer = getattr(model, "sparse_optimizer", None)
  tables = initialize.get_config_initializer().tables
  tiered = {
      name: {
          "rows": table.variable, "slots": table.slot_variables(optimizer, create=True),
          "key_index": table.key_index, "tiers": table.tiers
      } for name, table in tables.items() if table.is_tiered
  }
  generators = random_generators(model)
  return tf.train.Checkpoint(
      dense_model=dense_variables(model), optimizer=model.optimizer,
      **({"sparse_iterations": optimizer.iterations} if optimizer is not None else {}),
      **({"tiered_tables": tiered} if tiered else {}),
      **({"random_generators": generators} if generators else {}), **extra)


def training_checkpoint(model, sharded: bool = False, **extra) -> tf.train.Checkpoint:
  """The checkpoint of a sharded run, or of a one-host run before checkpoint format 3.

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

  One-host runs save `one_host_checkpoint` since format 3; this restores
  what earlier versions saved (and `mxrec-pipeline export` of it).
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


def dense_variables(model) -> list[tf.Variable]:
  """`model`'s variables other than its tables' rows and sparse optimizer's, in model order.

  The same list, in the same order, whatever the placement: Keras numbers a
  model's layers with weights in checkpoint paths (`layer_with_weights-<i>`),
  and a one-host model's lookup layers hold their table's rows while a
  sharded model's hold none, so those paths differ between placements. Saved
  as `dense_model/<i>` in every checkpoint, they restore across a placement
  move (TrainingCheckpoint).
  """
  sparse_optimizer = getattr(model, "sparse_optimizer", None)
  # The model tracks its sparse optimizer (slots, step count): they are saved with the tables.
  tables = {
      id(v) for v in [
          *getattr(model, "table_variables", []), *(
              sparse_optimizer.variables if sparse_optimizer is not None else [])
      ]
  }
  return [v for v in model.weights if id(v) not in tables]


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


def improves(value: float, best: float | None, higher_is_better: bool) -> bool:
  """Whether a validation `value` beats `best` (None: no best yet); NaN never does."""
  if math.isnan(value):
    return False
  return best is None or (value > best if higher_is_better else value < best)


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
    shards_path: Checkpoint number -> its `shards-N` directory; default:
      `shards-N` beside `ckpt-N` (table_checkpoints.shards_path).
  """
  if shards_path is None:
    shards_path = lambda number: table_checkpoints.shards_path(directory, number)  # noqa: E731
  prefixes = sorted((p[:-len(".index")]
                     for p in tf.io.gfile.glob(os.path.join(directory, "ckpt-*.index"))
                     if re.fullmatch(r"ckpt-\d+\.index", os.path.basename(p))),
                    key=checkpoint_number, reverse=True)
  skipped = []
  for prefix in prefixes:
    number = checkpoint_number(prefix)
    if not tf.io.gfile.exists(manifest.path(prefix)) and is_legacy(prefix):
      return prefix, True, skipped
    reason = manifest.problem(prefix, shards_path(number))
    if reason is None:
      return prefix, False, skipped
    skipped.append((prefix, reason))
  return None, False, skipped


def is_legacy(prefix: str) -> bool:
  """Whether checkpoint `prefix` was written by a version before manifests (holds no BestMetric)."""
  try:
    names = {name for name, _ in model_files.checkpoint_names(prefix).items()}
  except (tf.errors.OpError, ValueError):
    return False
  return not any(name.startswith("best_metric/") for name in names)


class TrainingCheckpoint:
  """The checkpoints of a training run: model, optimizers, tables, the epoch and the best metric.

  Saved as `<directory>/ckpt-<epochs done>` after every epoch, the newest
  `max_to_keep` kept (tf.train.CheckpointManager), with every table's shards
  by key in `shards-<N>` beside it (`shards`), each completed by its
  manifest, written last (keras/manifest.py): restores take the newest
  complete checkpoint (`restorable_checkpoint`), saying which newer ones they
  skipped and why. A full disk during a save raises StorageFullError with the
  previous checkpoint intact. `ckpt-<N>` holds `one_host_checkpoint` on one
  host, `training_checkpoint` (model and dense optimizer) when sharded, and
  the dense model under placement-independent names in both, which a restore
  onto another placement reads with the shards.

  Args:
    model: A compiled SparseRankingModel.
    directory: The checkpoint directory, e.g. `model_dir/checkpoints`.
    max_to_keep: Checkpoints kept.
    shards: The tables' keras/table_checkpoints.TableCheckpoints (None: a
      model without tables).
    run_info: JSON-able description of the run recorded in every manifest;
      its "tables" (name -> spec fields) are compared on restore.
    faults: The run's util/faults.FaultPoints (checkpoint_shards, checkpoint_files).
    sharded: The tables are sharded over workers or ps tasks (else on one host).
    schedule: The run's keras/save_schedule.SaveSchedule: which saves hold
      the tables in full, which as deltas (what changed since the previous;
      distributed/delta.py), which epochs save, how many chains are kept
      (`keep_full`: then `max_to_keep` is not used). Default: every save full.

  Attributes:
    epoch: int64 variable, the number of epochs trained (saved with the rest).
    best: BestMetric (saved with the rest).
  """

  def __init__(self, model, directory: str, max_to_keep: int = 3, shards=None,
               run_info: dict | None = None, faults: faults_lib.FaultPoints | None = None,
               sharded: bool = False, schedule: save_schedule.SaveSchedule | None = None):
    self.directory = directory
    self.schedule = schedule or save_schedule.SaveSchedule(CheckpointSchedule())
    self._step = model.optimizer.iterations
    # The checkpoint the tables were last saved as or restored from (by their shards), which a
    # delta builds on; None: the next save is full.
    self._base = None
    self._shards = shards
    self._run_info = dict(run_info or {})
    self._faults = faults or faults_lib.FaultPoints()
    # Saves killed mid-write leave ckpt-N_temp* directories: never current, removed here.
    atomic_dir.remove_checkpoint_temp_dirs(directory)
    self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epochs_done")
    self.best = BestMetric()
    self.restored = None  # The checkpoint `restore` restored.
    self.restored_state = None  # The `state` saved with it (its manifest's), if any.
    self._sharded = sharded
    best = self.best.trackables()
    dense = dense_variables(model)
    if sharded:
      # Restores on the placement that saved it; saves add the placement-independent dense model.
      self._checkpoint = training_checkpoint(model, sharded=True, epoch=self.epoch, **best)
      saved = training_checkpoint(model, sharded=True, epoch=self.epoch, dense_model=dense, **best)
    else:
      saved = self._checkpoint = one_host_checkpoint(model, epoch=self.epoch, **best)
    # A one-host checkpoint of a version before format 3 holds the tables.
    self._format_2 = training_checkpoint(model, sharded=sharded, epoch=self.epoch, **best)
    # A restore onto another placement (`_restore_move`).
    self._moved = tf.train.Checkpoint(dense_model=dense, optimizer=model.optimizer,
                                      epoch=self.epoch, **best)
    # Checkpoints of versions before manifests hold no best metric.
    self._legacy_checkpoint = training_checkpoint(model, sharded=sharded, epoch=self.epoch)
    self._saved = saved
    self._keep_full = self.schedule.schedule.keep_full
    self._manager = tf.train.CheckpointManager(saved, directory,
                                               max_to_keep=None if self._keep_full else max_to_keep)
    if shards is not None:  # Shards of saves that crashed before their ckpt-N was written.
      shards.prune(
          checkpoint_number(p[:-len(".index")])
          for p in tf.io.gfile.glob(os.path.join(directory, "ckpt-*.index")))

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

  def _shards_path(self, number: int) -> str:
    if self._shards is not None:  # A non-chief worker's are in the chief's directory.
      return self._shards.path(number)
    return table_checkpoints.shards_path(self.directory, number)

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
    self.restored_state = (recorded or {}).get("state")
    if recorded is not None and self._run_info.get("tables") is not None:
      differences = manifest.differences(recorded.get("run", {}), self._run_info)
      if differences:
        raise CheckpointError(f"checkpoint {latest} was written with another config: "
                              f"{'; '.join(differences)}")
    move = self._placement_move(recorded)
    if move is not None:
      self._restore_move(latest, *move)
      self.schedule.restored(int(self._step.numpy()), None, None)  # A new chain at the next save.
      self.restored = latest
      return int(self.epoch.numpy())
    tables_in_ckpt = not self._sharded and (legacy or int(recorded.get("format", 0)) < 3)
    checkpoint = (self._legacy_checkpoint
                  if legacy else self._format_2 if tables_in_ckpt else self._checkpoint)
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
    if self._shards is not None and self._sharded:
      self._shards.restore(checkpoint_number(latest))
      # Deltas of a chain come from one shard count: another count starts a new chain.
      same = self._shards.same_shards(checkpoint_number(latest))
      self._base = checkpoint_number(latest) if same else None
    elif self._shards is not None and not tables_in_ckpt:  # Flat ones; tiered are in ckpt-N.
      self._shards.restore(checkpoint_number(latest), tables=self._flat_tables(), keep_rows=True)
      self._base = checkpoint_number(latest)
    number = checkpoint_number(latest)
    builds_on = self._base is not None or self._shards is None
    self.schedule.restored(
        int(self._step.numpy()),
        (len(self._shards.chain(number)) if self._shards else 1) if builds_on else None,
        table_checkpoints.chain_record(self._shards.directory, number) if self._shards else None)
    self.restored = latest
    return int(self.epoch.numpy())

  def wants_save(self) -> bool:
    """Whether the schedule saves at this epoch end (`delta_every_steps` / `_s`; not the last)."""
    return self.schedule.wants_save(int(self._step.numpy()), final=False)

  @staticmethod
  def _flat_tables() -> list[str]:
    """The run's tables without host/SSD tiers (one host)."""
    return [n for n, t in initialize.get_config_initializer().tables.items() if not t.is_tiered]

  def _placement_move(self, recorded: dict | None) -> tuple[str, str] | None:
    """(saved placement, this run's) when a checkpoint's tables lived elsewhere, else None."""
    before = ((recorded or {}).get("run", {}).get("placement") or {}).get("tables")
    now = (self._run_info.get("placement") or {}).get("tables")
    return None if None in (before, now) or before == now else (before, now)

  def _restore_move(self, prefix: str, before: str, now: str) -> None:
    """Restores a checkpoint written on another placement (docs/restarts.md).

    The dense model, the dense optimizer, the epoch and the best metric from
    their placement-independent entries (`dense_model/<i>`, `dense_variables`);
    every table's keys, rows, slots, step counts and admission/eviction state
    from the checkpoint's `shards-<N>`, re-sharded by owner onto this run's
    shards (distributed/checkpoint.restore_table).

    Raises:
      CheckpointError: a checkpoint without table shards or without the
        placement-independent dense model (written by a version before
        placement moves), or whose dense model is not this model's; naming
        the checkpoint, both placements and what to do.
    """
    moving = (f"checkpoint {prefix} holds tables placed on {_PLACEMENTS[before]}; this run "
              f"places them on {_PLACEMENTS[now]}")
    earlier = (f"it was written by a version before placement moves: resume it on "
               f"{_PLACEMENTS[before]} for one epoch with this version first")
    number = checkpoint_number(prefix)
    if self._shards is not None and not tf.io.gfile.isdir(self._shards.path(number)):
      raise CheckpointError(f"{moving}, but it has no table shards ({self._shards.path(number)}): "
                            f"{earlier}")
    if not any(
        name.startswith("dense_model/")
        for name, _ in model_files.checkpoint_names(prefix).items()):
      raise CheckpointError(f"{moving}, but it has no placement-independent dense model: "
                            f"{earlier}")
    try:
      self._moved.restore(prefix).assert_existing_objects_matched().expect_partial()
    except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as e:
      raise CheckpointError(f"{moving}, and its dense model does not match this model "
                            f"(another config?): {str(e).splitlines()[0]}") from e
    if self._shards is not None:
      self._shards.restore(number)  # The next save starts a chain on this placement.
    print(
        f"Moved checkpoint {prefix} from {_PLACEMENTS[before]} to {_PLACEMENTS[now]}: dense "
        "model and optimizer, every table's keys, rows, slots and admission state", flush=True)

  def save(self, epochs_done: int, state: dict | None = None) -> str:
    """Saves everything as `ckpt-<epochs_done>`, its manifest last; returns its path prefix.

    `state`: JSON-able state of the driver saved in the manifest, so with the
    checkpoint or not at all (`restored_state` after a restore).

    Raises:
      StorageFullError: the disk filled up; the previous checkpoint is intact.
    """
    self.epoch.assign(epochs_done)
    prefix = os.path.join(self.directory, f"ckpt-{epochs_done}")
    previous = self._manager.latest_checkpoint
    intact = (f"the previous checkpoint {os.path.basename(previous)} is intact"
              if previous else "no earlier checkpoint was touched")
    step, now = int(self._step.numpy()), self.schedule.now()
    full = True
    with storage.full_storage_named(f"checkpoint {os.path.basename(prefix)}", self.directory,
                                    intact):
      # A manifest of an earlier save of this number (a retrained epoch) must not vouch for it.
      if tf.io.gfile.exists(manifest.path(prefix)):
        tf.io.gfile.remove(manifest.path(prefix))
      if self._shards is not None:
        full = (self._base is None or self._base >= epochs_done or
                self.schedule.full_due(step, now))
        record = self.schedule.chain_record((step, now) if full else None)
        self._shards.save(epochs_done, after=None if full else self._base, record=record)
        self._base = epochs_done
      self._faults.reach("checkpoint_shards")
      path = self._manager.save(checkpoint_number=epochs_done)
      self._faults.reach("checkpoint_files")
      manifest.write(path, self._run_info, self._shards_path(epochs_done), state)
    self.schedule.saved(step, full, now)
    if self._keep_full:
      self._keep_chains(self._keep_full)
    kept = [checkpoint_number(p) for p in self._manager.checkpoints]
    for stale in tf.io.gfile.glob(os.path.join(self.directory, "ckpt-*" + manifest.SUFFIX)):
      if checkpoint_number(stale[:-len(manifest.SUFFIX)]) not in kept:
        tf.io.gfile.remove(stale)
    if self._shards is not None:
      self._shards.prune(kept)
    return path

  def _keep_chains(self, keep_full: int) -> None:
    """Removes the checkpoints of all but the newest `keep_full` chains (full save + deltas).

    Their `ckpt-<N>` files here; their manifests and shards after, with the
    rest of `save`'s pruning. The CheckpointManager (which keeps all when
    `keep_full` is set) then tracks the kept ones.
    """
    numbers = sorted(checkpoint_number(p) for p in self._manager.checkpoints)
    chains = {n: (self._shards.chain(n) if self._shards is not None else [n]) for n in numbers}
    fulls = [n for n in numbers if chains[n] == [n]][-keep_full:]
    kept = [n for n in numbers if chains[n][0] in fulls]
    if len(kept) == len(numbers):
      return
    for number in set(numbers) - set(kept):
      prefix = os.path.join(self.directory, f"ckpt-{number}")
      if tf.io.gfile.exists(manifest.path(prefix)):  # First: never a complete-looking part.
        tf.io.gfile.remove(manifest.path(prefix))
      for path in tf.io.gfile.glob(prefix + ".*"):
        tf.io.gfile.remove(path)
    paths = [os.path.join(self.directory, f"ckpt-{n}") for n in kept]
    # The state file CheckpointManager reads (TF's own writer, without tf.compat.v1's notice).
    checkpoint_management.update_checkpoint_state_internal(
        self.directory, paths[-1], paths, save_relative_paths=True,
        all_model_checkpoint_timestamps=[time.time()] * len(paths))
    self._manager = tf.train.CheckpointManager(self._saved, self.directory, max_to_keep=None)
