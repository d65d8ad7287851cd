"""PipelineHparams and the names it accepts, TensorFlow-free.

Job configs validate their `pipeline` section into PipelineHparams before
anything imports TensorFlow, so its checks compare names with the constant
lists here instead of constructing Keras objects. Users import the class as
`mxrec_pipeline.keras.pipeline.PipelineHparams` (re-exported there).
"""

from __future__ import annotations

import dataclasses
import math

from mxrec_pipeline.optimizers.keys import SparseOptimizerKey, check_sparse_optimizer

# Ranking metrics reported by the pipeline: metrics.json key -> (tfr key, topn).
RANKING_METRICS = {
    "ndcg@1": ("ndcg", 1), "ndcg@5": ("ndcg", 5), "ndcg@10": ("ndcg", 10), "mrr": ("mrr", None)
}
MULTI_WORKER_MIRRORED = "MultiWorkerMirroredStrategy"
PARAMETER_SERVER = "ParameterServerStrategy"
STRATEGIES = (None, "MirroredStrategy", MULTI_WORKER_MIRRORED, PARAMETER_SERVER)
# Seconds a collective op (all-reduce) of MultiWorkerMirroredStrategy waits for its
# peers before failing (tf.distribute.experimental.CommunicationOptions.timeout_seconds).
DEFAULT_COLLECTIVE_TIMEOUT_S = None
DEFAULT_STUCK_WORKER_TIMEOUT_S = 600.0
# The values of tfr.keras.losses.RankingLossKey (tensorflow-ranking 0.5.5); a
# test keeps them equal.
LOSS_KEYS = frozenset({
    "pairwise_hinge_loss", "pairwise_logistic_loss", "pairwise_soft_zero_one_loss",
    "pairwise_mse_loss", "yeti_logistic_loss", "softmax_loss", "calibrated_softmax_loss",
    "unique_softmax_loss", "sigmoid_cross_entropy_loss", "mean_squared_loss", "ordinal_loss",
    "list_mle_loss", "approx_ndcg_loss", "approx_mrr_loss", "gumbel_approx_ndcg_loss",
    "coupled_rankdistil_loss"
})
# tf.keras.losses.Reduction.AUTO.
AUTO_REDUCTION = "auto"
# tf.keras.losses.Reduction.all() (Keras 2.15); a test keeps them equal.
LOSS_REDUCTIONS = (AUTO_REDUCTION, "none", "sum", "sum_over_batch_size")
# The names tf.keras.optimizers.get resolves itself (Keras 2.15, any case); a
# test keeps them in step. Registered custom optimizers ("package>Name", as
# tf.keras.utils.register_keras_serializable names them) are resolved by Keras
# when the model compiles.
DENSE_OPTIMIZERS = ("adadelta", "adagrad", "adam", "adamax", "ftrl", "nadam", "rmsprop", "sgd")


