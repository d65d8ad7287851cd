"""End to end: train a tiny task with SimplePipeline, export, serve in a fresh process."""

import json
import zlib

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_ranking as tfr

import keras_testlib as lib
from mxrec_pipeline.data import elwc
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.util import initialize

# Trains a pipeline and serves its export in a fresh process.
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_run_leaks():
  """Overrides the suite's per-test run reset: these tests share one trained run."""
  yield


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("pipeline")
  train, valid = lib.write_task(tmp)
  hparams = pipeline_lib.PipelineHparams(model_dir=str(tmp / "model"), num_epochs=2,
                                         num_train_steps=8, learning_rate=0.05, seed=3,
                                         export_best_model=True)
  initialize.terminate_config_initializer()
  pipe = pipeline_lib.SimplePipeline(lib.model_builder(), lib.dataset_builder(train, valid),
                                     hparams)
  metrics = pipe.train_and_validate()
  # Scores of the validation lists through the training-side path (insertion
  # in the dataset, eval mode), for comparison with the SavedModel.
  dataset = lib.dataset_builder(train, valid).build_valid_dataset(num_epochs=1)
  valid_batches = [
      (labels.numpy(), pipe.model(features, training=False).numpy()) for features, labels in dataset
  ]
  in_process = [scores for _, scores in valid_batches]
  longest = max(s.shape[1] for s in in_process)
  yield {
      "tmp": tmp, "valid": valid, "metrics": metrics, "pipeline": pipe,
      "run": initialize.get_config_initializer(), "valid_batches": valid_batches, "in_process":
          np.concatenate([np.pad(s, ((0, 0), (0, longest - s.shape[1]))) for s in in_process])
  }
  initialize.terminate_config_initializer()


def test_train_and_validate_reports_ranking_metrics(trained):
  """The returned metrics equal tfr's metrics and loss recomputed on the trained
  model's scores of the validation lists."""
  metrics = trained["metrics"]
  assert set(metrics) == {"ndcg@1", "ndcg@5", "ndcg@10", "mrr", "loss"}
  batches = trained["valid_batches"]
  for key, (name, topn) in pipeline_lib.RANKING_METRICS.items():
    metric = tfr.keras.metrics.get(name, topn=topn)
    for labels, scores in batches:
      metric.update_state(labels, scores)
    assert metrics[key] == pytest.approx(float(metric.result()), abs=1e-5), key
  # Keras averages the per-batch losses weighted by batch size.
  loss_fn = trained["pipeline"].build_loss()
  losses = [float(loss_fn(labels, scores)) for labels, scores in batches]
  sizes = [len(labels) for labels, _ in batches]
  assert metrics["loss"] == pytest.approx(np.average(losses, weights=sizes), rel=1e-5)


def test_outputs_checkpoints_logs_and_exports(trained):
  model_dir = trained["tmp"] / "model"
  assert tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
  assert (model_dir / "logs").is_dir()
  for name in ("latest_model", "best_model_by_metric"):
    assert (model_dir / "export" / name / "saved_model.pb").exists()


def test_a_run_ending_on_its_best_epoch_copies_that_export_as_latest_model(trained):
  """The best export of the last epoch serves the final model: latest_model is its copy
  (byte for byte, without best_metric.json), not a second export."""
  export = trained["tmp"] / "model" / "export"
  record = json.loads((export / "best_model_by_metric" / "best_metric.json").read_text())
  assert record["epoch"] == 2  # This seeded run's last epoch is its best.
  best = sorted(
      p.relative_to(export / "best_model_by_metric")
      for p in (export / "best_model_by_metric").rglob("*") if p.is_file())
  latest = sorted(
      p.relative_to(export / "latest_model") for p in (export / "latest_model").rglob("*")
      if p.is_file())
  assert latest == [p for p in best if p.name != "best_metric.json"]
  for path in latest:
    assert (export / "latest_model" / path).read_bytes() == (export / "best_model_by_metric" /
                                                             path).read_bytes(), path


def test_training_updates_only_touched_table_rows(trained):
  model = trained["pipeline"].model
  table = trained["run"].tables["item"]
  keys, rows = (t.numpy() for t in table.key_index.export())
  # The n training items the 8 steps saw (of the 20; pads read item 0) hold
  # rows 0..n-1; validation's unseen items took none. Other rows keep their
  # initial values and zero slots.
  n = len(keys)
  assert n >= 15 and set(keys) <= set(range(20)) and sorted(rows) == list(range(n))
  spec = {t.name: t for t in lib.TABLES}["item"]
  seed = (1 + zlib.crc32(b"item")) % 2**31
  expected = tf.keras.initializers.TruncatedNormal(
      stddev=spec.initializer_stddev, seed=seed)(shape=[spec.device_vocabulary_size, spec.dim])
  np.testing.assert_array_equal(table.variable.numpy()[n:], expected.numpy()[n:])
  assert np.any(table.variable.numpy()[:n] != expected.numpy()[:n])
  slot_m = model.sparse_optimizer.get_slot("item", "m").numpy()
  assert np.all(slot_m[n:] == 0.0) and np.any(slot_m[:n] != 0.0)


def test_saved_model_serves_raw_ids_in_fresh_tensorflow_process(trained):
  export_dir = str(trained["tmp"] / "model" / "export" / "latest_model")
  served = lib.serve_in_fresh_process(export_dir, trained["valid"], str(trained["tmp"]))
  lib.assert_served_match(served, trained["in_process"], trained["valid"])


def test_unseen_ids_score_with_default_embedding(trained):
  """An unseen item scores as if its embedding were zeros: two unseen items
  with the same other features score the same."""
  same = {"price": 0.5, "tags": ["t1"], "label": 0.0}
  lst = elwc.make_elwc(
      {"user_id": 1, "city": "c1"},
      [{"item_id": 5000, **same}, {"item_id": 6000, **same}, {"item_id": 5, **same}])
  module_dir = str(trained["tmp"] / "model" / "export" / "latest_model")
  scores = tf.saved_model.load(module_dir).signatures["serving_default"](
      examples=tf.constant([lst.SerializeToString()]))["scores"].numpy()[0]
  assert scores[0] == pytest.approx(scores[1], abs=1e-6)
  assert scores[2] != pytest.approx(scores[0], abs=1e-6)
