"""PS tables' checkpoints re-shard across ps counts; their export serves with plain TF.

One process (one shard) trains 8 steps and saves; a cluster of 1 worker and
2 ps restores it, trains 4 more steps, saving in full after 2 of them
(shard-0-of-2, shard-1-of-2) and a delta of each ps shard after the other 2,
and exports; one process restores that chain. Losses, rows, slots and step
must equal 12 steps of the NumPy lazy Adam, and the export, loaded in a
fresh process with plain TensorFlow, must serve the trained rows (the
default row for an unknown id).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import distributed_testlib as lib
import ps_coordinator
import ps_testlib
import test_distributed_ps_table as ps_test

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SERVE = """
import json, sys
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
ids = tf.constant(json.loads(sys.argv[2]), tf.int64)
print(json.dumps(model.signatures["lookup_item"](ids=ids)["embeddings"].numpy().tolist()))
"""


def test_one_process_to_two_ps_and_back_then_served(tmp_path):
  first, more = 8, 4
  ps_coordinator.main(str(tmp_path / "first.npz"), first, local=True, save=str(tmp_path / "ckpt1"))
  out = ps_testlib.train(1, 2, more, tmp_path / "cluster", [
      "--restore",
      str(tmp_path / "ckpt1"), "--save",
      str(tmp_path / "ckpt2"), "--chain_at", "2", "--delta",
      str(tmp_path / "delta3"), "--export",
      str(tmp_path / "export")
  ])
  losses, rows, _, _, _ = ps_test._reference(first + more)
  np.testing.assert_allclose(out["losses"], losses[first:], rtol=1e-5, atol=1e-6)
  ps_test._check_owners(out)
  for saved in ("ckpt2", "delta3"):
    assert sorted(os.listdir(tmp_path / saved / lib.TABLE)) == sorted(
        f"shard-{i}-of-2.{ext}" for i in range(2) for ext in ("index", "data-00000-of-00001"))
  changed = [
      tf.train.load_variable(str(tmp_path / "delta3" / lib.TABLE / f"shard-{i}-of-2"), "keys")
      for i in range(2)
  ]
  assert 0 < sum(k.size for k in changed) < len(rows)  # The keys of the last 2 steps only.
  ps_coordinator.main(str(tmp_path / "back.npz"), 0, local=True, restore=str(tmp_path / "ckpt2"),
                      restore_delta=str(tmp_path / "delta3"))
  back = dict(np.load(tmp_path / "back.npz"))
  assert int(back["num_shards"]) == 1
  ps_test._check_equals_reference(back, first + more, check_losses=False)
  keys = sorted(rows)[:5]
  served = subprocess.run(
      [sys.executable, "-c", SERVE,
       str(tmp_path / "export"),
       json.dumps([*map(int, keys), 7])], capture_output=True, text=True, timeout=60, check=True,
      env=dict(os.environ, PYTHONPATH=""), cwd=str(tmp_path))
  embeddings = np.array(json.loads(served.stdout.strip().splitlines()[-1]))
  np.testing.assert_allclose(embeddings[:-1], [rows[k] for k in keys], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(embeddings[-1], np.zeros(lib.DIM))
