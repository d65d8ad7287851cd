"""The jobs the CLI runs: train a config, export its latest checkpoint.

Both go through the public API only: a builder from builders.REGISTRY, a
SimplePipeline, the evaluation helpers.

Under MultiWorkerMirroredStrategy every worker runs `train` with the same
config; only the chief writes model_dir. The others train with a model_dir of
their own in a temporary directory, deleted when they end: TF's pattern for
saving under that strategy (every worker saves, so collective ops in saving
do not deadlock; non-chief workers save to temporary paths; see
https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras,
"Model saving and loading"). Under ParameterServerStrategy only the chief (the
coordinator) runs `train`; the worker and ps tasks run
mxrec_pipeline.cluster.ps_server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from typing import Iterator, Sequence

import tensorflow as tf
import yaml

import builders
from builders.base_config import DatasetConfig
from mxrec_pipeline import config as config_lib
from mxrec_pipeline import early_stopping_job
from mxrec_pipeline import evaluation
from mxrec_pipeline import hparams as hparams_lib
from mxrec_pipeline.cluster import reach
from mxrec_pipeline.cluster import tf_config
from mxrec_pipeline.data import checks
from mxrec_pipeline.data import validation
from mxrec_pipeline.distributed import watchdog
from mxrec_pipeline.gbdt import lambdamart
from mxrec_pipeline.keras import checkpoints as checkpoints_lib
from mxrec_pipeline.keras.continuous import PROGRESSIVE_LOG
from mxrec_pipeline.keras import manifest
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.keras import table_checkpoints
from mxrec_pipeline.util import initialize
from mxrec_pipeline.util import model_dir_lock
from mxrec_pipeline.util import model_files

RESOLVED_CONFIG = "config.yaml"


def setup(config: config_lib.JobConfig, strategy: tf.distribute.Strategy | None = None,
          shard_checkpoint_dir: str | None = None):
  """A job's (ranker, its data paths, the SimplePipeline); prepares the data if needed."""
  ranker = builders.get_builder(config.builder)
  paths = ranker.prepare_data(config.data)
  return ranker, paths, make_pipeline(config, ranker, paths, strategy, shard_checkpoint_dir)


def make_pipeline(config: config_lib.JobConfig, ranker, paths,
                  strategy: tf.distribute.Strategy | None = None,
                  shard_checkpoint_dir: str | None = None) -> pipeline_lib.SimplePipeline:
  """The SimplePipeline of job `config` on `paths` (data `ranker` prepared)."""
  model_builder = ranker.build_model_builder(config.model, config.pipeline.seed)
  dataset_builder = ranker.build_dataset_builder(paths, config.dataset, config.model)
  dataset_builder.skip_lists_without_relevant = config.metrics.skip_queries_without_relevant
  return pipeline_lib.SimplePipeline(model_builder, dataset_builder, config.pipeline,
                                     strategy=strategy, shard_checkpoint_dir=shard_checkpoint_dir,
                                     run_config=config.to_dict())


# What a training run writes in its model_dir (and `--fresh` removes); metrics.jsonl: a
# continuous run's per-partition lines; validation.jsonl: a sidecar evaluator's (sidecar.py).
# selection: an early-stopped job's selection run (early_stopping_job.py).
RUN_OUTPUTS = ("checkpoints", "logs", "export", evaluation.METRICS_FILE, PROGRESSIVE_LOG,
               evaluation.VALIDATION_LOG, early_stopping_job.SELECTION_DIR)


def clear_run_outputs(model_dir: str) -> list[str]:
  """Removes a run's outputs (RUN_OUTPUTS) from model_dir; returns the paths removed.

  Anything else in model_dir is left alone.
  """
  paths = [os.path.join(model_dir, name) for name in RUN_OUTPUTS]
  return [path for path in paths if model_files.remove(path)]


