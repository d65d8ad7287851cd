"""Tiny real-format data and CLI helpers for the builder tests."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import tensorflow as tf

from mxrec_pipeline import cli
from mxrec_pipeline.evaluation import METRICS_FILE
from mxrec_pipeline.keras.pipeline import RANKING_METRICS

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / "configs"

# Overrides that make any config a few-second run (one run: no early stopping's selection and
# retrain; tests that want it set it again).
TINY_PIPELINE = [
    "pipeline.num_epochs=1", "pipeline.num_train_steps=2", "pipeline.export_best_model=false",
    "pipeline.early_stopping=null"
]

# The tiny LETOR files' widths: MSLR-WEB's 136 features would make every test's parsing graph 136
# features wide (a test job ~2.5x slower) without testing more. Feature LETOR_BASELINE (MSLR's
# BM25 is 110) equals the label: jobs on these files set LETOR_BASELINE_SET.
LETOR_WIDTH = 6
LETOR_BASELINE = 5
LETOR_BASELINE_SET = f"data.baseline_feature={LETOR_BASELINE}"


def write_letor(path: pathlib.Path, num_queries: int, docs_per_query: int, first_qid: int,
                seed: int) -> pathlib.Path:
  """A LETOR file (CRLF lines): labels 0-4, feature LETOR_BASELINE == label, 1-3 random.

  Every query has a document of label 4, so ranking by feature LETOR_BASELINE
  is perfect: the baseline scores NDCG@k == MRR == 1. Feature LETOR_WIDTH holds
  a random value, so the file's width is LETOR_WIDTH.
  """
  rng = np.random.default_rng(seed)
  lines = []
  for q in range(first_qid, first_qid + num_queries):
    labels = np.concatenate([[4], rng.integers(0, 5, docs_per_query - 1)])
    for label in rng.permutation(labels):
      noise = " ".join(f"{i}:{rng.uniform(0, 50):.3f}" for i in (1, 2, 3))
      lines.append(f"{label} qid:{q} {noise} {LETOR_BASELINE}:{label}.0 "
                   f"{LETOR_WIDTH}:{rng.uniform(-1, 1):.3f}\r\n")
  path.write_text("".join(lines))
  return path


def write_movielens(data_dir: pathlib.Path, num_users: int = 6, ratings_per_user: int = 8,
                    num_items: int = 12, seed: int = 0) -> pathlib.Path:
  """RecBole atomic files of a tiny MovieLens (the format of ml-100k)."""
  rng = np.random.default_rng(seed)
  data_dir.mkdir(parents=True)
  inter = ["user_id:token\titem_id:token\trating:float\ttimestamp:float\n"]
  for user in range(1, num_users + 1):
    items = rng.choice(np.arange(1, num_items + 1), ratings_per_user, replace=False)
    for t, item in enumerate(items):
      inter.append(f"{user}\t{item}\t{rng.integers(1, 6)}\t{1000 * user + 10 * t}\n")
  (data_dir / "ml-100k.inter").write_text("".join(inter))
  genders, jobs = "MF", ("student", "writer", "other")
  (data_dir / "ml-100k.user"
  ).write_text("user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n" +
               "".join(f"{u}\t{20 + u}\t{genders[u % 2]}\t{jobs[u % 3]}\t{10000 + u}\n"
                       for u in range(1, num_users + 1)))
  genres = ("Drama", "Comedy", "Action Thriller")
  (data_dir / "ml-100k.item"
  ).write_text("item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n" +
               "".join(f"{i}\tMovie number {i}\t{1980 + i}\t{genres[i % 3]}\n"
                       for i in range(1, num_items + 1)))
  return data_dir


def train_cli(capsys, config: str, overrides: list[str], keep_output: bool = False) -> dict:
  """Runs `mxrec-pipeline train` and returns its metrics.json; fails on exit != 0.

  With `keep_output`, the metrics also hold the run's standard output ("stdout").
  """
  args = ["train", config, "--verbose", "0"]
  for override in TINY_PIPELINE + overrides:
    args += ["--set", override]
  code = cli.main(args)
  captured = capsys.readouterr()
  assert code == 0, captured.err[-3000:]
  model_dir = next(o.split("=", 1)[1] for o in overrides if o.startswith("pipeline.model_dir="))
  with open(pathlib.Path(model_dir) / METRICS_FILE, encoding="utf-8") as f:
    metrics = json.load(f)
  return {**metrics, "stdout": captured.out} if keep_output else metrics


def cli_error(capsys, args: list[str]) -> str:
  """Runs the CLI, expects exit status 2, returns stderr."""
  code = cli.main(args)
  err = capsys.readouterr().err
  assert code == 2, err
  return err


def assert_metrics_file(metrics: dict) -> None:
  """`{"model", "baseline", "lambdamart", "data", ...}`, every RANKING_METRICS key in [0, 1].

  LambdaMART's metrics are checked when LightGBM scored it (else its reason is given).
  """
  assert sorted(set(metrics) - {"early_stopping"}) == [
      "baseline", "data", "lambdamart", "lambdamart_info", "model", "wall_s"
  ]
  if "early_stopping" in metrics:  # A job with pipeline.early_stopping (the LETOR configs).
    assert 1 <= metrics["early_stopping"]["best_epoch"] <= metrics["early_stopping"]["epochs_run"]
  assert sorted(metrics["wall_s"]) == ["baseline", "lambdamart", "model"]
  if metrics["lambdamart"] is None:
    assert metrics["lambdamart_info"]["reason"]
  for split in ("train", "valid"):
    assert metrics["data"][split]["lists"] > 0 and metrics["data"][split]["files"] == 1
  assert 0 < metrics["data"]["valid"]["lists_with_relevant"] <= metrics["data"]["valid"]["lists"]
  for row in (metrics["model"], metrics["baseline"], metrics["lambdamart"] or metrics["model"]):
    assert sorted(row) == sorted(RANKING_METRICS)
    assert all(0.0 <= v <= 1.0 for v in row.values()), row


def serialized_lists(path: str) -> tf.Tensor:
  """[num_lists] string: the serialized ELWC records of a TFRecord file."""
  return tf.constant(list(tf.data.TFRecordDataset(path).as_numpy_iterator()))


def write_wide_letor(path: pathlib.Path, num_features: int, lists: list[int], baseline: int,
                     seed: int, first_qid: int = 1) -> pathlib.Path:
  """A LETOR file of `num_features` features; `lists`: documents per query.

  Feature `baseline` equals the label (0-4; every query has a 4, so ranking by
  it is perfect); features 1-3 random; `num_features` holds a random value, so
  the file's width is `num_features`; every other feature is missing (0).
  """
  rng = np.random.default_rng(seed)
  out = []
  for q, size in enumerate(lists, start=first_qid):
    labels = rng.permutation(np.concatenate([[4], rng.integers(0, 5, size - 1)]))
    for label in labels:
      noise = " ".join(f"{i}:{rng.uniform(0, 50):.3f}" for i in (1, 2, 3) if i != baseline)
      out.append(f"{label} qid:{q} {noise} {baseline}:{label}.0 "
                 f"{num_features}:{rng.uniform(-1, 1):.3f}\n")
  path.write_text("".join(out))
  return path
