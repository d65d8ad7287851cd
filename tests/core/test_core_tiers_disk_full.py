"""A full SSD disk stops training naming the table and directory; the checkpoint stays loadable.

The disk is "full" through RLIMIT_FSIZE in a child process: writes past the
limit fail with EFBIG (SIGXFSZ ignored), as the store treats ENOSPC.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

# Trains in a subprocess until a small disk is full.
pytestmark = pytest.mark.slow

_CHILD = r"""
import json, resource, signal, sys
import numpy as np
import tensorflow as tf
from mxrec_pipeline.core import initializers
from mxrec_pipeline.core.embedding import create_table, sparse_lookup
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util.initialize import init

ssd_dirs, ckpt_dir = sys.argv[1].split(","), sys.argv[2]
init()
optimizer = lazy_adam.create_hash_optimizer(0.05)
table = create_table(tf.int64, 64, "big", initializers.RowInitializer(seed=3),
                     device_vocabulary_size=64, host_vocabulary_size=64,
                     ssd_vocabulary_size=100000, ssd_data_path=ssd_dirs, optimizer_list=[optimizer])
checkpoint = tf.train.Checkpoint(table=table, optimizer=optimizer)

def train(ids):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.square(sparse_lookup(table, tf.constant(ids, tf.int64))))
  optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])

for step in range(6):  # 192 keys: 64 on the device, 64 on the host, 64 on SSD
  train(np.arange(step * 32, step * 32 + 32))
saved = checkpoint.write(ckpt_dir + "/ckpt")
keys = np.arange(192, dtype=np.int64)
expected = sparse_lookup(table, tf.constant(keys), is_train=False).numpy()
# Each SSD record is 64 * 3 * 4 = 768 bytes: the limit leaves room for ~40 per file.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (32768, resource.RLIM_INFINITY))
error = None
try:
  for step in range(6, 200):
    train(np.arange(step * 32, step * 32 + 32))
except tf.errors.OpError as e:
  error = f"{type(e).__name__}: {e.message}"
print(json.dumps({"error": error, "saved": saved, "expected": expected.tolist()}))
"""

_RESTORE = r"""
import json, sys
import numpy as np
import tensorflow as tf
from mxrec_pipeline.core import initializers
from mxrec_pipeline.core.embedding import create_table, sparse_lookup
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util.initialize import init

init()
optimizer = lazy_adam.create_hash_optimizer(0.05)
table = create_table(tf.int64, 64, "big", initializers.RowInitializer(seed=3),
                     device_vocabulary_size=64, host_vocabulary_size=64,
                     ssd_vocabulary_size=100000, ssd_data_path=[sys.argv[2]],
                     optimizer_list=[optimizer])
tf.train.Checkpoint(table=table, optimizer=optimizer).read(sys.argv[1]).assert_consumed()
keys = np.arange(192, dtype=np.int64)
print(json.dumps(sparse_lookup(table, tf.constant(keys), is_train=False).numpy().tolist()))
"""


def _run(script, *args):
  out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_full_disks_stop_training_naming_table_and_paths_and_checkpoint_stays_loadable(tmp_path):
  ssd = [tmp_path / "ssd0", tmp_path / "ssd1"]
  for d in ssd:
    d.mkdir()
  (tmp_path / "ckpt").mkdir()
  result = _run(_CHILD, ",".join(str(d) for d in ssd), str(tmp_path / "ckpt"))
  error = result["error"]
  assert error is not None and error.startswith("ResourceExhaustedError")
  # Both directories were used in order, then the error names them and the table.
  assert "'big'" in error and str(ssd[0]) in error and str(ssd[1]) in error, error
  restored = _run(_RESTORE, result["saved"], str(tmp_path))
  np.testing.assert_allclose(restored, result["expected"], rtol=1e-6)