@dataclasses.dataclass
class PipelineHparams:
  """Hyperparameters of ModelFitPipeline (tfr's, plus the sparse optimizer).

  Attributes:
    model_dir: Output directory: TensorBoard logs, checkpoints, exports.
    num_epochs: Epochs of training, > 0.
    num_train_steps: Total training steps over all epochs: epochs of
      ceil(num_train_steps / num_epochs) steps, the last one shorter, so that
      exactly num_train_steps steps run (fewer epochs than `num_epochs` when
      num_train_steps < num_epochs; see keras.epochs.epoch_steps). None
      trains each epoch on one pass over the training data.
    num_valid_steps: Validation steps per epoch; None validates on the whole
      validation data.
    learning_rate: Learning rate of the dense optimizer, finite and > 0.
    loss: A tfr loss key (tfr.keras.losses.RankingLossKey), e.g. "softmax_loss".
    loss_reduction: A tf.keras.losses.Reduction value (LOSS_REDUCTIONS).
    optimizer: The dense variables' optimizer: a DENSE_OPTIMIZERS name (any
      case), or a registered custom optimizer "package>Name" (checked by
      Keras when the model compiles).
    sparse_optimizer: Optimizer of the tables: "lazy_adam", "adagrad" or "sgd".
    sparse_learning_rate: Its learning rate; None uses `learning_rate`.
    steps_per_execution: Steps per tf.function call in model.fit, > 0.
    export_best_model: Also export the model of the best validation epoch.
    best_exporter_metric: RANKING_METRICS key or "loss" that picks it.
    best_exporter_metric_higher_better: Whether higher is better for it.
    strategy: None (default strategy), "MirroredStrategy" (every local GPU, or
      the CPU) or "MultiWorkerMirroredStrategy" (synchronous training over the
      workers of the cluster in the TF_CONFIG environment variable, every local
      GPU or the CPU of each; see docs/distributed.md). The worker that is the
      chief (mxrec_pipeline.cluster.tf_config) writes the run's outputs.
      "ParameterServerStrategy": asynchronous training, the chief of the
      TF_CONFIG cluster coordinating model.fit, its "worker" and "ps" tasks
      running mxrec_pipeline.cluster.ps_server, the tables sharded by key
      over the ps tasks (docs/distributed.md "Parameter servers").
    collective_timeout_s: None (default), or seconds, finite and > 0, that a
      collective op of MultiWorkerMirroredStrategy (the all-reduce of a step)
      waits for its peers before it fails
      (tf.distribute.experimental.CommunicationOptions.timeout_seconds). Used
      only by that strategy. Without it a dead or frozen worker still ends the
      job: its connections reset, or the strategy's peer health check (every
      30 s) aborts the collectives. TF 2.15 keeps one thread per collective op
      waiting for the whole timeout (~2 per step and table, more with sharded
      lookups), so a timeout of T seconds holds about steps/s x T x that many
      threads: keep it short only for short jobs.
    stuck_worker_timeout_s: None, or seconds (default 600), finite and > 0:
      under MultiWorkerMirroredStrategy with several workers, a worker whose
      training and validation batches have not moved for this long ends the
      job, naming the workers stuck behind the others
      (distributed/watchdog.py). Longer than any pause between two batches
      (a checkpoint save, an export). None: no watchdog.
    seed: Seed of TensorFlow, Python and NumPy, of the tables, of dropout
      and of the order of the training data (each epoch's shuffle is seeded
      by `seed` and the epoch number); None: unseeded.
    resume: Whether a run whose `model_dir/checkpoints` holds a checkpoint
      continues from it (at the epoch after the checkpoint's). False refuses
      such a model_dir with FileExistsError; `mxrec-pipeline train --fresh`
      clears it. See docs/restarts.md.
    warm_start: None, or where a new run's tables start from (mxRec's
      `Saver(warm_start_tables=...)`): {"from": a checkpoint path prefix or
      its directory, "tables": source table names (default: every table of
      this model that the checkpoint has), "rename": {source name: this
      model's name}, "slots": also take the optimizer slots (default false)};
      see `WarmStart`. Used only when model_dir holds no checkpoint.
    sharding: None, or how tables sharded over MultiWorkerMirroredStrategy
      workers route a lookup: {"routing": "all_gather" | "all_to_all" |
      "auto"} (default auto: all_to_all on 2+ workers); see `Sharding`.
    sidecar_evaluator: Under ParameterServerStrategy only: validation runs
      in a separate "evaluator" task (mxrec_pipeline/sidecar.py, as
      tf.keras.utils.SidecarEvaluator) that scores each new checkpoint and
      writes `validation.jsonl`, the `logs/validation` summaries and the
      best-model export; the coordinator then validates no epoch (the
      workers never wait for it) and scores only the final model. False
      (default): the coordinator validates after each epoch. With
      `export_best_model`, `best_exporter_metric` must be a ranking metric
      (the evaluator scores what the export serves, without the loss).
    checkpoint: None, or when checkpoints are saved and which save the
      tables in full: {"full_every_epochs" | "full_every_steps" |
      "full_every_s", "delta_every_steps" | "delta_every_s", "keep_full"};
      delta checkpoints between full ones hold what changed since the
      previous one; see `CheckpointSchedule`. Default: every epoch, in full.
    early_stopping: None, or {"patience", "then"}: stop once the validation
      `best_exporter_metric` has not improved for `patience` epochs
      (`num_epochs` is then the most), then keep the best epoch's model or
      the last, or retrain (a job with a holdout); see `EarlyStopping`.
  """

  model_dir: str
  num_epochs: int = 1
  num_train_steps: int | None = None
  num_valid_steps: int | None = None
  learning_rate: float = 0.01
  loss: str = "softmax_loss"
  loss_reduction: str = AUTO_REDUCTION
  optimizer: str = "adam"
  sparse_optimizer: str = SparseOptimizerKey.LAZY_ADAM
  sparse_learning_rate: float | None = None
  steps_per_execution: int = 1
  export_best_model: bool = False
  best_exporter_metric: str = "ndcg@10"
  best_exporter_metric_higher_better: bool = True
  strategy: str | None = "MirroredStrategy"
  collective_timeout_s: float | None = DEFAULT_COLLECTIVE_TIMEOUT_S
  stuck_worker_timeout_s: float | None = DEFAULT_STUCK_WORKER_TIMEOUT_S
  seed: int | None = None
  resume: bool = True
  warm_start: dict | None = None
  sharding: dict | None = None
  checkpoint: dict | None = None
  sidecar_evaluator: bool = False
  early_stopping: dict | None = None

  def __post_init__(self):
    if not self.model_dir:
      raise ValueError("`model_dir` must be non-empty")
    for name in ("num_epochs", "steps_per_execution"):
      _check_positive_int(name, getattr(self, name))
    for name in ("num_train_steps", "num_valid_steps"):
      if getattr(self, name) is not None:
        _check_positive_int(name, getattr(self, name))
    for name in ("learning_rate", "sparse_learning_rate", "collective_timeout_s",
                 "stuck_worker_timeout_s"):
      value = getattr(self, name)
      if value is not None and not (value > 0 and math.isfinite(value)):
        raise ValueError(f"`{name}` must be a finite positive number, got {value}")
    if self.loss not in LOSS_KEYS:
      raise ValueError(f"`loss` must be a tfr loss key {sorted(LOSS_KEYS)}, got {self.loss!r}")
    if self.loss_reduction not in LOSS_REDUCTIONS:
      raise ValueError(f"`loss_reduction` must be one of {list(LOSS_REDUCTIONS)}, "
                       f"got {self.loss_reduction!r}")
    if not isinstance(self.optimizer, str) or (self.optimizer.lower() not in DENSE_OPTIMIZERS and
                                               ">" not in self.optimizer):
      raise ValueError(f"`optimizer` must be one of {list(DENSE_OPTIMIZERS)} (or a registered "
                       f"custom optimizer 'package>Name'), got {self.optimizer!r}")
    if self.strategy not in STRATEGIES:
      raise ValueError(f"`strategy` must be one of {STRATEGIES}, got {self.strategy!r}")
    if self.best_exporter_metric not in (*RANKING_METRICS, "loss"):
      raise ValueError(f"`best_exporter_metric` must be one of "
                       f"{[*RANKING_METRICS, 'loss']}, got {self.best_exporter_metric!r}")
    check_sparse_optimizer(self.sparse_optimizer)
    if self.sidecar_evaluator:
      if self.strategy != PARAMETER_SERVER:
        raise ValueError(f"`sidecar_evaluator` needs strategy {PARAMETER_SERVER!r} (its "
                         f"coordinator skips validation), got strategy {self.strategy!r}")
      if self.export_best_model and self.best_exporter_metric == "loss":
        raise ValueError("`sidecar_evaluator` scores ranking metrics, not the loss: set "
                         f"`best_exporter_metric` to one of {list(RANKING_METRICS)}")
    if self.warm_start is not None:
      WarmStart.from_dict(self.warm_start)
    Sharding.from_dict(self.sharding)
    CheckpointSchedule.from_dict(self.checkpoint)
    if self.early_stopping is not None:
      EarlyStopping.from_dict(self.early_stopping)
      if self.strategy in (MULTI_WORKER_MIRRORED, PARAMETER_SERVER):
        raise ValueError(f"`early_stopping` runs on one host (strategy null or "
                         f"MirroredStrategy) in this version, got strategy {self.strategy!r}")


