"""The DASALC ranker (builders/letor_dasalc.py) on tiny LETOR files."""

import numpy as np
import pytest
import tensorflow as tf

import builders_testlib as lib
from builders import letor_dasalc
from builders.letor_dasalc_config import DasalcModelConfig
from mxrec_pipeline.util import initialize

CONFIG = str(lib.CONFIG_DIR / "letor_dasalc.yaml")
WIDTH = 46


def _model(config: DasalcModelConfig) -> tf.keras.Model:
  tf.keras.utils.set_random_seed(3)
  if not initialize.is_initialized():
    initialize.init()
  return letor_dasalc.LetorDasalc(num_features=WIDTH).build_model_builder(config, None).build()


def _inputs(batch_size: int = 3, list_size: int = 5, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  features = {
      f"custom_features_{i}": tf.constant(rng.uniform(-5, 50, [batch_size, list_size, 1]),
                                          tf.float32) for i in range(1, WIDTH + 1)
  }
  mask = np.ones([batch_size, list_size], bool)
  mask[0, 3:] = False
  return features | {"example_list_mask": tf.constant(mask)}


def test_ensemble_scores_are_the_mean_of_its_members():
  model = _model(DasalcModelConfig(hidden_layer_dims=[8], attention_head_size=4, ensemble_size=3))
  inputs = _inputs()
  members = tf.keras.Model(model.inputs,
                           [model.get_layer(f"member_{i}_logit").output for i in range(3)])
  each = np.stack([np.squeeze(m, -1) for m in members(inputs, training=False)])
  assert not np.allclose(each[0], each[1])  # Independently initialized members.
  np.testing.assert_allclose(model(inputs, training=False), each.mean(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combine", ["concat", "latent_cross"])
def test_noise_only_at_training_and_attention_sees_the_list(combine):
  config = DasalcModelConfig(hidden_layer_dims=[8], attention_head_size=4, dropout=0.0,
                             input_noise_stddev=1.0, combine=combine)
  model = _model(config)
  inputs = _inputs()
  np.testing.assert_array_equal(model(inputs, training=False), model(inputs, training=False))
  assert not np.allclose(model(inputs, training=True), model(inputs, training=True))
  # Changing another document of the list changes a document's score (attention across the
  # list); a plain DNN's would not change.
  other = dict(inputs)
  other["custom_features_1"] = tf.tensor_scatter_nd_update(inputs["custom_features_1"], [[1, 4, 0]],
                                                           [1000.0])
  before, after = model(inputs, training=False), model(other, training=False)
  assert not np.allclose(before[1, 0], after[1, 0])
  np.testing.assert_allclose(before[2], after[2], rtol=1e-6)  # Other lists are untouched.


@pytest.mark.slow
def test_trains_exports_and_serves(tmp_path, capsys):
  train = lib.write_wide_letor(tmp_path / "train.txt", WIDTH, [5, 7, 3, 6], 25, seed=1)
  valid = lib.write_wide_letor(tmp_path / "vali.txt", WIDTH, [4, 9, 3], 25, seed=2, first_qid=100)
  overrides = [
      f"data.train_path={train}",
      f"data.valid_path={valid}",
      f"data.elwc_dir={tmp_path / 'elwc'}",
      "data.baseline_feature=25",
      f"pipeline.model_dir={tmp_path / 'run'}",
      "model.hidden_layer_dims=[8]",
      "model.attention_head_size=4",
      "model.ensemble_size=2",
      "dataset.train_batch_size=2",
      "dataset.list_size=6",
      "pipeline.early_stopping={patience: 1}"  # The shipped config's retrain, at its smallest.
  ]
  metrics = lib.train_cli(capsys, CONFIG, overrides)
  assert metrics["early_stopping"]["retrained_epochs"] == 1
  lib.assert_metrics_file(metrics)
  (valid_elwc,) = [str(p) for p in (tmp_path / "elwc").glob("vali.*.tfrecord")]
  lists = lib.serialized_lists(valid_elwc)
  served = tf.saved_model.load(
      str(tmp_path / "run" / "export" /
          "latest_model")).signatures["serving_default"](examples=lists)["scores"]
  assert served.shape == [3, 9] and np.all(np.isfinite(served))


@pytest.mark.parametrize("override, key", [
    ("model.ensemble_size=0", "model.ensemble_size"),
    ("model.combine=sum", "model.combine"),
    ("model.input_noise_stddev=-1", "model.input_noise_stddev"),
    ("model.num_attention_heads=-2", "model.num_attention_heads"),
    ("model.dropout=1.0", "model.dropout"),
    ("data.num_features=0", "data.num_features"),
])
def test_config_errors_name_the_key(tmp_path, capsys, override, key):
  args = ["train", CONFIG, "--set", f"pipeline.model_dir={tmp_path / 'run'}", "--set", override]
  assert key in lib.cli_error(capsys, args)
  assert not (tmp_path / "run").exists()