def train(config: config_lib.JobConfig, verbose: int = 2,
          callbacks: Sequence[tf.keras.callbacks.Callback] = (), fresh: bool = False) -> dict:
  """Trains (or resumes), validates and exports a job; writes metrics.json in model_dir.

  A model_dir holding a checkpoint resumes from it (`pipeline.resume`, see
  docs/restarts.md) unless `fresh`. Under MultiWorkerMirroredStrategy, only
  the chief writes model_dir (`worker_config`).

  Args:
    config: The job.
    verbose: Keras fit verbosity (0, 1, 2).
    callbacks: Extra Keras callbacks for model.fit (see
      `ModelFitPipeline.train_and_validate`), e.g. a sweep trial's reporter.
    fresh: Start over: first remove the outputs of an earlier run
      (`clear_run_outputs`).

  Returns:
    {"model": metrics, "baseline": metrics, "lambdamart": metrics or None,
    "lambdamart_info": dict, "wall_s": dict} on the whole validation split,
    metrics keyed as RANKING_METRICS: LightGBM's LambdaMART
    (`lambdamart_metrics`) or None with `lambdamart_info["reason"]`; "wall_s": wall
    seconds of "model" (train_and_validate: training, validation, export),
    "baseline" (build and score) and "lambdamart" (read the training file,
    fit, score). metrics.json holds the same and "data", the data checks'
    report (mxrec_pipeline.data.checks.check_splits).

  Raises:
    ValueError: bad data (a bad record, an empty split, a corrupt ELWC file;
      see docs/data.md), or a sparse table that fails during training (e.g.
      full), with the one line naming the table.
    tf_config.TFConfigError: a bad TF_CONFIG under MultiWorkerMirroredStrategy.
    tf_config.PeerError: under it, a collective op failed because another
      task died or could not be reached within `pipeline.collective_timeout_s`
      (naming this task and the peer TF names); under ParameterServerStrategy,
      a ps or worker task unreachable at the start, or a ps lost (naming it).
  """
  cluster = _cluster(config)
  if cluster is not None and cluster.is_evaluator:
    raise ValueError("this process is the cluster's evaluator task (TF_CONFIG): it validates "
                     "checkpoints (mxrec_pipeline.sidecar.evaluate_checkpoints, which "
                     "`mxrec-pipeline train` runs in that task); it does not train")
  # Every worker saves its table shards beside the chief's checkpoints.
  shard_checkpoint_dir = os.path.join(config.pipeline.model_dir, "checkpoints")
  with worker_config(config, fresh) as config, _peer_errors(config), claim(config):
    model_dir = config.pipeline.model_dir
    if fresh:
      for path in clear_run_outputs(model_dir):
        print(f"--fresh: removed {path}", flush=True)
    tf.io.gfile.makedirs(model_dir)
    model_files.write_text_atomically(os.path.join(model_dir, RESOLVED_CONFIG),
                                      yaml.safe_dump(config.to_dict(), sort_keys=False))
    strategy = None
    if config.pipeline.strategy == pipeline_lib.PARAMETER_SERVER:
      # TF's connect to a task nobody listens on blocks without an error.
      reach.wait_for_tasks(tf_config.from_environment())
    if config.pipeline.strategy in (pipeline_lib.MULTI_WORKER_MIRRORED,
                                    pipeline_lib.PARAMETER_SERVER):
      # TF configures its collective ops (connects to the cluster) when the
      # strategy is created, before any other op of the process: data
      # preparation runs some.
      strategy = _start_strategy(config)
    ranker, paths, pipeline = setup(config, strategy, shard_checkpoint_dir)
    data_report = _check_data(paths, pipeline)
    start = time.perf_counter()
    try:
      with _watchdog(config) as watching:
        if config.pipeline.early_stopping is None:
          stopping = None
          model_metrics = pipeline.train_and_validate(verbose=verbose,
                                                      callbacks=[*watching, *callbacks])
        else:
          model_metrics, stopping = early_stopping_job.train(
              config, paths,
              lambda c, p: make_pipeline(c, ranker, p, strategy, shard_checkpoint_dir), verbose,
              [*watching, *callbacks], retrain_callbacks=watching)
    except (tf.errors.ResourceExhaustedError, tf.errors.InvalidArgumentError) as e:
      line = _table_error(e)
      if line is None:
        raise
      raise ValueError(line) from None  # The CLI's exit 2 with this one line.
    model_metrics.pop("loss")
    wall_s = {"model": time.perf_counter() - start}
    start = time.perf_counter()
    baseline = evaluation.evaluate_scores(pipeline.dataset_builder.build_raw_valid_dataset(),
                                          ranker.build_baseline(paths, config.data))
    wall_s["baseline"] = time.perf_counter() - start
    start = time.perf_counter()
    gbdt_metrics, gbdt_info = lambdamart_metrics(config, ranker, paths,
                                                 pipeline.dataset_builder.build_raw_valid_dataset())
    wall_s["lambdamart"] = time.perf_counter() - start
    if gbdt_metrics is None:
      print(f"lambdamart: not scored: {gbdt_info['reason']}", flush=True)
    extra = {"lambdamart": gbdt_metrics, "lambdamart_info": gbdt_info, "wall_s": wall_s}
    if stopping is not None:
      extra["early_stopping"] = stopping
    evaluation.write_metrics(model_dir, model_metrics, baseline, data=data_report, extra=extra)
    return {"model": model_metrics, "baseline": baseline, **extra}