@dataclasses.dataclass(frozen=True)
class WarmStart:
  """PipelineHparams.warm_start, checked (keras/warm_start.py applies it).

  Attributes:
    source: Checkpoint path prefix (".../ckpt-3") or a directory holding
      checkpoints (its newest complete one); the YAML key is `from`.
    tables: Source table names to take; () takes every table of the new
      model (after `rename`) that the checkpoint holds.
    rename: Source table name -> the new model's table name.
    slots: Also take the rows' optimizer slots (same sparse optimizer).
  """

  source: str
  tables: tuple[str, ...] = ()
  rename: dict[str, str] = dataclasses.field(default_factory=dict)
  slots: bool = False

  @classmethod
  def from_dict(cls, raw: dict) -> "WarmStart":
    """From {"from", "tables", "rename", "slots"}.

    Raises:
      ValueError: unknown keys, no `from`, or values of the wrong type (named).
    """
    _check_mapping("warm_start", raw, ("from", "tables", "rename", "slots"))
    source = raw.get("from")
    if not isinstance(source, str) or not source:
      raise ValueError(f"`warm_start.from` must be a checkpoint path, got {source!r}")
    tables = raw.get("tables") or []
    if not isinstance(tables, (list, tuple)) or not all(isinstance(t, str) for t in tables):
      raise ValueError(f"`warm_start.tables` must be a list of table names, got {tables!r}")
    rename = raw.get("rename") or {}
    if not isinstance(rename, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in rename.items()):
      raise ValueError(f"`warm_start.rename` must map table names to table names, got {rename!r}")
    slots = raw.get("slots", False)
    if not isinstance(slots, bool):
      raise ValueError(f"`warm_start.slots` must be true or false, got {slots!r}")
    return cls(source, tuple(tables), dict(rename), slots)


