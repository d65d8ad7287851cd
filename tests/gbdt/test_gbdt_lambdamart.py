"""The LambdaMART baseline (mxrec_pipeline/gbdt) against LightGBM and tfr used directly."""

import json
import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_ranking as tfr

import builders
from builders import movielens
from mxrec_pipeline import cli
from mxrec_pipeline import config as config_lib
from mxrec_pipeline import jobs
from mxrec_pipeline.data import letor
from mxrec_pipeline.evaluation import METRICS_FILE
from mxrec_pipeline.gbdt import lambdamart
from mxrec_pipeline.gbdt.config import LambdaMartConfig

CONFIG = str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "mslr_dnn.yaml")
NUM_TREES = 20
SEED = 3

# The largest feature id _write_letor writes: the data's width (narrow: MSLR's 136 features would
# only slow the job's parsing down).
_WIDTH = 6


def _write_letor(path: pathlib.Path, num_queries: int, first_qid: int, seed: int) -> pathlib.Path:
  """LETOR lines: 5-9 documents per query, labels 0-4, features 1-4 and _WIDTH continuous.

  Feature 1 is the label plus noise (so trees learn something), the others noise.
  """
  rng = np.random.default_rng(seed)
  lines = []
  for q in range(first_qid, first_qid + num_queries):
    for label in rng.integers(0, 5, rng.integers(5, 10)):
      noise = " ".join(f"{i}:{rng.uniform(0, 10):.4f}" for i in (2, 3, 4, _WIDTH))
      lines.append(f"{label} qid:{q} 1:{label + rng.normal(0, 1.5):.4f} {noise}\n")
  path.write_text("".join(lines))
  return path


@pytest.fixture(name="letor_job")
def _letor_job(tmp_path):
  train = _write_letor(tmp_path / "train.txt", 30, first_qid=1, seed=1)
  valid = _write_letor(tmp_path / "vali.txt", 12, first_qid=100, seed=2)
  return config_lib.from_dict({
      "builder": "mslr_dnn",
      "data": {
          "train_path": str(train), "valid_path": str(valid), "elwc_dir": str(tmp_path / "elwc"),
          "baseline_feature": 1
      },
      "pipeline": {"model_dir": str(tmp_path / "run"), "seed": SEED},
      "lambdamart": {"n_estimators": NUM_TREES, "min_child_samples": 2},
  })


@pytest.fixture(name="no_lightgbm")
def _no_lightgbm(monkeypatch):
  """`import lightgbm` fails, as where it is not installed (None in sys.modules)."""
  monkeypatch.setitem(sys.modules, "lightgbm", None)


def _job_lambdamart(config):
  ranker = builders.get_builder(config.builder)
  paths = ranker.prepare_data(config.data)
  valid = ranker.build_dataset_builder(paths, config.dataset,
                                       config.model).build_raw_valid_dataset()
  return jobs.lambdamart_metrics(config, ranker, paths, valid)


def _reference_metrics(config) -> dict[str, float]:
  """LightGBM's lambdarank fitted on the LETOR text, tfr's metrics on its padded scores."""
  import lightgbm  # pylint: disable=import-outside-toplevel
  train = list(letor.iter_letor(config.data.train_path, _WIDTH))
  valid = list(letor.iter_letor(config.data.valid_path, _WIDTH))
  params = dict(objective="lambdarank", learning_rate=0.1, num_leaves=31, min_child_samples=2,
                num_threads=1, deterministic=True, force_row_wise=True, seed=SEED, verbose=-1)
  data = lightgbm.Dataset(np.concatenate([q.features for q in train]),
                          np.concatenate([q.labels for q in train]),
                          group=[len(q.labels) for q in train], params={"verbose": -1})
  booster = lightgbm.train(params, data, num_boost_round=NUM_TREES)
  list_size = max(len(q.labels) for q in valid)
  labels = np.full((len(valid), list_size), -1.0, np.float32)
  scores = np.zeros((len(valid), list_size), np.float32)
  for i, query in enumerate(valid):
    predicted = booster.predict(query.features)
    # tfr breaks ties of scores at random: the comparison needs none.
    assert len(np.unique(predicted)) == len(predicted)
    labels[i, :len(predicted)], scores[i, :len(predicted)] = query.labels, predicted
  metrics = {f"ndcg@{k}": tfr.keras.metrics.NDCGMetric(topn=k) for k in (1, 5, 10)}
  metrics["mrr"] = tfr.keras.metrics.MRRMetric()
  return {name: float(metric(labels, scores)) for name, metric in metrics.items()}


def test_letor_metrics_are_lightgbms_scored_by_tfr(letor_job):
  metrics, info = _job_lambdamart(letor_job)

  assert metrics == pytest.approx(_reference_metrics(letor_job), abs=1e-6)
  assert info["train_lists"] == 30 and info["columns"] == _WIDTH
  assert info["train_documents"] == len(
      pathlib.Path(letor_job.data.train_path).read_text().splitlines())
  assert info["params"]["seed"] == SEED and info["params"]["n_estimators"] == NUM_TREES


def test_disabled_or_without_lightgbm_says_why(letor_job, no_lightgbm):
  assert _job_lambdamart(letor_job) == (None, {"reason": lambdamart.LIGHTGBM_MISSING})
  letor_job.lambdamart.enabled = False
  assert _job_lambdamart(letor_job) == (None, {"reason": lambdamart.DISABLED})


