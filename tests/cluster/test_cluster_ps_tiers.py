"""Tiered tables under ParameterServerStrategy (`train --local-cluster ...,ps=M`, keras/ps.py).

The MovieLens job's user and item tables get a device cache of 8 rows per ps
shard in front of host and SSD tiers of each shard (distributed/ps_tiers.py),
batches of one list (up to 8 distinct movies). Epoch 1 trains with 1 worker
on 2 ps tasks; the job resumes on 1 ps task with 2 asynchronous workers for
epochs 2 and 3 (the shards re-sharded, every tier's rows handed over): no key
is lost, the one shard holds more item keys than its 8 device rows (the host
and SSD tiers hold the rest), epoch 3 saves each tiered shard as a delta on
epoch 2's full save (`full_every_steps` 6), and the run's export and
`mxrec-pipeline export` of that checkpoint serve in a fresh process with
plain TensorFlow.
"""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import cluster_testlib as lib
from mxrec_pipeline.keras import table_checkpoints

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

DEVICE_ROWS = 8


def _tiered(tmp_path) -> dict:
  ssd = tmp_path / "ssd"
  ssd.mkdir(exist_ok=True)
  return {
      "model.id_device_vocabulary_size": DEVICE_ROWS, "model.host_vocabulary_size": 8,
      "model.ssd_vocabulary_size": 8, "model.ssd_data_path": f"[{ssd}]",
      "dataset.train_batch_size": 1
  }


def _overrides(tmp_path, data_dir, model_dir, **pipeline) -> list[str]:
  sets = [a for k, v in _tiered(tmp_path).items() for a in ("--set", f"{k}={v}")]
  return lib.movielens_overrides(tmp_path, data_dir, model_dir, **pipeline) + sets


def _launch(spec: str, tmp_path, data_dir, model_dir, **pipeline) -> str:
  env, marker = lib.marked_env()
  try:
    launcher = subprocess.run([
        sys.executable, "-m", "mxrec_pipeline.cli", "train", lib.MOVIELENS_CONFIG, "--verbose=0",
        "--local-cluster", spec, *_overrides(tmp_path, data_dir, model_dir, **pipeline)
    ], env=env, capture_output=True, text=True, timeout=lib.TIMEOUT_S, check=False)
    assert lib.marked_pids(marker) == []
  finally:
    lib.kill_marked(marker)
  assert launcher.returncode == 0, launcher.stdout[-2000:] + launcher.stderr[-3000:]
  return launcher.stdout


def _shard_keys(model_dir, number: int, table: str) -> list[np.ndarray]:
  shards = sorted((model_dir / "checkpoints" / f"shards-{number}" / table).glob("*.index"))
  return [tf.train.load_variable(str(p).removesuffix(".index"), "keys") for p in shards]


def test_tiered_tables_train_on_ps_reshard_and_export(tmp_path):
  data_dir = lib.write_tiny_movielens(tmp_path / "ml")
  model_dir = tmp_path / "run"
  _launch("workers=1,ps=2", tmp_path, data_dir, model_dir, num_epochs=1, num_train_steps=6)
  out = _launch("workers=2,ps=1", tmp_path, data_dir, model_dir, num_epochs=3, num_train_steps=9,
                **{"checkpoint.full_every_steps": 6})
  assert "continuing at epoch 2 of 3" in out
  # Another ps count starts a chain: ckpt-2 full (step 6), ckpt-3 a delta on it (step 9 < 6 + 6).
  chains = [table_checkpoints.chain(str(model_dir / "checkpoints"), n) for n in (2, 3)]
  assert chains == [[2], [2, 3]]
  for table in ("user", "item"):
    before, after = _shard_keys(model_dir, 1, table), _shard_keys(model_dir, 2, table)
    assert len(before) == 2 and len(after) == 1, table
    assert np.isin(np.concatenate(before), after[0]).all(), table  # no key lost
  assert after[0].size > DEVICE_ROWS  # item keys beyond the device cache: in host/SSD tiers

  export = tf.saved_model.load(str(model_dir / "export" / "latest_model"))
  rows = export.serving_rows["item"].numpy()
  assert rows.shape[0] == after[0].size + 1 and np.abs(rows[:-1]).max() > 0

  # The run's export and `export` of its checkpoint (one process) serve with plain TF.
  exported = tmp_path / "exported"
  done = subprocess.run([
      sys.executable, "-m", "mxrec_pipeline.cli", "export", lib.MOVIELENS_CONFIG, "--out",
      str(exported), *_overrides(tmp_path, data_dir, model_dir, num_epochs=3, num_train_steps=9)
  ], capture_output=True, text=True, timeout=lib.TIMEOUT_S, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  valid = tmp_path / "elwc" / "valid.tfrecord"
  served = [
      lib.serve_in_fresh_process(d, valid, tmp_path / f"served_{i}.npy")
      for i, d in enumerate([model_dir / "export" / "latest_model", exported])
  ]
  assert served[0].shape[0] == 16 and np.isfinite(served[0]).all()
  np.testing.assert_allclose(served[1], served[0], atol=1e-6)
