"""The sidecar evaluator of a ParameterServerStrategy job: `train` run as the "evaluator" task.

The role of tf.keras.utils.SidecarEvaluator for this pipeline: a task beside
the chief, workers and ps tasks (TF_CONFIG task type "evaluator"; `train
--local-cluster workers=N,ps=M,evaluator=1` starts one) watches the chief's
`model_dir/checkpoints`, restores the newest complete checkpoint in this
process (ModelFitPipeline.restore_for_export: a sharded run's tables from its
shard files), scores the validation data with what the export serves
(`serving_scorer`) and writes per checkpoint a line of
`model_dir/validation.jsonl`, the `logs/validation` summaries Keras'
validation writes (`epoch_ndcg_10`, ...) and, with `export_best_model`, the
best checkpoint's export `export/best_model_by_metric`. The chief
(`pipeline.sidecar_evaluator: true`) validates no epoch, so no worker waits
for validation. The evaluator ends after the checkpoint of the last epoch;
restarted, it goes on after the last checkpoint validation.jsonl records.
A checkpoint the chief removes (max_to_keep) while it is read is skipped.
See docs/distributed.md "Sidecar evaluator".
"""

from __future__ import annotations

import os
import time
from typing import Callable

import tensorflow as tf

from mxrec_pipeline import config as config_lib
from mxrec_pipeline import evaluation
from mxrec_pipeline import jobs
from mxrec_pipeline.keras import checkpoints as checkpoints_lib
from mxrec_pipeline.keras import datasets
from mxrec_pipeline.keras import epochs as epochs_lib
from mxrec_pipeline.keras import manifest
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.util import initialize
from mxrec_pipeline.util import model_files

VALIDATION_LOG = evaluation.VALIDATION_LOG
BEST_EXPORT = os.path.join("export", "best_model_by_metric")
POLL_S = 1.0


def evaluate_checkpoints(config: config_lib.JobConfig, fresh: bool = False, poll_s: float = POLL_S,
                         log: Callable[[str], None] = print) -> list[dict]:
  """Validates each new checkpoint of the job until the last epoch's; returns their records.

  Checkpoints are `ckpt-<epochs done>`; the newest complete one is taken each
  time (one written while an older one was validated is skipped, as
  SidecarEvaluator does). The validation data is the job's
  (`num_valid_steps` batches of it, or all), scored as
  ModelFitPipeline's coordinator validation scores it: the final record
  equals the chief's final metrics.

  Args:
    config: The job (the chief's; its model_dir on storage both read).
    fresh: The chief runs with `--fresh`: checkpoints older than this call
      are an earlier run's (the chief removes them) and are not validated,
      nor is validation.jsonl read.
    poll_s: Seconds between two looks at the checkpoint directory.
    log: Where a line per checkpoint goes.

  Returns:
    The records written by this call: {"checkpoint": N, "metrics":
    RANKING_METRICS key -> value, "best": whether it is the best so far by
    `best_exporter_metric`, "wall_s": seconds to restore and score}.

  Raises:
    FileNotFoundError, ValueError: as ModelFitPipeline.restore_for_export
      (for a checkpoint that is still there).
  """
  hparams = config.pipeline
  model_dir = hparams.model_dir
  checkpoint_dir = os.path.join(model_dir, "checkpoints")
  last = len(epochs_lib.epoch_steps(hparams.num_epochs, hparams.num_train_steps))
  started = time.time()
  earlier = [] if fresh else read_log(model_dir)
  done = max((r["checkpoint"] for r in earlier), default=0)
  best = _best_value(earlier, hparams)
  pipeline = None
  records = []
  while done < last:
    prefix, _, _ = checkpoints_lib.restorable_checkpoint(checkpoint_dir)
    number = checkpoints_lib.checkpoint_number(prefix) if prefix else 0
    if number <= done or (fresh and _written_before(prefix, started)):
      time.sleep(poll_s)
      continue
    if pipeline is None:  # After the chief's first checkpoint: its data is prepared.
      pipeline = jobs.setup(config)[2]
    try:
      record = _evaluate(pipeline, prefix)
    except (tf.errors.NotFoundError, FileNotFoundError) as e:
      if tf.io.gfile.exists(prefix + ".index"):
        raise
      log(f"sidecar evaluator: {os.path.basename(prefix)} was removed while read, skipped "
          f"({type(e).__name__})")
      continue
    record["best"] = hparams.export_best_model and _improves(record["metrics"], best, hparams)
    if record["best"]:
      best = record["metrics"][hparams.best_exporter_metric]
      pipeline.export_saved_model(pipeline.model, os.path.join(model_dir, BEST_EXPORT))
    _write(model_dir, record)
    records.append(record)
    done = number
    log(f"sidecar evaluator: {os.path.basename(prefix)} " +
        " ".join(f"{k} {v:.4f}" for k, v in record["metrics"].items()) +
        (" (best, exported)" if record["best"] else ""))
  return records


def read_log(model_dir: str) -> list[dict]:
  """The records of `model_dir/validation.jsonl`, oldest first ([] when there is none)."""
  return model_files.read_json_lines(os.path.join(model_dir, VALIDATION_LOG))


def _evaluate(pipeline: pipeline_lib.ModelFitPipeline, prefix: str) -> dict:
  """Restores `prefix` into a new model of `pipeline` and scores the validation data."""
  start = time.perf_counter()
  if initialize.is_initialized():
    initialize.terminate_config_initializer()
  tf.keras.backend.clear_session()
  initialize.init()
  model = pipeline.restore_for_export(prefix)
  pipeline.model = model
  dataset = datasets.validation_batches(pipeline.dataset_builder, pipeline.hparams.num_valid_steps,
                                        raw=True)
  with pipeline.serving_scorer(model) as score:
    metrics = evaluation.evaluate_scores(dataset, score)
  return {
      "checkpoint": checkpoints_lib.checkpoint_number(prefix), "metrics": metrics,
      "wall_s": round(time.perf_counter() - start, 3)
  }


def _write(model_dir: str, record: dict) -> None:
  """Appends `record` to validation.jsonl and its metrics to the `logs/validation` summaries."""
  model_files.append_json_line(os.path.join(model_dir, VALIDATION_LOG), record)
  writer = tf.summary.create_file_writer(os.path.join(model_dir, "logs", "validation"))
  with writer.as_default():
    for key, value in record["metrics"].items():  # Keras' names: epoch_ndcg_10 at step epoch.
      tf.summary.scalar("epoch_" + pipeline_lib.metric_name(key), value,
                        step=record["checkpoint"] - 1)
  writer.close()


def _best_value(records: list[dict], hparams) -> float | None:
  """The best `best_exporter_metric` among records marked best (a restarted evaluator's)."""
  values = [r["metrics"][hparams.best_exporter_metric] for r in records if r.get("best")]
  return values[-1] if values else None


def _improves(metrics: dict, best: float | None, hparams) -> bool:
  value = metrics[hparams.best_exporter_metric]
  if best is None:
    return True
  return value > best if hparams.best_exporter_metric_higher_better else value < best


def _written_before(prefix: str, when: float) -> bool:
  """Whether checkpoint `prefix`'s manifest was written before `when` (seconds since the epoch)."""
  stat = tf.io.gfile.stat(manifest.path(prefix))
  return stat.mtime_nsec / 1e9 < when