# distributed/sharded_table.ROUTINGS plus its AUTO (a test keeps them in step).
ROUTINGS = ("all_gather", "all_to_all", "auto")


@dataclasses.dataclass(frozen=True)
class Sharding:
  """PipelineHparams.sharding, checked: tables sharded over MultiWorkerMirrored workers.

  Attributes:
    routing: How a lookup reaches the rows' owners and back:
      "all_gather" (every worker receives every worker's ids and rows:
      bytes grow with the worker count W), "all_to_all" (each worker receives
      its own, padded to the largest worker-to-owner chunk) or "auto"
      (default: all_to_all on 2+ workers for the run's first 64 tables,
      all_gather otherwise; distributed/sharded_table.choose_routing). The
      result is the same either way; docs/scaling.md has the bytes.
  """

  routing: str = "auto"

  @classmethod
  def from_dict(cls, raw: dict | None) -> "Sharding":
    """From {"routing"} (None: the defaults).

    Raises:
      ValueError: not a mapping, unknown keys, or an unknown routing (named).
    """
    if raw is None:
      return cls()
    _check_mapping("sharding", raw, ("routing",))
    routing = raw.get("routing", cls.routing)
    if routing not in ROUTINGS:
      raise ValueError(f"`sharding.routing` must be one of {list(ROUTINGS)}, got {routing!r}")
    return cls(routing)


