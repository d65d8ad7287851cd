"""MovieLens through model.fit under ParameterServerStrategy (`train --local-cluster ...,ps=M`).

The Keras pipeline's tables sharded by key over 2 ps tasks (keras/ps.py over
distributed.PSShardedTable), against one process: with 1 worker the steps run
in schedule order, so per-epoch losses, validation metrics and every table's
rows by key in the export equal one process's, also across a stop after
epoch 1 on 2 ps tasks and a resume on 1 (the shards re-sharded, no key lost).
With 2 workers training is asynchronous: metrics close to one process's, and
the export serves in a fresh process with plain TensorFlow, as does
`mxrec-pipeline export` of the run's checkpoint (one process, no cluster).
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
from mxrec_pipeline.evaluation import METRICS_FILE

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CONFIG = lib.MOVIELENS_CONFIG
TIMEOUT_S = lib.TIMEOUT_S
TABLES = lib.MOVIELENS_TABLES


def _launch(spec: str, tmp_path, data_dir, model_dir, **pipeline) -> str:
  """Runs `train --local-cluster SPEC` to its end; returns the chief's output."""
  env, marker = lib.marked_env()
  try:
    launcher = subprocess.run([
        sys.executable, "-m", "mxrec_pipeline.cli", "train", CONFIG, "--verbose=0",
        "--local-cluster", spec, *lib.movielens_overrides(tmp_path, data_dir, model_dir, **pipeline)
    ], env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert lib.marked_pids(marker) == []
  finally:
    lib.kill_marked(marker)
  assert launcher.returncode == 0, launcher.stdout[-2000:] + launcher.stderr[-3000:]
  return launcher.stdout


def _serving_rows(model_dir: pathlib.Path) -> dict[str, np.ndarray]:
  export = tf.saved_model.load(str(model_dir / "export" / "latest_model"))
  return {table: export.serving_rows[table].numpy() for table in TABLES}


def _shard_keys(model_dir: pathlib.Path, number: int, table: str) -> np.ndarray:
  """Every key of `table` in checkpoint `number`'s per-ps bundles, sorted."""
  keys = [
      tf.train.load_variable(str(prefix).removesuffix(".index"), "keys")
      for prefix in (model_dir / "checkpoints" / f"shards-{number}" / table).glob("*.index")
  ]
  return np.sort(np.concatenate(keys))


@pytest.fixture(name="movielens", scope="module")
def _movielens(tmp_path_factory):
  """(tmp dir, data dir, model_dir of the one-process run on it)."""
  tmp_path = tmp_path_factory.mktemp("ps")
  data_dir = lib.write_tiny_movielens(tmp_path / "ml")
  run1 = tmp_path / "run1"
  assert cli.main(["train", CONFIG, "--verbose=0"] +
                  lib.movielens_overrides(tmp_path, data_dir, run1, strategy="null")) == 0
  return tmp_path, data_dir, run1


def test_one_worker_trains_and_resumes_on_another_ps_count_as_one_process(movielens):
  tmp_path, data_dir, run1 = movielens
  model_dir = tmp_path / "run_ps"
  # Epoch 1 of 2 on 2 ps tasks, then the same job on 1: it resumes from the per-ps shards.
  _launch("workers=1,ps=2", tmp_path, data_dir, model_dir, num_epochs=1, num_train_steps=3)
  out = _launch("workers=1,ps=1", tmp_path, data_dir, model_dir)
  assert "1 epoch(s) and 3 step(s) done, continuing at epoch 2 of 2" in out
  for number, names in ((1, ["shard-0-of-2.index",
                             "shard-1-of-2.index"]), (2, ["shard-0-of-1.index"])):
    for table in TABLES:
      shards = model_dir / "checkpoints" / f"shards-{number}" / table
      assert sorted(p.name for p in shards.glob("*.index")) == names, table
  for table in TABLES:  # No key lost in the re-shard.
    assert np.isin(_shard_keys(model_dir, 1, table), _shard_keys(model_dir, 2, table)).all()

  losses = [lib.epoch_losses(d) for d in (model_dir, run1)]
  assert len(losses[0]) == 2
  np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
  metrics = [json.loads((d / METRICS_FILE).read_text())["model"] for d in (model_dir, run1)]
  assert metrics[0] == pytest.approx(metrics[1], abs=1e-5)
  assert 0.0 < metrics[0]["ndcg@1"] < 1.0  # Validation that can tell models apart.
  rows = [_serving_rows(d) for d in (model_dir, run1)]
  for table in TABLES:  # The export gathered every shard: each key's row, in key order.
    assert rows[0][table].shape == rows[1][table].shape, table
    assert np.abs(rows[1][table][:-1]).max() > 0, table  # Trained away from the zero rows.
    np.testing.assert_allclose(rows[0][table], rows[1][table], atol=1e-5, err_msg=table)


def test_two_workers_train_asynchronously_and_the_export_serves_with_plain_tf(movielens):
  tmp_path, data_dir, run1 = movielens
  model_dir = tmp_path / "run_ps2"
  _launch("workers=2,ps=2", tmp_path, data_dir, model_dir)
  # Asynchronous steps: other updates than one process's, the same kind of model.
  metrics = [json.loads((d / METRICS_FILE).read_text())["model"] for d in (model_dir, run1)]
  assert metrics[0]["ndcg@10"] == pytest.approx(metrics[1]["ndcg@10"], abs=0.1)
  rows = _serving_rows(model_dir)
  for table in TABLES:
    assert np.abs(rows[table][:-1]).max() > 0, table

  # It serves with plain TF, as does `mxrec-pipeline export` of its checkpoint, in one process.
  lib.check_export_of_sharded_checkpoint(tmp_path, data_dir, model_dir)