@pytest.mark.slow
def test_job_without_lightgbm_writes_metrics_with_the_reason(letor_job, no_lightgbm, capsys):
  args = ["train", CONFIG, "--verbose", "0"]
  for override in ("model.hidden_layer_dims=[8]", "pipeline.num_epochs=1",
                   "pipeline.num_train_steps=2", f"data.train_path={letor_job.data.train_path}",
                   f"data.valid_path={letor_job.data.valid_path}",
                   f"pipeline.model_dir={letor_job.pipeline.model_dir}", "data.baseline_feature=1"):
    args += ["--set", override]
  assert cli.main(args) == 0, capsys.readouterr().err[-3000:]

  out = capsys.readouterr().out
  written = (pathlib.Path(letor_job.pipeline.model_dir) / METRICS_FILE).read_text()
  result = json.loads(written)
  assert result["lambdamart"] is None
  assert result["lambdamart_info"] == {"reason": lambdamart.LIGHTGBM_MISSING}
  assert set(result["wall_s"]) == {"model", "baseline", "lambdamart"}
  assert f"lambdamart  not scored: {lambdamart.LIGHTGBM_MISSING}" in out


def test_movielens_layout_ids_are_categorical_multi_valued_skipped():
  layout = lambdamart.feature_layout(movielens.CONTEXT_SPEC, movielens.EXAMPLE_SPEC,
                                     ["user_id", "item_id", "gender", "occupation", "zip"])
  assert [(c.name, c.kind, c.is_context) for c in layout.columns
         ] == [("user_id", "categorical", True), ("age", "numeric", True),
               ("gender", "categorical", True), ("occupation", "categorical", True),
               ("zip", "categorical", True), ("item_id", "categorical", False),
               ("year", "numeric", False), ("item_mean_rating", "numeric", False),
               ("item_rating_count", "numeric", False),
               ("neighbor_rating_deviation", "numeric", False), ("mf_rating", "numeric", False),
               ("item_knn_deviation", "numeric", False)]
  assert layout.skipped == ("history_item_ids", "history_genres", "genres", "title_tokens")
  assert layout.categorical_indices == [0, 2, 3, 4, 5]


def test_encoder_broadcasts_context_and_codes_ids_in_first_seen_order():
  layout = lambdamart.feature_layout(
      {"user": tf.io.FixedLenFeature([1], tf.string)},
      {"item": tf.io.FixedLenFeature([1], tf.int64), "x": tf.io.FixedLenFeature([2], tf.float32)},
      ["item"])
  encoder = lambdamart.Encoder(layout)
  batch = {
      "user": tf.constant([[b"b"], [b"a"]]), "item": tf.constant([[[7], [5]], [[7], [9]]],
                                                                 tf.int64),
      "x": tf.constant([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], tf.float32)
  }
  got = encoder.encode(batch, list_size=2, add_codes=True)
  # Codes by sorted value within the first batch: user a=0, b=1; item 5=0, 7=1, 9=2.
  np.testing.assert_array_equal(got, [[[1, 1, 1, 2], [1, 0, 3, 4]], [[0, 1, 5, 6], [0, 2, 7, 8]]])
  unseen = {
      "user": tf.constant([[b"c"]]), "item": tf.constant([[[9]]], tf.int64),
      "x": tf.constant([[[0, 0]]], tf.float32)
  }
  np.testing.assert_array_equal(encoder.encode(unseen, 1, add_codes=False), [[[np.nan, 2, 0, 0]]])
  assert layout.column_names == ["user", "item", "x[0]", "x[1]"]


def test_collect_groups_documents_and_refuses_labels_lightgbm_cannot_rank():
  layout = lambdamart.feature_layout({}, {"x": tf.io.FixedLenFeature([1], tf.float32)})
  batch = ({"x": tf.constant([[[1.0], [2.0], [0.0]],
                              [[3.0], [0.0],
                               [0.0]]])}, tf.constant([[2.0, 0.0, -1.0], [1.0, -1.0, -1.0]]))
  matrix, labels, group = lambdamart.collect([batch], lambdamart.Encoder(layout))
  np.testing.assert_array_equal(matrix, [[1.0], [2.0], [3.0]])
  np.testing.assert_array_equal(labels, [2, 0, 1])
  np.testing.assert_array_equal(group, [2, 1])
  fractional = (batch[0], tf.constant([[2.5, 0.0, -1.0], [1.0, -1.0, -1.0]]))
  with pytest.raises(lambdamart.LambdaMartUnavailable, match=r"not an integer \(2.5\)"):
    lambdamart.collect([fractional], lambdamart.Encoder(layout))
  too_high = (batch[0], tf.constant([[31.0, 0.0, -1.0], [1.0, -1.0, -1.0]]))
  with pytest.raises(lambdamart.LambdaMartUnavailable, match=r"above 30 \(31\)"):
    lambdamart.collect([too_high], lambdamart.Encoder(layout))


def test_config_checks_name_the_key():
  with pytest.raises(ValueError, match=r"lambdamart\.num_leaves must be >= 2, got 1"):
    LambdaMartConfig(num_leaves=1)
  with pytest.raises(ValueError, match=r"lambdamart\.learning_rate must be positive"):
    LambdaMartConfig(learning_rate=0.0)
