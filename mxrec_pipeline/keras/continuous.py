"""Continuous training: each data partition once, in order, as it arrives (docs/continuous.md).

`ContinuousTrainer(pipeline, config, partition_data).run()` sets the run up
as `train_and_validate` does (`ModelFitPipeline.prepare_run`), resumes its
newest checkpoint and its partition cursor, then for each partition that
data/partitions.next_partition gives: scores it before training on it
(progressive validation: the model's and the baseline's RANKING_METRICS, to
TensorBoard and one line of `model_dir/metrics.jsonl`), trains one pass over
it, saves `ckpt-<N>` with the cursor in its manifest (so the cursor and the
model move together), and exports `export/<N>/` when `export_every_s` allows
(TF Serving's numbered versions, each renamed in complete, the newest
`exports_to_keep` kept). It waits `poll_s` between looks for new partitions
and stops on SIGTERM/SIGINT once the current partition is checkpointed, or
after `max_partitions`. Tables live on one host (one or more replicas).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Callable, Iterator, Sequence

import tensorflow as tf

from mxrec_pipeline.data import partitions as partitions_lib
from mxrec_pipeline.hparams import CheckpointSchedule, ContinuousConfig
from mxrec_pipeline.keras import callbacks as callbacks_lib
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.keras import restoring
from mxrec_pipeline.keras.strategies import TablePlacement
from mxrec_pipeline.util import export_versions
from mxrec_pipeline.util import model_files

PROGRESSIVE_LOG = "metrics.jsonl"
EXPORT_DIR = "export"

# (dataset builder of a partition, the partitions trained so far) -> baseline metrics or None.
BaselineScorer = Callable[[object, Sequence[partitions_lib.Partition]], dict | None]


class StopRequest:
  """SIGTERM/SIGINT handling of a continuous run (`installed()`).

  The first signal asks the run to stop once the current partition is
  checkpointed (`requested`); a second one stops it at once
  (KeyboardInterrupt), keeping nothing of the partition being trained.
  """

  def __init__(self):
    self.requested = False

  def _handle(self, signum, frame):
    del frame
    if self.requested:
      raise KeyboardInterrupt(f"signal {signum} received twice")
    self.requested = True
    print(f"signal {signum}: stopping after the current partition's checkpoint", flush=True)

  @contextlib.contextmanager
  def installed(self) -> Iterator["StopRequest"]:
    """Handles SIGTERM and SIGINT while inside (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
      yield self
      return
    before = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
      yield self
    finally:
      for s, handler in before.items():
        signal.signal(s, handler)

  def sleep(self, seconds: float) -> None:
    """Sleeps up to `seconds`, waking early once a stop is requested."""
    end = time.monotonic() + seconds
    while not self.requested and time.monotonic() < end:
      time.sleep(min(0.2, end - time.monotonic()))


class ContinuousTrainer:
  """Trains a pipeline's model on data partitions as they arrive; see the module docstring.

  Args:
    pipeline: A ModelFitPipeline (its hparams give model_dir, seed, resume).
    config: The ContinuousConfig (partitions_dir required).
    partition_data: Partition -> the dataset builder of its ELWC files
      (training and validation both read them), with the pipeline's
      sparse features.
    score_baseline: Scores a partition's validation lists with the job's
      baseline built from the partitions trained so far (None: no baseline).
    callbacks: Extra Keras callbacks of every partition's model.fit (e.g.
      an EvictCallback).
    verbose: Keras fit verbosity.
    log: Where progress lines go.

  Raises (from `run`):
    ValueError: a placement other than one host; a partition without ELWC
      files or whose files hold no list (named).
    FileNotFoundError: partitions_dir unset or missing.
    FileExistsError / checkpoints.CheckpointError: as train_and_validate's
      resume.
  """

  def __init__(self, pipeline, config: ContinuousConfig,
               partition_data: Callable[[partitions_lib.Partition],
                                        object], score_baseline: BaselineScorer | None = None,
               callbacks: Sequence[tf.keras.callbacks.Callback] = (), verbose: int = 0,
               log: Callable[[str], None] = print):
    self._pipeline = pipeline
    self._config = config
    self._partition_data = partition_data
    self._score_baseline = score_baseline
    self._callbacks = list(callbacks)
    self._verbose = verbose
    self._log = log
    self._model_dir = pipeline.hparams.model_dir
    self._export_root = os.path.join(self._model_dir, EXPORT_DIR)
    self._last_export_s = None
    self.stop = StopRequest()

  def run(self) -> dict:
    """Trains until stopped; returns {"trained": names this run, "exported": versions, "reason"}."""
    root = self._config.partitions_dir
    if not root:
      raise FileNotFoundError("continuous.partitions_dir is not set: the directory whose "
                              "subdirectories are the data partitions")
    partitions_lib.arrived(root)  # Raises when it does not exist.
    pipeline = self._pipeline
    schedule = CheckpointSchedule.from_dict(pipeline.hparams.checkpoint)
    skips = [n for n in ("delta_every_steps", "delta_every_s") if getattr(schedule, n) is not None]
    if skips:
      raise ValueError(f"`pipeline.checkpoint.{skips[0]}`: a continuous run saves a checkpoint "
                       "after every partition (with its cursor); schedule its full saves with "
                       "full_every_steps, full_every_s or full_every_epochs instead")
    if pipeline.hparams.early_stopping is not None:
      raise ValueError("`pipeline.early_stopping`: a continuous run trains every partition as it "
                       "arrives and never stops on a validation metric; set it to null")
    model = pipeline.prepare_run()
    if pipeline.placement is not TablePlacement.ONE_HOST:
      raise ValueError(f"continuous training places the tables on one host (one or more "
                       f"replicas); {pipeline.hparams.strategy} places them on "
                       f"{pipeline.placement.value}")
    number = restoring.resume(pipeline.checkpoint, pipeline.hparams, model, num_epochs=None)
    state = pipeline.checkpoint.restored_state or {}
    cursor = partitions_lib.Cursor.from_dict(state.get("cursor"))
    self._repair_log(state.get("line"))
    if number and max(export_versions.versions(self._export_root), default=0) < number:
      self._export(model, number, cursor)  # The newest checkpoint was not exported (killed).
    trained, exported, reason = [], [], None
    writer = tf.summary.create_file_writer(os.path.join(self._model_dir, "logs", "progressive"))
    with self.stop.installed():
      while reason is None:
        if self.stop.requested:
          reason = "stop requested"
          break
        if self._config.max_partitions is not None and len(trained) >= self._config.max_partitions:
          reason = f"max_partitions ({self._config.max_partitions}) trained"
          break
        found = partitions_lib.arrived(root)
        partition, late = partitions_lib.next_partition(found, cursor, self._config.late_partitions)
        for skipped in late:
          cursor.skipped.append(skipped.name)
          self._log(f"partition {skipped.name} arrived late (older than {cursor.newest}): "
                    "skipped (continuous.late_partitions: skip)")
        if partition is None:
          if not self._config.poll_s:
            reason = "every arrived partition is trained (poll_s 0)"
            break
          self.stop.sleep(self._config.poll_s)
          continue
        number += 1
        line = self._train_partition(model, partition, cursor, number, writer, found)
        trained.append(partition.name)
        if line.get("export_version") is not None:
          exported.append(line["export_version"])
    if trained and max(export_versions.versions(self._export_root), default=0) < number:
      exported.append(self._export(model, number, cursor))
    self._log(f"continuous training stopped: {reason}; {len(trained)} partition(s) trained in "
              f"this run, {len(cursor.trained)} in all")
    return {"trained": trained, "exported": exported, "reason": reason}

  def _train_partition(self, model, partition: partitions_lib.Partition,
                       cursor: partitions_lib.Cursor, number: int, writer,
                       found: Sequence[partitions_lib.Partition]) -> dict:
    """Scores, trains, checkpoints (and maybe exports) one partition; returns its log line.

    `found`: the arrived partitions, as the loop listed them (the baseline's are among them).
    """
    if not tf.io.gfile.glob(partition.data_pattern):
      raise ValueError(f"partition {partition.path} has a {partitions_lib.SUCCESS_MARKER} "
                       f"marker but no ELWC files ({partitions_lib.DATA_GLOB})")
    pipeline = self._pipeline
    try:
      data = self._partition_data(partition)
      steps = data.count_batches(True)
    except (ValueError, tf.errors.OpError) as e:  # No list; a corrupt or truncated file.
      reason = e.message if isinstance(e, tf.errors.OpError) else str(e)
      raise ValueError(f"partition {partition.path}: {reason.splitlines()[0]}") from None
    line = {"partition": partition.name, "checkpoint": number, "steps": steps}
    start = time.perf_counter()
    line["lists"] = sum(int(tf.shape(labels)[0]) for _, labels in data.build_raw_valid_dataset())
    line["model"] = self._evaluate(model, data) if line["lists"] else None
    line["baseline"] = None
    if self._score_baseline is not None and line["lists"]:
      done = set(cursor.trained)
      previous = [p for p in found if p.name in done]
      line["baseline"] = self._score_baseline(data, previous)
    line["eval_s"] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    model.fit(pipeline.distribute(data.build_train_epoch(number - 1, steps, pipeline.hparams.seed)),
              initial_epoch=number - 1, epochs=number, steps_per_epoch=steps,
              callbacks=[callbacks_lib.FaultCallback(pipeline.faults),
                         *self._callbacks], verbose=self._verbose)
    line["train_s"] = round(time.perf_counter() - start, 3)
    cursor.trained.append(partition.name)
    start = time.perf_counter()
    pipeline.checkpoint.save(number, state={"cursor": cursor.to_dict(), "line": line})
    line["checkpoint_s"] = round(time.perf_counter() - start, 3)
    if self._export_due():
      start = time.perf_counter()
      line["export_version"] = self._export(model, number, cursor)
      line["export_s"] = round(time.perf_counter() - start, 3)
      line["export_lag_s"] = round(time.time() - partition.arrived_s, 3)
    self._append_line(line)
    self._summaries(writer, line, number)
    self._log(_describe(line))
    return line

  def _evaluate(self, model, data) -> dict:
    """The model's RANKING_METRICS (and loss) on a partition's validation lists."""
    pipeline = self._pipeline
    steps = data.count_batches(False) if pipeline.splits_batches() else None
    results = model.evaluate(pipeline.distribute(data.build_valid_dataset(num_epochs=1)),
                             steps=steps, return_dict=True, verbose=0)
    return pipeline_lib.ranking_results(results)

  def _export_due(self) -> bool:
    every = self._config.export_every_s
    return self._last_export_s is None or time.monotonic() - self._last_export_s >= every

  def _export(self, model, number: int, cursor: partitions_lib.Cursor) -> int:
    """Exports version `number` (renamed in complete), prunes old versions; returns `number`."""
    self._pipeline.export_saved_model(model, os.path.join(self._export_root, str(number)))
    self._last_export_s = time.monotonic()
    removed = export_versions.prune(self._export_root, self._config.exports_to_keep)
    self._log(f"export version {number}: has seen {len(cursor.trained)} partition(s), the newest "
              f"{cursor.newest}" + (f"; removed versions {removed}" if removed else ""))
    return number

  def _append_line(self, line: dict) -> None:
    model_files.append_json_line(os.path.join(self._model_dir, PROGRESSIVE_LOG), line)

  def _repair_log(self, line: dict | None) -> None:
    """Appends the restored checkpoint's line when a kill lost it (after the save, before it)."""
    if line is None:
      return
    rows = model_files.read_json_lines(os.path.join(self._model_dir, PROGRESSIVE_LOG))
    if line["checkpoint"] not in {row.get("checkpoint") for row in rows}:
      self._append_line(line)

  @staticmethod
  def _summaries(writer, line: dict, step: int) -> None:
    with writer.as_default():
      for who in ("model", "baseline"):
        for key, value in (line.get(who) or {}).items():
          tf.summary.scalar(f"progressive/{who}/{key}", value, step=step)
      tf.summary.scalar("progressive/train_s", line["train_s"], step=step)
    writer.flush()


def _describe(line: dict) -> str:
  """One log line of a trained partition."""
  model, baseline = line.get("model") or {}, line.get("baseline") or {}
  before = (f"NDCG@10 before training {model['ndcg@10']:.4f} on {line['lists']} list(s)"
            if model else "no list to score (metrics.skip_queries_without_relevant)")
  if baseline:
    before += f" (baseline {baseline['ndcg@10']:.4f})"
  text = (f"partition {line['partition']}: {line['steps']} step(s) in {line['train_s']:.1f} s; "
          f"{before}; checkpoint ckpt-{line['checkpoint']}")
  if "export_version" in line:
    text += f"; export version {line['export_version']} ({line['export_lag_s']:.1f} s after " \
            "its marker)"
  return text
