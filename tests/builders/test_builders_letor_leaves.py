"""The leaves-as-ids ranker (builders/letor_leaves.py) on tiny LETOR files."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_ranking as tfr

import builders_testlib as lib
from builders import letor_leaves
from builders.mslr import dnn_scorer
from builders.letor_leaves_config import LeavesModelConfig
from mxrec_pipeline.util import initialize

pytest.importorskip("lightgbm")

CONFIG = str(lib.CONFIG_DIR / "letor_leaves.yaml")
WIDTH = 12
TREES = [
    "model.num_folds=2", "model.num_trees=3", "model.num_leaves=4", "model.min_child_samples=2"
]


def test_scores_of_k_folds_are_the_mean_of_each_folds_scores():
  tf.keras.utils.set_random_seed(2)
  features = tf.keras.Input([None, 5], name="features")
  leaves = tf.keras.Input([None, None, 3], name="leaves")
  mask = tf.keras.Input([None], dtype=tf.bool, name="mask")
  scorer = letor_leaves.FoldMeanScorer(dnn_scorer(LeavesModelConfig(hidden_layer_dims=[4])),
                                       "features", "leaves")
  model = tf.keras.Model([features, leaves, mask],
                         scorer({}, {"features": features, "leaves": leaves}, mask))
  rng = np.random.default_rng(0)
  x = rng.normal(size=[2, 4, 5]).astype(np.float32)
  emb = rng.normal(size=[2, 4, 3, 3]).astype(np.float32)
  on = np.ones([2, 4], bool)
  each = [model([x, emb[:, :, j:j + 1], on], training=False) for j in range(3)]
  assert not np.allclose(each[0], each[1])
  np.testing.assert_allclose(model([x, emb, on], training=False), np.mean(each, 0), rtol=1e-5,
                             atol=1e-6)


def _files(tmp_path):
  train = lib.write_wide_letor(tmp_path / "train.txt", WIDTH, [6, 7, 5, 6, 8, 6, 7, 5], 5, seed=1)
  valid = lib.write_wide_letor(tmp_path / "vali.txt", WIDTH, [4, 9, 3], 5, seed=2, first_qid=100)
  return [
      f"data.train_path={train}", f"data.valid_path={valid}", f"data.elwc_dir={tmp_path / 'elwc'}",
      "data.baseline_feature=5", "model.hidden_layer_dims=[8]", "dataset.train_batch_size=2",
      "dataset.list_size=6", *TREES
  ]


SERVE = """
import json, sys
sys.modules["lightgbm"] = None  # Serving needs TensorFlow only.
sys.modules["mxrec_pipeline"] = None
import tensorflow as tf
records = [r for r in tf.data.TFRecordDataset(sys.argv[2]).as_numpy_iterator()]
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
served = serve(examples=tf.constant(records))
print(json.dumps(served["scores"].numpy().tolist()))
"""


@pytest.mark.slow
def test_trains_exports_and_serves_with_tensorflow_alone(tmp_path, capsys):
  run = tmp_path / "run"
  overrides = _files(tmp_path) + [f"pipeline.model_dir={run}", "pipeline.num_train_steps=null"]
  metrics = lib.train_cli(capsys, CONFIG, overrides)
  lib.assert_metrics_file(metrics)
  (fitted,) = (tmp_path / "elwc").glob("*.leaves")
  saved = (fitted / "folds.json").stat().st_mtime_ns
  (valid_elwc,) = [str(p) for p in (tmp_path / "elwc").glob("vali.*.tfrecord")]
  out = subprocess.run(
      [sys.executable, "-c", SERVE,
       str(run / "export" / "latest_model"), valid_elwc], capture_output=True, text=True,
      timeout=300, check=True)
  scores = np.array(json.loads(out.stdout.strip().splitlines()[-1]))
  assert scores.shape == (3, 9) and np.all(np.isfinite(scores))
  # The export derives the leaves as the input pipeline did: its NDCG is the job's.
  lists = tf.data.TFRecordDataset(valid_elwc).batch(3).map(
      lambda s: tfr.data.parse_from_example_list(
          s, example_feature_spec={"utility": tf.io.FixedLenFeature([1], tf.float32, -1.0)}))
  labels = tf.squeeze(next(iter(lists))["utility"], -1)
  ndcg = tfr.keras.metrics.NDCGMetric(topn=10)
  ndcg.update_state(labels, tf.constant(scores, tf.float32))
  assert float(ndcg.result()) == pytest.approx(metrics["model"]["ndcg@10"], abs=1e-4)
  # The raw-feature signature derives the same leaves.
  example_spec = {
      f"custom_features_{i}": tf.io.FixedLenFeature([1], tf.float32, 0.0)
      for i in range(1, WIDTH + 1)
  }
  raw = next(
      iter(
          tf.data.TFRecordDataset(valid_elwc).batch(
              3).map(lambda s: tfr.data.parse_from_example_list(
                  s, example_feature_spec=example_spec, mask_feature_name="example_list_mask"))))
  predict = tf.saved_model.load(str(run / "export" / "latest_model")).signatures["predict"]
  np.testing.assert_allclose(predict(**raw)["scores"], scores, rtol=1e-5, atol=1e-6)
  # Rerun with more epochs: it resumes on the trees its table was keyed by.
  initialize.terminate_config_initializer()  # A new process's state, as the CLI would start.
  tf.keras.backend.clear_session()
  metrics = lib.train_cli(capsys, CONFIG, overrides[:-1] + ["pipeline.num_train_steps=4"])
  assert (fitted / "folds.json").stat().st_mtime_ns == saved


@pytest.mark.slow
def test_disjoint_trees_train_on_lists_the_dnn_does_not(tmp_path, capsys):
  overrides = _files(tmp_path) + [
      f"pipeline.model_dir={tmp_path / 'run'}", "model.encoding=disjoint",
      "lambdamart.enabled=false"
  ]
  metrics = lib.train_cli(capsys, CONFIG, overrides)
  lib.assert_metrics_file(metrics)
  (fitted,) = (tmp_path / "elwc").glob("*.leaves")
  info = json.loads((fitted / "folds.json").read_text())["info"]
  assert info["folds"] == 1 and info["lists"] == 4  # Half of the 8 training lists.
  (trees_lists,) = (tmp_path / "elwc").glob("*.trees.json")
  assert len(json.loads(trees_lists.read_text())) == 4


@pytest.mark.parametrize("override, key", [
    ("model.encoding=bagging", "model.encoding"),
    ("model.num_folds=1", "model.num_folds"),
    ("model.tree_fraction=0.8", "model.tree_fraction"),
    ("model.leaf_combiner=max", "model.leaf_combiner"),
    ("model.num_leaves=1", "model.num_leaves"),
])
def test_config_errors_name_the_key(tmp_path, capsys, override, key):
  args = ["train", CONFIG, "--set", f"pipeline.model_dir={tmp_path / 'run'}", "--set", override]
  assert key in lib.cli_error(capsys, args)
  assert not (tmp_path / "run").exists()


def test_more_folds_than_training_lists_is_refused(tmp_path, capsys):
  overrides = _files(tmp_path) + [f"pipeline.model_dir={tmp_path / 'run'}", "model.num_folds=9"]
  args = ["train", CONFIG] + [a for o in lib.TINY_PIPELINE + overrides for a in ("--set", o)]
  assert "9 folds need at least 9 training lists, got 8" in lib.cli_error(capsys, args)


def test_continuous_training_is_refused_naming_the_builder(tmp_path, capsys):
  args = [
      "train", CONFIG, "--continuous", "--set", f"pipeline.model_dir={tmp_path / 'run'}", "--set",
      f"continuous.partitions_dir={tmp_path}", "--set", "pipeline.early_stopping=null"
  ]
  assert "letor_leaves cannot train continuously" in lib.cli_error(capsys, args)
