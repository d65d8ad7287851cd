"""Bad ParameterServerStrategy setups fail with errors naming the task; the launcher runs a PS job.

- A ps/worker server whose cluster has no "ps" job, or that is the chief, exits 2 naming it.
- A coordinator whose ps task is unreachable stops (instead of TF's endless
  connect) naming the task and its address.
- PSShardedTable refuses creation inside strategy.scope() and a Keras optimizer.
- `python -m mxrec_pipeline.cluster.local workers=1,ps=2 -- ps_coordinator.py`
  starts the chief, the worker and ps servers, trains, and stops the servers.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import distributed_testlib as lib
import ps_testlib
from mxrec_pipeline.distributed import ps_table
from mxrec_pipeline.optimizers import lazy_adam


@pytest.mark.parametrize("cluster, task, message", [
    ({"chief": ["localhost:1"], "worker": ["localhost:2"]},
     ("worker", 0), "ps_server: task worker 0: the cluster has no \"ps\" job"),
    ({"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]},
     ("chief", 0), "ps_server: task chief 0 is not a ps or worker task"),
])
def test_server_refuses_a_bad_cluster_naming_the_task(cluster, task, message):
  env = dict(
      os.environ, PYTHONPATH=str(lib.REPO),
      TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": task[0], "index": task[1]}}))
  done = subprocess.run([sys.executable, "-m", "mxrec_pipeline.cluster.ps_server"], env=env,
                        capture_output=True, text=True, timeout=60, check=False)
  assert done.returncode == 2
  assert message in done.stderr


@pytest.mark.cluster
@pytest.mark.slow
def test_unreachable_ps_is_named_by_the_coordinator(tmp_path):
  cluster = ps_testlib.cluster_of(num_workers=1, num_ps=2)
  servers = [
      ps_testlib.start(["-m", "mxrec_pipeline.cluster.ps_server"],
                       ps_testlib.env_of(cluster, job, 0), tmp_path / f"{job}0.log")
      for job in ("ps", "worker")
  ]  # ps 1 never starts.
  try:
    code, log = ps_testlib.run_chief(cluster,
                                     [str(tmp_path / "out.npz"), "2", "--reach_timeout_s", "3"],
                                     tmp_path, 50)
  finally:
    lib.kill_all(servers)
  assert code not in (0, None)
  assert f"chief 0: unreachable after 3 s: ps 1 ({cluster['ps'][1]})" in log


def test_table_refuses_a_strategy_scope_and_a_keras_optimizer():
  with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
    with pytest.raises(ValueError, match=r"PSShardedTable\('t'\): create it outside"):
      ps_table.PSShardedTable(None, name="t", dim=2, device_vocabulary_size=4,
                              optimizer=lazy_adam.create_hash_optimizer())
  with pytest.raises(ValueError, match="must be a row-wise hash optimizer"):
    ps_table.PSShardedTable(None, name="t", dim=2, device_vocabulary_size=4,
                            optimizer=tf.keras.optimizers.Adam())
  with pytest.raises(ValueError, match="needs a ParameterServerStrategy, got MirroredStrategy"):
    ps_table.ps_devices(tf.distribute.MirroredStrategy(["/cpu:0"]))


@pytest.mark.cluster
@pytest.mark.slow
def test_launcher_runs_a_ps_job_and_stops_its_servers(tmp_path):
  env = dict(os.environ,
             PYTHONPATH=os.pathsep.join([str(lib.REPO),
                                         str(ps_testlib.COORDINATOR.parent)]),
             TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
  done = subprocess.run([
      sys.executable, "-m", "mxrec_pipeline.cluster.local", "workers=1,ps=2", "--", sys.executable,
      str(ps_testlib.COORDINATOR),
      str(tmp_path / "out.npz"), "4"
  ], env=env, capture_output=True, text=True, timeout=90, check=False, cwd=str(tmp_path))
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  for task in ("chief 0", "worker 0", "ps 0", "ps 1"):
    assert f"local cluster: {task} (pid " in done.stderr
  out = np.load(tmp_path / "out.npz")
  assert int(out["num_shards"]) == 2 and int(out["step"]) == 4
  assert "ps_server: ps 1 serving at" in (tmp_path / "local_cluster" / "ps-1.log").read_text()