def lambdamart_metrics(config: config_lib.JobConfig, ranker, paths,
                       valid_dataset: tf.data.Dataset) -> tuple[dict[str, float] | None, dict]:
  """LightGBM's LambdaMART on a job's data: (validation metrics or None, info).

  Trained on every whole list of the training file (the ranker's own
  dataset builder with the training file as its validation split, so labels
  are the model's; with `lambdamart.early_stopping_rounds` in an
  early-stopped job with held-out lists, as the model is: rounds chosen on
  them, then kept or refitted on every list), with the features of
  `lambdamart.feature_layout` (the sparse features' ids as categorical),
  then scored by
  `evaluation.evaluate_scores`. Only the chief of a multi-worker job trains
  it.

  Args:
    config: The job (its `lambdamart` section; seed None: `pipeline.seed`).
    ranker: The job's RankerBuilder.
    paths: Its `prepare_data` result.
    valid_dataset: The raw validation batches the model and baseline are
      scored on (`build_raw_valid_dataset`).

  Returns:
    See `lambdamart.evaluate`; disabled or not the chief: None and the reason.
  """
  cluster = _cluster(config)
  if cluster is not None and not cluster.is_chief:
    return None, {"reason": f"trained by the chief only, this is {cluster.task_name}"}
  if not config.lambdamart.enabled:
    return None, {"reason": lambdamart.DISABLED}
  context, example, _ = ranker.feature_specs()
  ids = [feature.name for feature in ranker.sparse_features(config.model)[0]]
  whole_lists = DatasetConfig(train_batch_size=config.dataset.train_batch_size,
                              valid_batch_size=config.dataset.valid_batch_size)

  def lists(pattern):
    # Whole lists: the longest of `pattern` (not of the validation split).
    return ranker.build_dataset_builder(
        dataclasses.replace(paths, valid=pattern, valid_list_size=None), whole_lists,
        config.model).build_raw_valid_dataset()

  seed = config.lambdamart.seed if config.lambdamart.seed is not None else config.pipeline.seed
  rule = hparams_lib.EarlyStopping.from_dict(config.pipeline.early_stopping)
  if rule is None or paths.holdout is None or config.lambdamart.early_stopping_rounds is None:
    return lambdamart.evaluate(lists(paths.train), valid_dataset, context, example, ids,
                               config.lambdamart, seed)
  # Trained as the model: rounds chosen on the held-out lists, then kept or refitted on all.
  return lambdamart.evaluate(
      lists(paths.train_without_holdout), valid_dataset, context, example, ids, config.lambdamart,
      seed, holdout_batches=lists(paths.holdout),
      refit_batches=lists(paths.train) if rule.then == hparams_lib.RETRAIN else None)


