"""Ranking metrics of any scorer over a dataset, and `metrics.json`.

The pipeline's model and a task's simple baseline are scored by the same
function, with tfr's metrics, on the same validation batches, so their figures
compare like for like.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.keras.pipeline import RANKING_METRICS, build_ranking_metrics, metric_name
from mxrec_pipeline.util import model_files

METRICS_FILE = "metrics.json"
# A sidecar evaluator's line per checkpoint (mxrec_pipeline/sidecar.py).
VALIDATION_LOG = "validation.jsonl"


def evaluate_scores(dataset: tf.data.Dataset, score_fn: Callable[[dict],
                                                                 tf.Tensor]) -> dict[str, float]:
  """RANKING_METRICS of `score_fn` over a finite dataset of (features, labels).

  Args:
    dataset: Finite; elements (features dict, labels [batch_size, list_size]
      float32 with padding labels < 0, as tfr's dataset builders give).
    score_fn: features -> [batch_size, list_size] float32 scores.

  Returns:
    {"ndcg@1": .., "ndcg@5": .., "ndcg@10": .., "mrr": ..}, tfr's metrics.
  """
  metrics = build_ranking_metrics()
  for features, labels in dataset:
    scores = score_fn(features)
    for metric in metrics:
      metric.update_state(labels, scores)
  by_name = {m.name: float(m.result()) for m in metrics}
  return {key: by_name[metric_name(key)] for key in RANKING_METRICS}


def write_metrics(model_dir: str, model: dict[str, float], baseline: dict[str, float],
                  data: dict | None = None, extra: dict | None = None) -> str:
  """Writes `{"model": .., "baseline": ..[, "data": data], **extra}` to model_dir/metrics.json.

  Atomically (a temporary file renamed into place). `data` is the report of
  the data checks (mxrec_pipeline.data.checks.check_splits); `extra` holds
  further top-level entries (the job's "lambdamart", "lambdamart_info" and
  "wall_s").
  """
  contents = {
      "model": model, "baseline": baseline, **({"data": data} if data else {}), **(extra or {})
  }
  return model_files.write_text_atomically(os.path.join(model_dir, METRICS_FILE),
                                           json.dumps(contents, indent=2, sort_keys=True))
