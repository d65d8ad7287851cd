"""MovieLens with its tables sharded by key over 2 workers (`train --local-cluster workers=2`).

The Keras pipeline's sparse features under MultiWorkerMirroredStrategy
(keras/sharded.py over distributed.ShardedTable) against one process on the
same global batches: per-epoch losses, validation metrics, every table's rows
by key in the exports (gathered from the shards), and the served scores; the
2-worker job stops after epoch 1 and resumes from its per-shard checkpoints,
saving epoch 2 as a delta of each shard (pipeline.checkpoint.full_every_s
3600), whose chain equals the one-process run's full save; `mxrec-pipeline
export` of its checkpoint serves as its own export.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import cluster_testlib as lib
from mxrec_pipeline import cli
from mxrec_pipeline import serving
from mxrec_pipeline.distributed import checkpoint as checkpoint_lib
from mxrec_pipeline.evaluation import METRICS_FILE
from mxrec_pipeline.keras import table_checkpoints

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CONFIG = lib.MOVIELENS_CONFIG
TIMEOUT_S = lib.TIMEOUT_S
TABLES = lib.MOVIELENS_TABLES

# ckpt-1 full, ckpt-2 a delta on it: within the hour of ckpt-1, on the clock the workers agree on
# (the mean of theirs, an all-reduce: keras/save_schedule.py), read again after the restart.
DELTAS = {"checkpoint.full_every_s": 3600}


def _overrides(tmp_path, data_dir, model_dir, **pipeline):
  # Batches of 4 lists split 2 + 2 over the workers; 16 validation lists in 4 batches.
  return lib.movielens_overrides(tmp_path, data_dir, model_dir, collective_timeout_s=60, **pipeline)


def _export(model_dir: pathlib.Path):
  return tf.saved_model.load(str(model_dir / "export" / "latest_model"))


def test_movielens_on_two_workers_trains_as_one_process(tmp_path, capsys):
  data_dir = lib.write_tiny_movielens(tmp_path / "ml")
  env, marker = lib.marked_env()
  model_dir = tmp_path / "run2"
  # Worker 1 killed in epoch 2 (its 5th batch), after epoch 1's checkpoint and best export;
  # then the same command: both workers resume from their shards, and agree from the
  # checkpoint's best metric on whether epoch 2 exports a best model.
  outputs = []
  for fault in ("train_batch:5@worker:1", ""):
    try:
      launcher = subprocess.run([
          sys.executable, "-m", "mxrec_pipeline.cli", "train", CONFIG, "--verbose=0",
          "--local-cluster", "workers=2",
          *_overrides(tmp_path, data_dir, model_dir, export_best_model="true", **DELTAS)
      ], env={**env, "MXREC_FAULT": fault}, capture_output=True, text=True, timeout=TIMEOUT_S,
                                check=False)
      assert lib.marked_pids(marker) == []
    finally:
      lib.kill_marked(marker)
    assert launcher.returncode == (1 if fault else 0), launcher.stderr[-3000:]
    if fault:
      assert "local cluster: error: worker 1 exited with status -9 (SIGKILL)" in launcher.stderr, (
          launcher.stderr[-3000:])
    outputs.append(launcher.stdout + (model_dir / "local_cluster" / "worker-1.log").read_text())
  assert outputs[1].count("1 epoch(s) and 3 step(s) done, continuing at epoch 2 of 2") == 2
  for table in TABLES:  # The default routing, `auto`, on two workers.
    assert outputs[1].count(f"table '{table}': sharded over 2 workers, all_to_all routing") == 2
  # Each worker's shard of each table beside the chief's checkpoints (ckpt-1, ckpt-2).
  for number in (1, 2):
    for table in TABLES:
      assert sorted(
          p.name for p in (model_dir / "checkpoints" / f"shards-{number}" /
                           table).glob("*.index")) == ["shard-0-of-2.index", "shard-1-of-2.index"]

  # Epoch 2's shards are deltas on epoch 1's, each worker's of its own shard.
  assert json.loads(
      (model_dir / "checkpoints" / "shards-2" / "chain.json").read_text())["chain"] == [1, 2]

  # One process, the same global batches.
  assert cli.main(["train", CONFIG, "--verbose=0"] +
                  _overrides(tmp_path, data_dir, tmp_path / "run1", strategy="null")) == 0
  capsys.readouterr()
  runs = (model_dir, tmp_path / "run1")
  losses = [lib.epoch_losses(d) for d in runs]
  assert len(losses[0]) == 2  # The epochs of both launches.
  np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
  metrics = [json.loads((d / METRICS_FILE).read_text())["model"] for d in runs]
  assert metrics[0] == pytest.approx(metrics[1], abs=1e-5)
  assert 0.0 < metrics[0]["ndcg@1"] < 1.0  # Validation that can tell models apart.

  # The chief's export holds every shard: the rows of every key, in key order.
  exports = [_export(d) for d in runs]
  for table in TABLES:
    rows = [e.serving_rows[table].numpy() for e in exports]
    assert rows[0].shape == rows[1].shape, table
    assert np.abs(rows[1][:-1]).max() > 0, table  # Trained away from the zero rows.
    np.testing.assert_allclose(rows[0], rows[1], atol=1e-5, err_msg=table)
    # The chief's TensorBoard table sizes sum both workers' shards (at the last global step).
    sizes = [lib.scalars(d, "tables", f"tables/{table}/size")[-1] for d in runs]
    assert sizes == [rows[0].shape[0] - 1] * 2, table
    # The 2 workers' chain (full save, then deltas) holds what one process's full save does.
    with table_checkpoints.full_shards(str(model_dir / "checkpoints"), 2, [table]) as merged:
      saved = [
          checkpoint_lib.read_all_shards(d, table)
          for d in (merged, str(runs[1] / "checkpoints" / "shards-2"))
      ]
    orders = [np.argsort(s["keys"]) for s in saved]
    np.testing.assert_array_equal(*[s["keys"][o] for s, o in zip(saved, orders)], err_msg=table)
    np.testing.assert_allclose(*[s["values"][o] for s, o in zip(saved, orders)], atol=1e-5,
                               err_msg=table)

  # It serves raw ids with plain TF, as `mxrec-pipeline predict` does.
  valid = str(tmp_path / "elwc" / "valid.tfrecord")
  scores = [serving.predict_file(str(d / "export" / "latest_model"), valid) for d in runs]
  assert len(scores[0]) == 16
  np.testing.assert_allclose(np.concatenate(scores[0]), np.concatenate(scores[1]), atol=1e-5)

  # `mxrec-pipeline export` of its checkpoint, in one process, serves as its own export.
  lib.check_export_of_sharded_checkpoint(tmp_path, data_dir, model_dir, collective_timeout_s=60,
                                         **DELTAS)