@dataclasses.dataclass(frozen=True)
class CheckpointSchedule:
  """PipelineHparams.checkpoint, checked: when checkpoints are saved, full or as deltas.

  Checkpoints are taken at the ends of epochs (of partitions in a continuous
  run); the schedule decides, at each, whether to save and whether the
  tables are saved in full or as a delta: the keys training touched since the
  previous checkpoint, with their rows, slots and admission state, and the
  keys eviction removed (distributed/delta.py; mxRec's `save_delta`). A
  restore reads the full save and its deltas in order. Flat and tiered tables.

  Attributes:
    full_every_epochs: A full save every this many checkpoints, deltas
      between. 1 (default): every checkpoint full.
    full_every_steps: A full save at the first checkpoint at least this many
      training steps after the chain's full save (instead of
      full_every_epochs).
    full_every_s: A full save at the first checkpoint at least this many
      seconds (wall clock) after the chain's full save (mxRec's
      `save_checkpoint_due_time`); the full save's time is in the checkpoint
      (`shards-<N>/chain.json`), so the interval holds across restarts.
    delta_every_steps: Save a checkpoint only once at least this many steps
      passed since the previous one (other epoch ends save nothing; a resume
      retrains from the last one). None (default): every epoch end.
    delta_every_s: The same in seconds (mxRec's `save_delta_checkpoints_secs`).
      The last epoch of a run and a due full save are always saved.
    keep_full: Keep this many full saves and the checkpoints of their chains
      (older chains are removed whole). None (default): the newest 3
      checkpoints, and the chains they build on.

  Seconds are measured on one clock for all workers (keras/save_schedule.py).
  """

  full_every_epochs: int = 1
  full_every_steps: int | None = None
  full_every_s: float | None = None
  delta_every_steps: int | None = None
  delta_every_s: float | None = None
  keep_full: int | None = None

  FIELDS = ("full_every_epochs", "full_every_steps", "full_every_s", "delta_every_steps",
            "delta_every_s", "keep_full")

  @property
  def has_deltas(self) -> bool:
    """Whether some checkpoints can be deltas (a full save is not every one)."""
    return (self.full_every_epochs > 1 or self.full_every_steps is not None or
            self.full_every_s is not None)

  @property
  def uses_clock(self) -> bool:
    """Whether a decision depends on wall-clock time."""
    return self.full_every_s is not None or self.delta_every_s is not None

  @classmethod
  def from_dict(cls, raw: dict | None) -> "CheckpointSchedule":
    """From a mapping of FIELDS (None: the defaults).

    Raises:
      ValueError: not a mapping, unknown keys, a count that is not a positive
        int, seconds that are not a positive number, two full schedules
        (full_every_epochs, full_every_steps, full_every_s: one at most) or
        both delta schedules, or a delta schedule without deltas (every save
        full), each named.
    """
    if raw is None:
      return cls()
    _check_mapping("checkpoint", raw, cls.FIELDS)
    for name in ("full_every_epochs", "full_every_steps", "delta_every_steps", "keep_full"):
      if name in raw:
        _check_positive_int(f"checkpoint.{name}", raw[name])
    for name in ("full_every_s", "delta_every_s"):
      value = raw.get(name)
      if name in raw and (isinstance(value, bool) or not isinstance(value, (int, float)) or
                          not 0 < value < float("inf")):
        raise ValueError(f"`checkpoint.{name}` must be a positive number of seconds, got "
                         f"{value!r}")
    fulls = [n for n in ("full_every_epochs", "full_every_steps", "full_every_s") if n in raw]
    if len(fulls) > 1:
      raise ValueError(f"`checkpoint`: {' and '.join(fulls)} both set; choose one full-save "
                       "schedule")
    if "delta_every_steps" in raw and "delta_every_s" in raw:
      raise ValueError("`checkpoint`: delta_every_steps and delta_every_s both set; choose one")
    schedule = cls(**{k: raw[k] for k in cls.FIELDS if k in raw})
    delta = next((n for n in ("delta_every_steps", "delta_every_s") if n in raw), None)
    if delta is not None and not schedule.has_deltas:
      raise ValueError(f"`checkpoint.{delta}` schedules delta saves, but every save is full: "
                       "set full_every_steps, full_every_s or full_every_epochs > 1")
    return schedule


# What an early-stopped run serves and reports (EarlyStopping.then).
KEEP_BEST, KEEP_LAST, RETRAIN = "keep_best", "keep_last", "retrain"