def _lockstep_workers(config: config_lib.JobConfig) -> int:
  """Workers training in lockstep (MultiWorkerMirroredStrategy over a TF_CONFIG), else 0."""
  cluster = _cluster(config)
  if cluster is None or config.pipeline.strategy != hparams_lib.MULTI_WORKER_MIRRORED:
    return 0
  return cluster.num_workers


def _cluster(config: config_lib.JobConfig) -> tf_config.TFConfig | None:
  """The TF_CONFIG of a multi-worker or parameter-server job (None: other strategies, or unset)."""
  if config.pipeline.strategy not in (hparams_lib.MULTI_WORKER_MIRRORED,
                                      hparams_lib.PARAMETER_SERVER):
    return None
  return tf_config.from_environment()


# What a collective op raises when a peer task dies, hangs or cannot be reached.
_PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                  tf.errors.AbortedError, tf.errors.CancelledError)


@contextlib.contextmanager
def _peer_errors(config: config_lib.JobConfig) -> Iterator[None]:
  """Under MultiWorkerMirroredStrategy, TF's errors of a failed peer -> tf_config.PeerError."""
  cluster = _cluster(config)
  try:
    yield
  except _PEER_FAILURES as e:
    if cluster is None:
      raise
    if config.pipeline.strategy == hparams_lib.PARAMETER_SERVER:
      lost = reach.lost_ps_error(cluster, e)
      if lost is None:
        raise
      raise lost from e
    peers = cluster.peers_named_in(e.message)
    lines = [line.strip() for line in e.message.splitlines() if line.strip()] or [type(e).__name__]
    # TF's line that says why ("Collective ops is aborted by: Connection reset by peer").
    reason = next((line for line in lines if "aborted" in line), lines[0])
    raise tf_config.PeerError(
        f"{cluster.task_name} of a {cluster.num_workers}-worker cluster stopped: "
        f"{' and '.join(peers) if peers else 'another task'} failed or could not be reached "
        f"({_timeout_text(config.pipeline.collective_timeout_s)}): {reason}") from e


@contextlib.contextmanager
def _watchdog(config: config_lib.JobConfig) -> Iterator[list[tf.keras.callbacks.Callback]]:
  """Under MultiWorkerMirroredStrategy with several workers, a running distributed/watchdog.py
  (`pipeline.stuck_worker_timeout_s`): yields its callback; [] otherwise."""
  cluster = _cluster(config)
  timeout_s = config.pipeline.stuck_worker_timeout_s
  if _lockstep_workers(config) < 2 or timeout_s is None:
    yield []
    return
  tasks = [
      f"{job} {i}" for job in (tf_config.CHIEF, tf_config.WORKER)
      for i in range(len(cluster.cluster.get(job, ())))
  ]
  dog = watchdog.Watchdog(cluster.task_name, tasks, timeout_s)
  dog.start()
  try:
    yield [watchdog.WatchdogCallback(dog)]
  finally:
    dog.stop()


@contextlib.contextmanager
def claim(config: config_lib.JobConfig) -> Iterator[None]:
  """Holds model_dir for this job (util/model_dir_lock.py); non-chief workers train in their own."""
  cluster = _cluster(config)
  if cluster is not None and not cluster.is_chief:
    yield
    return
  if not model_files.is_local(config.pipeline.model_dir):  # The claim needs O_EXCL files.
    print(
        f"{config.pipeline.model_dir} is not on a local filesystem: no claim on it; start one "
        "job per model_dir", flush=True)
    yield
    return
  with model_dir_lock.ModelDirLock(config.pipeline.model_dir):
    yield


def _timeout_text(timeout_s: float | None) -> str:
  return "no collective timeout" if timeout_s is None else f"collective timeout {timeout_s:g} s"


