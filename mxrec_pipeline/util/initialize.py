"""`init()` and `terminate_config_initializer()`, as in mx_rec.util.initialize.

mxRec keeps one process-wide ConfigInitializer between `init()` and
`terminate_config_initializer()`: the run's step counts and modes, and the
tables created since. This module holds that one piece of global state, and
nothing else in the package keeps any.

Example:
  >>> from mxrec_pipeline.util.initialize import init, terminate_config_initializer
  >>> init(train_steps=100, eval_steps=10)
  >>> ...  # create_table, sparse_lookup, training
  >>> terminate_config_initializer()
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
  from mxrec_pipeline.core.embedding import SparseEmbedding

MAX_STEPS = 2**31 - 1
_STEP_KWARGS = ("train_steps", "eval_steps", "save_steps", "max_steps")
_BOOL_KWARGS = ("use_dynamic", "use_dynamic_expansion", "if_load", "use_mpi",
                "is_incremental_checkpoint")
# Seconds between saves (saver.DeltaCheckpointHook), None: not timed.
_SECONDS_KWARGS = ("save_checkpoint_due_time", "save_delta_checkpoints_secs")


@dataclasses.dataclass(frozen=True)
class InitConfig:
  """The validated arguments of `init()` (mxRec's names and defaults).

  Attributes:
    train_steps: Training steps between two evaluations, -1 for no limit.
    eval_steps: Evaluation steps per evaluation, -1 for the whole data set.
    save_steps: Steps between two checkpoints, -1 for none.
    max_steps: Total training steps, -1 for no limit.
    use_dynamic: Dynamic shapes (True). With False, mxRec's static-shape mode,
      every `sparse_lookup` must give `send_count`, the most distinct ids of a
      table per batch, and a batch with more fails naming the table.
    use_dynamic_expansion: mxRec's dynamic expansion: create_table builds
      tables that grow past device_vocabulary_size, with rows of [embedding |
      optimizer slots] in a native host store (core/expansion.py), trained with
      the *_by_addr optimizers (the plain hash optimizers refuse such runs).
    if_load: The run restores a checkpoint before training (informational here:
      restoring is done by the Saver / tf.train.Checkpoint the user calls).
    use_mpi: Accepted for mxRec scripts; one process per machine here, so it
      changes nothing (scale-out uses tf.distribute, see docs).
    is_incremental_checkpoint: Delta checkpoints: a full save of the Saver
      starts a chain, `Saver.save(..., save_delta=True)` writes what changed
      since the chain's previous save (saver/saver.py).
    save_checkpoint_due_time: Seconds between full saves of
      saver.DeltaCheckpointHook (None: only its first and last saves).
    save_delta_checkpoints_secs: Seconds between its delta saves (None: none);
      needs is_incremental_checkpoint.
    restore_model_version: The step whose checkpoint `Saver.restore` of a
      directory restores (None: the newest).
    recent_key_count_threshold: mxRec's low-frequency filter of delta saves,
      in [0, 2^31-1]: a delta of the Saver leaves out the keys training
      touched fewer times than this since the previous save (occurrences in
      the batches; sightings' counts with admission), so their latest
      changes are not in the chain. 0 (default): every changed key. Above 0
      the key index counts touches, 4 B per row.
  """

  train_steps: int = -1
  eval_steps: int = -1
  save_steps: int = -1
  max_steps: int = -1
  use_dynamic: bool = True
  use_dynamic_expansion: bool = False
  if_load: bool = False
  use_mpi: bool = False
  is_incremental_checkpoint: bool = False
  save_checkpoint_due_time: int | None = None
  save_delta_checkpoints_secs: int | None = None
  restore_model_version: int | None = None
  recent_key_count_threshold: int = 0

  def __post_init__(self):
    for name in _STEP_KWARGS:
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an int, got {value!r}")
      if not -1 <= value <= MAX_STEPS:
        raise ValueError(f"`{name}` must be in [-1, {MAX_STEPS}], got {value}")
      if value == 0:
        raise ValueError(f"`{name}` must be -1 (no limit) or positive, got 0")
      object.__setattr__(self, name, int(value))  # NumPy integers are kept as ints.
    if self.eval_steps != -1 and self.train_steps == -1:
      raise ValueError(f"`eval_steps`={self.eval_steps} needs `train_steps` (the training steps "
                       "between two evaluations); give both, or leave eval_steps at -1")
    for name in ("train_steps", "save_steps"):
      if self.max_steps != -1 and getattr(self, name) > self.max_steps:
        raise ValueError(f"`{name}`={getattr(self, name)} exceeds `max_steps`={self.max_steps}")
    for name in _BOOL_KWARGS:
      value = getattr(self, name)
      if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be a bool, got {value!r}")
    for name in (*_SECONDS_KWARGS, "restore_model_version"):
      value = getattr(self, name)
      if value is None:
        continue
      if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an int or None, got {value!r}")
      if not (0 if name == "restore_model_version" else 1) <= value <= MAX_STEPS:
        raise ValueError(f"`{name}` must be in [{0 if name == 'restore_model_version' else 1}, "
                         f"{MAX_STEPS}], got {value}")
      object.__setattr__(self, name, int(value))
    threshold = self.recent_key_count_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Integral):
      raise TypeError(f"`recent_key_count_threshold` must be an int, got {threshold!r}")
    if not 0 <= threshold <= MAX_STEPS:
      raise ValueError(f"`recent_key_count_threshold` must be in [0, {MAX_STEPS}], got {threshold}")
    object.__setattr__(self, "recent_key_count_threshold", int(threshold))
    if threshold and not self.is_incremental_checkpoint:
      raise ValueError(f"`recent_key_count_threshold`={threshold} filters delta checkpoints: it "
                       "needs `is_incremental_checkpoint=True`")
    if self.save_delta_checkpoints_secs is not None and not self.is_incremental_checkpoint:
      raise ValueError(f"`save_delta_checkpoints_secs`={self.save_delta_checkpoints_secs} needs "
                       "`is_incremental_checkpoint=True` (delta checkpoints)")


class ConfigInitializer:
  """What `init()` sets up for the process: config, tables, resource container.

  Attributes:
    config: The InitConfig given to init().
    container: Resource container of this run's key indexes; new for every
      init(), so tables of an earlier run never leak into this one.
    tables: Table name -> SparseEmbedding, in creation order.
    insert_tables: Names of the tables the run's insert functions feed.
    admit_evict: Table name -> AdmitEvictConfig (core/admission.py), set by
      FeatureSpecs and access_and_evict_config.
    hash_optimizers: Hash optimizers that created slots in this run (eviction
      resets their slots).
    ps_tables: Table name -> table sharded over parameter servers
      (distributed/ps_mxrec.create_table), kept apart from `tables`, whose
      entries are the core's.
  """

  _ids = itertools.count()

  def __init__(self, config: InitConfig):
    self.config = config
    self.container = f"mxrec_pipeline_{next(self._ids)}"
    self.tables: dict[str, SparseEmbedding] = {}
    # Tables named by the run's insert functions (start_asc_pipeline checks them).
    self.insert_tables: set[str] = set()
    self.admit_evict: dict = {}
    self.hash_optimizers: list = []
    self.ps_tables: dict = {}


_initializer: ConfigInitializer | None = None


def init(**kwargs) -> ConfigInitializer:
  """Starts an mxRec run: validates and stores the run's settings.

  Args:
    **kwargs: mxRec's init arguments, see `InitConfig` for each one:
      train_steps, eval_steps, save_steps, max_steps (ints in [-1, 2^31-1], not
      0), use_dynamic, use_dynamic_expansion, if_load, use_mpi,
      is_incremental_checkpoint (bools), save_checkpoint_due_time,
      save_delta_checkpoints_secs (seconds >= 1 or None), restore_model_version
      (a step >= 0 or None), recent_key_count_threshold (an int >= 0).

  Returns:
    The process's ConfigInitializer.

  Raises:
    TypeError: an unknown argument (named) or a value of the wrong type.
    ValueError: a step count, number of seconds or threshold out of range;
      save_delta_checkpoints_secs or recent_key_count_threshold without
      is_incremental_checkpoint.
    RuntimeError: init() was called before without terminate_config_initializer().
  """
  global _initializer
  known = {f.name for f in dataclasses.fields(InitConfig)}
  unknown = sorted(set(kwargs) - known)
  if unknown:
    raise TypeError(f"init() got unknown arguments {unknown}; supported: {sorted(known)}")
  if _initializer is not None:
    raise RuntimeError("init() was already called; call terminate_config_initializer() before "
                       "calling init() again")
  _initializer = ConfigInitializer(InitConfig(**kwargs))
  return _initializer


def terminate_config_initializer() -> None:
  """Ends the run started by init(): forgets its tables. Safe to call twice.

  Key indexes (and tiered tables' caches and stores) created eagerly are freed
  here (nothing else would free them: they live in the process's resource
  manager, not in the table objects); those of tf.compat.v1 graphs are freed
  with their session.
  """
  global _initializer
  if _initializer is not None:
    for table in _initializer.tables.values():
      table.key_index.release()
      if table.is_tiered:
        table.tiers.release_resources()
  _initializer = None


def is_initialized() -> bool:
  """Whether init() was called and not yet terminated."""
  return _initializer is not None


def get_config_initializer() -> ConfigInitializer:
  """The ConfigInitializer of the current run.

  Raises:
    RuntimeError: init() has not been called.
  """
  if _initializer is None:
    raise RuntimeError("mxrec_pipeline is not initialized: call "
                       "mxrec_pipeline.util.initialize.init() before creating tables or "
                       "building the input pipeline")
  return _initializer


def get_use_dynamic_expansion() -> bool:
  """mxRec's mode query: whether init(use_dynamic_expansion=True) was given."""
  return get_config_initializer().config.use_dynamic_expansion
