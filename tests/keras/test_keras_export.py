"""Export: compact tables in the SavedModel, crash-safe writes, checkpoint temp cleanup."""

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_testlib as lib
from mxrec_pipeline import embedding as mx_embedding
from mxrec_pipeline.keras import export as export_lib
from mxrec_pipeline.util import atomic_dir
from mxrec_pipeline.util import initialize

WORKER = str(pathlib.Path(__file__).parent / "export_worker.py")


@pytest.fixture(autouse=True)
def _no_run_leaks():
  """Overrides the suite's per-test run reset: these tests share one trained run."""
  yield


def test_embedding_serving_tables_hold_used_rows_and_zeros():
  initialize.terminate_config_initializer()
  try:
    table = mx_embedding.TableConfig(vocabulary_size=10, dim=2, name="served")
    embedding = mx_embedding.Embedding(mx_embedding.FeatureConfig(table), optimizer=None)
    embedding(tf.constant([7, 3, 7], tf.int64), training=True)
    full = embedding.embedding_tables[table]
    full.assign(tf.reshape(tf.range(20, dtype=tf.float32), [10, 2]))
    positions, rows = embedding.serving_tables()[table]
    assert rows.shape == [3, 2]
    found = positions.lookup(tf.constant([7, 3, 99], tf.int64))
    expected = tf.nn.embedding_lookup(
        full,
        embedding.row_lookup_tables()[table].lookup(tf.constant([7, 3], tf.int64)))
    np.testing.assert_array_equal(
        tf.gather(rows, found).numpy(), np.concatenate([expected.numpy(), [[0.0, 0.0]]]))
  finally:
    initialize.terminate_config_initializer()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("export")
  run = lib.train_task(tmp, num_epochs=1, num_train_steps=4, learning_rate=0.05, seed=3)
  yield run | {"export_dir": str(tmp / "model" / "export" / "latest_model")}
  initialize.terminate_config_initializer()


def _export(trained, export_dir: str, before_rename=None) -> str:
  return export_lib.export_serving_model(trained["pipeline"].model, export_dir, lib.CONTEXT_SPEC,
                                         lib.EXAMPLE_SPEC, lib.MASK, lib.SPARSE_FEATURES,
                                         before_rename=before_rename)


def test_saved_model_holds_only_used_rows_and_a_default_row(trained):
  tables = initialize.get_config_initializer().tables
  saved = dict(
      tf.train.list_variables(os.path.join(trained["export_dir"], "variables", "variables")))
  for spec in lib.TABLES:
    num_keys = int(tables[spec.name].key_index.size())
    assert 0 < num_keys < spec.device_vocabulary_size
    assert saved[f"serving_rows/{spec.name}/.ATTRIBUTES/VARIABLE_VALUE"] == [num_keys + 1, spec.dim]
  # No full table, optimizer slot or metric travels with the export.
  capacities = {spec.device_vocabulary_size for spec in lib.TABLES}
  assert not [name for name, shape in saved.items() if shape and shape[0] in capacities]
  assert not [name for name in saved if "optimizer" in name or "metrics" in name]


def test_compact_rows_are_the_keys_rows_then_zeros(trained):
  loaded = tf.saved_model.load(trained["export_dir"])
  for name, table in initialize.get_config_initializer().tables.items():
    keys, rows = (t.numpy() for t in table.key_index.export())
    exported = loaded.serving_rows[name].numpy()
    np.testing.assert_array_equal(exported[-1], np.zeros(exported.shape[1]))
    # The keys' rows in increasing key order, so exports are deterministic.
    np.testing.assert_array_equal(exported[:-1], table.variable.numpy()[rows[np.argsort(keys)]])
    # In process: each key's position holds its row; absent keys read the last.
    positions, compact = table.key_index.to_compact_table(
        lambda r, table=table: tf.gather(table.variable, tf.maximum(r, 0)))
    found = positions.lookup(tf.constant(np.append(keys, [-7]))).numpy()
    np.testing.assert_array_equal(np.sort(found[:-1]), np.arange(len(keys)))
    assert found[-1] == len(keys)
    np.testing.assert_array_equal(compact.numpy()[found[:-1]], table.variable.numpy()[rows])


