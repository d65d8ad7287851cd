"""Export from 2 workers: the chief builds one stock-TF snapshot of the staged shards.

It is served in a fresh process that imports only TensorFlow (no custom-op library, no
mxrec_pipeline): every trained key reads its row from the shard that trained
it, an unseen key reads the default (zero) row.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

import distributed_testlib as lib

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
export_dir, keys = sys.argv[1], json.loads(sys.argv[2])
loaded = tf.saved_model.load(export_dir)
out = loaded.signatures["lookup_item"](ids=tf.constant(keys, tf.int64))["embeddings"]
assert not any(m.startswith("mxrec_pipeline") for m in sys.modules), "served with the project"
np.save(sys.argv[3], out.numpy())
"""


def test_export_from_two_workers_serves_with_plain_tf(tmp_path):
  export_dir = tmp_path / "export"
  args = [["--steps", "3", "--out",
           str(tmp_path / f"out{i}.npz"), "--export",
           str(export_dir)] for i in range(2)]
  lib.run_cluster(2, args, tmp_path)
  assert not (tmp_path / "export.staging").exists()  # The chief removed the staged shards.
  trained = {}
  for i in range(2):
    out = np.load(tmp_path / f"out{i}.npz")
    trained.update(lib.by_key(out["keys"], out["rows"]))
  unseen = 123  # Not an id of lib.batch.
  assert unseen not in trained
  keys = sorted(trained) + [unseen]
  served = tmp_path / "served.npy"
  subprocess.run(
      [sys.executable, "-c", SERVE,
       str(export_dir), json.dumps(keys),
       str(served)], check=True, timeout=50, cwd=tmp_path,
      env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": ""})
  rows = np.load(served)
  np.testing.assert_array_equal(rows[:-1], np.stack([trained[k] for k in keys[:-1]]))
  np.testing.assert_array_equal(rows[-1], np.zeros(lib.DIM))