def _start_strategy(config: config_lib.JobConfig) -> tf.distribute.Strategy:
  """The cluster strategy of `config`, which starts this task's TensorFlow server.

  Raises:
    tf_config.TFConfigError: the server could not start at this task's
      TF_CONFIG address (e.g. another process holds the port), naming both.
  """
  try:
    return pipeline_lib.get_strategy(config.pipeline.strategy, config.pipeline.collective_timeout_s)
  except tf.errors.UnknownError as e:  # "Could not start gRPC server".
    cluster = _cluster(config)
    if cluster is None or "server" not in e.message:
      raise
    raise cluster.server_start_error(e.message) from e


@contextlib.contextmanager
def worker_config(config: config_lib.JobConfig,
                  fresh: bool = False) -> Iterator[config_lib.JobConfig]:
  """The config this process trains with: `config`, or a non-chief worker's copy.

  Under MultiWorkerMirroredStrategy with a TF_CONFIG whose task is not the
  chief (tf_config.TFConfig.is_chief), yields `config` with model_dir
  replaced by a new temporary directory, deleted on exit; there the worker
  writes what the chief writes in model_dir (checkpoints, logs, exports,
  metrics.json), and nothing of it is kept. Unless `fresh`, the chief's
  checkpoints are copied there first, so every worker resumes from the same
  checkpoint (model_dir must be on storage every worker reads, as TF's
  multi-worker checkpointing assumes). Otherwise yields `config` itself.

  Raises:
    tf_config.TFConfigError: TF_CONFIG is malformed (naming the key or task).
    ValueError: more than one worker and no `pipeline.seed`.
  """
  cluster = _cluster(config)
  if _lockstep_workers(config) > 1 and config.pipeline.seed is None:
    raise ValueError(f"pipeline.seed is required with MultiWorkerMirroredStrategy on "
                     f"{cluster.num_workers} workers: each worker keeps its part of every "
                     "global batch, so all must shuffle the data in the same (seeded) order")
  if cluster is None or cluster.is_chief:
    yield config
    return
  temp_dir = tempfile.mkdtemp(prefix=f"mxrec-{cluster.task_type}-{cluster.task_index}-")
  try:
    checkpoints = os.path.join(config.pipeline.model_dir, "checkpoints")
    if not fresh and tf.io.gfile.isdir(checkpoints):
      # Saves in progress (ckpt-N_temp*) are never current: not copied; nor
      # the table shards (shards-N), which every worker reads from model_dir,
      # nor an export's staged shards (export-staging-N, the chief's).
      model_files.copy_tree(checkpoints, os.path.join(temp_dir, "checkpoints"),
                            ignore=("*_temp*", "shards-*", "export-staging-*"))
    yield dataclasses.replace(config, pipeline=dataclasses.replace(config.pipeline,
                                                                   model_dir=temp_dir))
  finally:
    with contextlib.suppress(tf.errors.OpError):
      model_files.remove(temp_dir)


def _check_data(paths, pipeline) -> dict:
  """checks.check_splits before training: prints skipped records and warnings; the report."""
  builder = pipeline.dataset_builder
  report, warnings = checks.check_splits(paths.train, paths.valid,
                                         builder.build_raw_valid_dataset(all_lists=True),
                                         paths.bad_records, builder.skip_lists_without_relevant)
  for skipped in paths.bad_records.values():
    if skipped["skipped"]:
      print(f"data: {validation.summary(skipped)}", flush=True)
  for warning in warnings:
    print(f"warning: {warning}", file=sys.stderr, flush=True)
  return report


def _table_error(error: tf.errors.OpError) -> str | None:
  """The line naming the table of a sparse table's runtime error (e.g. a full table), or None."""
  return next((line for line in error.message.splitlines() if line.startswith("table '")), None)


