"""MovieLens through model.fit under ParameterServerStrategy (`train --local-cluster ...,ps=M`).

The Keras pipeline's tables sharded by key over 2 ps tasks (keras/ps.py over
distributed.PSShardedTable), against one process: with 1 worker the steps run
in schedule order, so per-epoch losses, validation metrics and every table's
rows by key in the export equal one process's, also across a stop after
epoch 1 on 2 ps tasks and a resume on 1 (the shards re-sharded, no key lost)
with a sidecar evaluator validating the checkpoints instead of the chief.
With 2 workers training is asynchronous: metrics close to one process's, and
the export serves in a fresh process with plain TensorFlow, as does
`mxrec-pipeline export` of the run's checkpoint (one process, no cluster).
"""

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import cluster_testlib as lib
from mxrec_pipeline import cli
from mxrec_pipeline import config as config_lib
from mxrec_pipeline import sidecar
from mxrec_pipeline.evaluation import METRICS_FILE
from mxrec_pipeline.util import initialize

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
  # Resumed with a sidecar evaluator: it validates the checkpoints, the chief none.
  out = _launch("workers=1,ps=1,evaluator=1", tmp_path, data_dir, model_dir,
                export_best_model="true")
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
  # The evaluator's last checkpoint is the chief's final model; each it validated (ckpt-1
  # too unless ckpt-2 came first) scores as the one-process run's validation of that epoch.
  records = sidecar.read_log(str(model_dir))
  assert records[-1]["checkpoint"] == 2 and records[-1]["metrics"] == pytest.approx(
      metrics[0], abs=1e-5)
  for record in records:
    assert lib.scalars(run1, "validation", "epoch_ndcg_10")[record["checkpoint"] - 1] == \
        pytest.approx(record["metrics"]["ndcg@10"], abs=1e-5)
  assert records[0]["best"] and (model_dir / "export" / "best_model_by_metric").is_dir()
  assert "sidecar evaluator: validated" in (model_dir / "local_cluster" /
                                            "evaluator-0.log").read_text()
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


def test_sidecar_evaluator_scores_the_newest_checkpoint_as_the_run_validated_it(
    movielens, monkeypatch):
  tmp_path, data_dir, run1 = movielens
  model_dir = tmp_path / "run1_evaluated"
  shutil.copytree(run1, model_dir)  # Times kept: its checkpoints predate the evaluator.
  config = config_lib.load(
      CONFIG,
      lib.movielens_overrides(tmp_path, data_dir, model_dir, strategy="null",
                              export_best_model="true")[1::2])
  lines = []

  class Waited(Exception):
    pass

  def wait(_):
    raise Waited

  # Beside a `--fresh` chief, checkpoints older than the evaluator are an earlier run's: it waits.
  monkeypatch.setattr(sidecar.time, "sleep", wait)
  with pytest.raises(Waited):
    sidecar.evaluate_checkpoints(config, fresh=True, log=lines.append)
  assert not lines and not (model_dir / sidecar.VALIDATION_LOG).exists()
  monkeypatch.undo()

  records = sidecar.evaluate_checkpoints(config, poll_s=0.01, log=lines.append)

  # ckpt-2 is the newest when it starts: ckpt-1 is skipped, as SidecarEvaluator does.
  assert [r["checkpoint"] for r in records] == [2] and records[0]["best"]
  final = json.loads((run1 / METRICS_FILE).read_text())["model"]
  assert records[0]["metrics"] == pytest.approx(final, abs=1e-5)
  for key, value in records[0]["metrics"].items():  # Keras' validation of epoch 2, the same.
    tag = "epoch_" + key.replace("@", "_")
    assert lib.scalars(run1, "validation", tag)[-1] == pytest.approx(value, abs=1e-5), key
  assert (model_dir / "export" / "best_model_by_metric" / "saved_model.pb").exists()
  assert sidecar.read_log(str(model_dir)) == records
  assert "ckpt-2" in lines[0] and "(best, exported)" in lines[0]
  # Restarted: checkpoint 2 is recorded, so nothing is left to validate.
  assert sidecar.evaluate_checkpoints(config, poll_s=0.01, log=lines.append) == []
  initialize.terminate_config_initializer()
