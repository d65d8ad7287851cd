"""The Keras pipeline with a tiered table: trains, logs table stats, checkpoints and serves."""

import glob
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import keras_testlib as lib
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.keras.layers import TableSpec
from mxrec_pipeline.util import initialize

# Trains a pipeline with a tiered table and serves its export in a fresh process.
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_run_leaks():
  """Overrides the suite's per-test run reset: these tests share one trained run."""
  yield


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("tiers")
  ssd = tmp / "ssd"
  ssd.mkdir()
  builder = lib.model_builder(tables=lib.tiered_tables(str(ssd)))
  train, valid = lib.write_task(tmp)
  hparams = pipeline_lib.PipelineHparams(model_dir=str(tmp / "model"), num_epochs=2,
                                         learning_rate=0.05, seed=3)
  initialize.terminate_config_initializer()
  pipe = pipeline_lib.SimplePipeline(builder, lib.dataset_builder(train, valid, train_batch_size=2),
                                     hparams)
  metrics = pipe.train_and_validate()
  run = initialize.get_config_initializer()
  dataset = lib.dataset_builder(train, valid, train_batch_size=2).build_valid_dataset(num_epochs=1)
  yield {
      "tmp": tmp, "valid": valid, "metrics": metrics, "run": run,
      "stats": {k: int(v) for k, v in run.tables["item"].tiers.stats().items()},
      "in_process": lib.eval_scores(pipe.model, dataset)
  }
  initialize.terminate_config_initializer()


def test_trains_with_rows_moving_between_tiers(trained):
  assert all(np.isfinite(v) for v in trained["metrics"].values())
  stats = trained["stats"]
  assert stats["occupied"] <= 12 and stats["swap_outs"] > 0 and stats["swap_ins"] > 0
  assert stats["ssd_rows_used"] > 0  # 20 items: 12 on the device, 4 on the host, the rest SSD
  assert trained["run"].tables["user"].tiers is None


def test_table_stats_reach_tensorboard(trained):
  files = glob.glob(str(trained["tmp"] / "model" / "logs" / "tables" / "events.*"))
  tags = {
      v.tag for f in files for e in tf.compat.v1.train.summary_iterator(f) for v in e.summary.value
  }
  assert {
      "tables/item/hit_rate", "tables/item/host_rows_used", "tables/item/ssd_rows_used",
      "tables/user/size", "tables/user/admissions"
  } <= tags


def test_checkpoint_holds_the_tiers(trained):
  """The tiered table whole in ckpt-N (its device cache's mapping); flat ones only in shards-N."""
  checkpoint = tf.train.latest_checkpoint(str(trained["tmp"] / "model" / "checkpoints"))
  names = [name for name, _ in tf.train.list_variables(checkpoint)]
  assert any(
      name.startswith("tiered_tables/item/tiers/") and "store_values" in name for name in names)
  assert not [name for name in names if name.startswith("tiered_tables/user/")]
  shards = pathlib.Path(checkpoint).parent / f"shards-{checkpoint.rsplit('-', 1)[1]}"
  # Each table's shard, and the chain's record (keras/save_schedule.py).
  assert sorted(p.name for p in shards.iterdir()) == ["chain.json", "item", "user", "word"]


def test_saved_model_serves_every_tier_without_the_op_library(trained):
  export_dir = str(trained["tmp"] / "model" / "export" / "latest_model")
  served = lib.serve_in_fresh_process(export_dir, trained["valid"], str(trained["tmp"]))
  lib.assert_served_match(served, trained["in_process"], trained["valid"])


def test_bad_table_spec_tiers_name_the_table(tmp_path):
  initialize.terminate_config_initializer()
  initialize.init()
  from mxrec_pipeline.keras import layers  # pylint: disable=import-outside-toplevel
  spec = TableSpec("item", 4, 12, host_vocabulary_size=4, ssd_vocabulary_size=10,
                   ssd_data_path=(str(tmp_path / "missing"),))
  with pytest.raises(ValueError, match=r"'item'.*SSD directory .*missing' does not exist"):
    layers.get_or_create_table(spec)
  initialize.terminate_config_initializer()