def test_compact_export_serves_in_process_scores_in_fresh_process(trained):
  served = lib.serve_in_fresh_process(trained["export_dir"], trained["valid"], str(trained["tmp"]))
  lib.assert_served_match(served, trained["in_process"], trained["valid"])


def test_export_killed_before_rename_leaves_previous_export(trained, tmp_path):
  export_dir = str(tmp_path / "export" / "latest_model")
  out = str(tmp_path / "first_scores.json")
  killed = subprocess.run(
      [sys.executable, WORKER, str(trained["tmp"]), export_dir, out], capture_output=True,
      text=True, check=False)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  leftovers = [p for p in os.listdir(tmp_path / "export") if p != "latest_model"]
  assert len(leftovers) == 1 and leftovers[0].startswith(".latest_model.tmp-")
  assert (tmp_path / "export" / leftovers[0] / "saved_model.pb").exists()

  with open(out, encoding="utf-8") as f:
    first = np.array(json.load(f))
  served = lib.serve_in_fresh_process(export_dir, trained["valid"], str(tmp_path))
  np.testing.assert_allclose(served, first, rtol=1e-6)
  # The killed export was complete in its temporary directory, with other scores.
  unfinished = lib.serve_in_fresh_process(str(tmp_path / "export" / leftovers[0]), trained["valid"],
                                          str(tmp_path))
  assert not np.allclose(unfinished, first)

  _export(trained, export_dir)
  assert os.listdir(tmp_path / "export") == ["latest_model"]
  lib.assert_served_match(lib.serve_in_fresh_process(export_dir, trained["valid"], str(tmp_path)),
                          trained["in_process"], trained["valid"])


def test_failed_export_removes_its_temp_dir_and_keeps_target(trained, tmp_path):
  export_dir = str(tmp_path / "latest_model")
  _export(trained, export_dir)
  before = sorted(os.listdir(export_dir))

  def fail(path):
    assert os.path.exists(os.path.join(path, "saved_model.pb"))
    raise RuntimeError("disk on fire")

  with pytest.raises(RuntimeError, match="disk on fire"):
    _export(trained, export_dir, before_rename=fail)
  assert os.listdir(tmp_path) == ["latest_model"]
  assert sorted(os.listdir(export_dir)) == before


def test_remove_leftovers_restores_a_target_renamed_aside(tmp_path):
  target = tmp_path / "model"
  (tmp_path / ".model.old-1").mkdir()
  (tmp_path / ".model.old-1" / "saved_model.pb").write_text("old")
  (tmp_path / ".model.tmp-2").mkdir()
  removed = atomic_dir.remove_leftovers(str(target))
  assert removed == [str(tmp_path / ".model.tmp-2")]
  assert (target / "saved_model.pb").read_text() == "old"
  assert sorted(os.listdir(tmp_path)) == ["model"]


def test_write_dir_atomically_replaces_the_target(tmp_path):
  target = str(tmp_path / "out")

  def write(text):
    return lambda path: pathlib.Path(path, "f").write_text(text)

  atomic_dir.write_dir_atomically(target, write("one"))
  atomic_dir.write_dir_atomically(target, write("two"))
  assert pathlib.Path(target, "f").read_text() == "two"
  assert os.listdir(tmp_path) == ["out"]


def test_remove_checkpoint_temp_dirs_keeps_checkpoints(tmp_path):
  checkpoint = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0]))
  manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=3)
  manager.save(checkpoint_number=1)
  # What a save killed before its merge leaves: ckpt-2_temp/part-... shards.
  (tmp_path / "ckpt-2_temp").mkdir()
  (tmp_path / "ckpt-2_temp" / "part-00000-of-00001.index").write_bytes(b"partial")
  kept = sorted(os.listdir(tmp_path))
  kept.remove("ckpt-2_temp")

  assert atomic_dir.remove_checkpoint_temp_dirs(str(tmp_path)) == [str(tmp_path / "ckpt-2_temp")]
  assert sorted(os.listdir(tmp_path)) == kept
  assert atomic_dir.remove_checkpoint_temp_dirs(str(tmp_path / "absent")) == []
  checkpoint.restore(manager.latest_checkpoint).assert_consumed()