@dataclasses.dataclass(frozen=True)
class EarlyStopping:
  """PipelineHparams.early_stopping, checked: the rule of tf.keras.callbacks.EarlyStopping.

  Training stops at the end of the first epoch that is `patience` epochs
  after the best validation value of `best_exporter_metric` so far (its
  direction `best_exporter_metric_higher_better`); the best value and its
  epoch are in every checkpoint, so a rerun of a stopped run trains nothing
  and a resumed one counts on.

  Attributes:
    patience: Epochs without improvement before stopping, > 0.
    then: What the run serves and reports: "keep_best" (the best epoch's
      model: it is exported as best_model_by_metric when it is reached, and
      copied as latest_model at the end), "keep_last" (the last epoch's, as
      Keras' `restore_best_weights=False`), or "retrain" (a job whose data
      holds out training lists for validation, `DataPaths.holdout`: a
      selection run on the rest finds the best epoch count E, then the
      model is trained on every training list for E epochs; jobs.train).
  """

  patience: int = 10
  then: str = RETRAIN

  THEN = (KEEP_BEST, KEEP_LAST, RETRAIN)

  @classmethod
  def from_dict(cls, raw: dict | None) -> "EarlyStopping | None":
    """From {"patience", "then"}; None: no early stopping.

    Raises:
      ValueError: not a mapping, unknown keys, a patience that is not a
        positive int, or an unknown `then` (named).
    """
    if raw is None:
      return None
    _check_mapping("early_stopping", raw, ("patience", "then"))
    if "patience" in raw:
      _check_positive_int("early_stopping.patience", raw["patience"])
    then = raw.get("then", cls.then)
    if then not in cls.THEN:
      raise ValueError(f"`early_stopping.then` must be one of {list(cls.THEN)}, got {then!r}")
    return cls(raw.get("patience", cls.patience), then)


def _check_mapping(name: str, raw, known: tuple[str, ...]) -> None:
  """Raises ValueError unless `raw` is a mapping whose keys are among `known` (`name` in it)."""
  if not isinstance(raw, dict):
    raise ValueError(f"`{name}` must be a mapping, got {raw!r}")
  unknown = sorted(set(raw) - set(known))
  if unknown:
    raise ValueError(f"`{name}`: unknown keys {unknown}; known: {', '.join(known)}")


def _check_positive_int(name, value):
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ValueError(f"`{name}` must be a positive int, got {value!r}")


@dataclasses.dataclass
class MetricsConfig:
  """How the validation metrics (RANKING_METRICS) treat queries without a relevant document.

  Attributes:
    skip_queries_without_relevant: False (default, TF-Ranking's convention,
      `tfr.keras.metrics` 0.5.5): a validation list without a document of
      label > 0 scores 0 in NDCG and MRR and counts with the mean list weight
      (1 with unweighted lists), lowering the mean. True: such lists are
      left out of every metric of the model and the baselines, which then
      compare rankers on the lists where ranking matters (LightGBM's own
      NDCG scores such a query 1, a third convention). metrics.json states
      which was used.
  """

  skip_queries_without_relevant: bool = False


LATE_PARTITION_POLICIES = ("train", "skip")


@dataclasses.dataclass
class ContinuousConfig:
  """`train --continuous`: training on data partitions as they arrive (docs/continuous.md).

  Attributes:
    partitions_dir: Directory of the partitions (one subdirectory each, its
      ELWC files `*.tfrecord` and a `_SUCCESS` marker once complete;
      mxrec_pipeline/data/partitions.py). Required for `--continuous`.
    late_partitions: A partition older than the newest one trained that
      arrives late: "train" (next, before newer ones) or "skip" (never).
    poll_s: Seconds between two looks for new partitions when every
      arrived one is trained; 0: stop then instead of waiting.
    max_partitions: Stop after training this many partitions in this run
      (None: no limit).
    export_every_s: At most one export every this many seconds (0: after
      every partition); the newest partition is always exported at the end.
    exports_to_keep: Newest versions kept in `model_dir/export/` (>= 1).
  """

  partitions_dir: str | None = None
  late_partitions: str = "train"
  poll_s: float = 60.0
  max_partitions: int | None = None
  export_every_s: float = 0.0
  exports_to_keep: int = 5

  def __post_init__(self):
    if self.late_partitions not in LATE_PARTITION_POLICIES:
      raise ValueError(f"`late_partitions` must be one of {LATE_PARTITION_POLICIES}, got "
                       f"{self.late_partitions!r}")
    for name in ("poll_s", "export_every_s"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"`{name}` must be a number >= 0, got {value!r}")
    if self.max_partitions is not None:
      _check_positive_int("max_partitions", self.max_partitions)
    _check_positive_int("exports_to_keep", self.exports_to_keep)