def export(config: config_lib.JobConfig, export_dir: str | None = None,
           checkpoint: str | None = None) -> str:
  """Exports a checkpoint of a trained job as a serving SavedModel, in this process.

  By default the newest complete checkpoint (checkpoints.restorable_checkpoint);
  `checkpoint` picks another kept one: its number ("2", "ckpt-2") or path
  prefix.

  A sharded run's checkpoint (MultiWorkerMirroredStrategy or
  ParameterServerStrategy: its tables in `shards-<N>` beside `ckpt-<N>`)
  exports too, with no cluster: its shard files are gathered into the same
  stock-TF SavedModel the run exports (ModelFitPipeline.restore_for_export).

  Raises:
    FileNotFoundError: no complete checkpoint in model_dir/checkpoints (or
      not `checkpoint`); a table's shard file missing or unreadable (naming
      the table and the file; nothing is written then).
    ValueError: `checkpoint` is incomplete (its reason named); as
      ModelFitPipeline.restore_for_export.
  """
  checkpoint_dir = os.path.join(config.pipeline.model_dir, "checkpoints")
  prefix = _checkpoint_to_export(checkpoint_dir, checkpoint)
  _, _, pipeline = setup(config)
  if not initialize.is_initialized():
    initialize.init()
  model = pipeline.restore_for_export(prefix)
  export_dir = export_dir or os.path.join(config.pipeline.model_dir, "export", "latest_model")
  return pipeline.export_saved_model(model, export_dir)


def _checkpoint_to_export(checkpoint_dir: str, checkpoint: str | None) -> str:
  """The path prefix of the checkpoint `export` reads; see there."""
  shards = lambda number: table_checkpoints.shards_path(checkpoint_dir, number)  # noqa: E731
  if checkpoint is None:
    latest, _, skipped = checkpoints_lib.restorable_checkpoint(checkpoint_dir, shards)
    for prefix, reason in skipped:
      print(f"Skipping checkpoint {prefix}: {reason}", file=sys.stderr, flush=True)
    if latest is None:
      raise FileNotFoundError(f"no complete checkpoint in {checkpoint_dir}: train the config "
                              "first")
    return latest
  prefix = (checkpoint if os.sep in checkpoint else os.path.join(
      checkpoint_dir, f"ckpt-{checkpoint.removeprefix('ckpt-')}"))
  if not tf.io.gfile.exists(prefix + ".index"):
    kept = sorted(
        os.path.basename(p)[:-len(".index")]
        for p in tf.io.gfile.glob(os.path.join(checkpoint_dir, "ckpt-*.index")))
    raise FileNotFoundError(f"no checkpoint {prefix}; kept in {checkpoint_dir}: {kept or 'none'}")
  if tf.io.gfile.exists(manifest.path(prefix)) or not checkpoints_lib.is_legacy(prefix):
    reason = manifest.problem(
        prefix,
        table_checkpoints.shards_path(os.path.dirname(prefix),
                                      checkpoints_lib.checkpoint_number(prefix)))
    if reason is not None:
      raise ValueError(f"checkpoint {prefix} cannot be exported: {reason}")
  return prefix


def format_metrics(result: dict) -> str:
  """A table of the model's, the baseline's and LambdaMART's metrics, with wall seconds.

  LambdaMART's row says why it is absent when it is (`result["lambdamart"]`
  None); a result without "wall_s" or "lambdamart" (an older metrics.json)
  prints without them.
  """
  keys = list(pipeline_lib.RANKING_METRICS)
  wall_s = result.get("wall_s", {})
  lines = ["            " + "".join(f"{k:>10}" for k in keys) + ("    wall s" if wall_s else "")]
  for row in ("model", "baseline", "lambdamart"):
    if row not in result:
      continue
    if result[row] is None:
      lines.append(f"{row:<12}not scored: {result.get(row + '_info', {}).get('reason', '?')}")
      continue
    seconds = f"{wall_s[row]:>10.1f}" if row in wall_s else ""
    lines.append(f"{row:<12}" + "".join(f"{result[row][k]:>10.4f}" for k in keys) + seconds)
  return "\n".join(lines)


def dumps(result: dict) -> str:
  return json.dumps(result, indent=2, sort_keys=True)
