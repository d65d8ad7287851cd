"""The DCN-v2 ranker (builders/movielens_dcn.py) on a tiny MovieLens."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import builders_testlib as lib
from builders import movielens_dcn
from mxrec_pipeline import config as config_lib
from mxrec_pipeline.data import movielens
from mxrec_pipeline import jobs
from mxrec_pipeline.util import initialize

CONFIG = str(lib.CONFIG_DIR / "movielens_dcn.yaml")

# Scores serialized ELWC lists with a SavedModel, importing only TensorFlow.
_SERVE = """
import json, sys
import tensorflow as tf
lists = tf.constant(list(tf.data.TFRecordDataset(sys.argv[2]).as_numpy_iterator()))
scores = tf.saved_model.load(sys.argv[1]).signatures["serving_default"](examples=lists)
print(json.dumps(scores["scores"].numpy().tolist()))
assert not [m for m in sys.modules if m.startswith(("mxrec_pipeline", "builders"))]
"""


@pytest.mark.parametrize("projection_dim", [None, 2])
def test_cross_matches_numpy(projection_dim):
  rng = np.random.default_rng(0)
  x0, x = rng.normal(size=(2, 3, 4)).astype(np.float32)
  layer = movielens_dcn.Cross(projection_dim)
  got = layer((tf.constant(x0), tf.constant(x))).numpy()
  if projection_dim is None:
    w, b = layer.get_weights()
  else:
    u, v, b = layer.get_weights()
    w = u @ v
  np.testing.assert_allclose(got, x0 * (x @ w + b) + x, rtol=1e-5, atol=1e-6)
  assert movielens_dcn.Cross.from_config(layer.get_config()).projection_dim == projection_dim


def test_cross_rejects_bad_projection_dim():
  with pytest.raises(ValueError, match="`projection_dim` must be positive, got 0"):
    movielens_dcn.Cross(0)


@pytest.mark.slow
def test_trains_with_tables_exports_and_serves_without_the_project(tmp_path, capsys):
  data_dir = lib.write_movielens(tmp_path / "ml")
  overrides = [
      f"data.data_dir={data_dir}", f"data.elwc_dir={tmp_path / 'elwc'}",
      f"pipeline.model_dir={tmp_path / 'run'}", "model.hidden_layer_dims=[8]",
      "model.projection_dim=4", "model.id_dim=4", "model.attribute_dim=2",
      "model.device_vocabulary_size=200", "dataset.train_batch_size=4"
  ]
  metrics = lib.train_cli(capsys, CONFIG, overrides)
  lib.assert_metrics_file(metrics)

  # The ids' rows were trained through the sparse core: the tables are in the model.
  config = config_lib.load(CONFIG, lib.TINY_PIPELINE + overrides)
  reexport = jobs.export(config, str(tmp_path / "reexport"))
  valid = str(tmp_path / "elwc" / "valid.tfrecord")
  served = subprocess.run(
      [sys.executable, "-c", _SERVE,
       str(tmp_path / "run" / "export" / "latest_model"), valid], capture_output=True, text=True,
      check=True, cwd=tmp_path)
  in_process = tf.saved_model.load(reexport).signatures["serving_default"](
      examples=lib.serialized_lists(valid))["scores"]
  np.testing.assert_allclose(json.loads(served.stdout), in_process, rtol=1e-5, atol=1e-6)


def test_model_has_cross_layers_and_sparse_lookups():
  initialize.init()
  ranker = movielens_dcn.MovieLensDcn()
  config = movielens_dcn.DcnModelConfig(num_cross_layers=3, device_vocabulary_size=100)
  model = ranker.build_model_builder(config, seed=1).build()
  names = [layer.name for layer in model.layers]
  assert [n for n in names if n.startswith("cross_")] == ["cross_0", "cross_1", "cross_2"]
  features, tables = ranker.sparse_features(config)
  assert {f"sparse_lookup_{f.name}" for f in features} <= set(names)
  assert len(model.table_variables) == len(tables)


def test_feature_switches_and_tiers_are_typed_config_keys():
  """DCN's config has movielens_listwise's feature and table keys (MovieLensTablesConfig)."""
  ranker = movielens_dcn.MovieLensDcn()
  default = movielens_dcn.DcnModelConfig()
  lean = movielens_dcn.DcnModelConfig(user_history=False, item_knn=False, host_vocabulary_size=64,
                                      device_vocabulary_size=32)
  context, example = ranker.model_feature_specs(default)
  lean_context, lean_example = ranker.model_feature_specs(lean)
  assert "history_item_ids" in context and "history_item_ids" not in lean_context
  assert set(example) - set(lean_example) == set(movielens.ITEM_KNN_FEATURES)
  tables = {t.name: t for t in ranker.sparse_features(lean)[1]}
  assert "history_item" not in tables
  assert tables["user"].tiered and tables["item"].host_vocabulary_size == 64
  assert not tables["genre"].tiered


@pytest.mark.parametrize("override, key", [
    ("model.num_cross_layers=-1", "model.num_cross_layers"),
    ("model.projection_dim=0", "model.projection_dim"),
    ("model.combiner=max", "model.combiner"),
    ("model.cross_layers=2", "model.cross_layers"),
])
def test_config_errors_name_the_key(tmp_path, capsys, override, key):
  err = lib.cli_error(
      capsys, ["train", CONFIG, "--set", f"pipeline.model_dir={tmp_path}/run", "--set", override])
  assert key in err
