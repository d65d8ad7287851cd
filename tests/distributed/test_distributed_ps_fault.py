"""Lost tasks: a worker SIGKILLed and restarted is survived; a lost ps ends the job naming it.

ClusterCoordinator retries the closure the dead worker was running on the
other worker and reconnects the restarted one (TF's PS fault tolerance). The
retried step may have applied its update once already before the worker
died, so the step count is the scheduled steps or one more.
"""

import time

import numpy as np
import pytest

import distributed_testlib as lib
import ps_testlib
import test_distributed_ps_table as ps_test

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS = 1500  # About 10 s of training here: time to kill and restart a worker.


def _wait_for(path, text, deadline_s, process):
  end = time.monotonic() + deadline_s
  while text not in path.read_text(errors="replace"):
    assert process.poll() is None, path.read_text(errors="replace")[-3000:]
    assert time.monotonic() < end, f"no {text!r} in {path} after {deadline_s} s"
    time.sleep(0.2)


def test_killed_and_restarted_worker_is_survived(tmp_path):
  cluster = ps_testlib.cluster_of(num_workers=2, num_ps=2)
  servers = ps_testlib.start_servers(cluster, tmp_path)  # ps 0, ps 1, worker 0, worker 1.
  chief = ps_testlib.start([str(ps_testlib.COORDINATOR),
                            str(tmp_path / "out.npz"),
                            str(STEPS)], ps_testlib.env_of(cluster, "chief", 0),
                           tmp_path / "chief.log")
  try:
    _wait_for(tmp_path / "chief.log", "ps_coordinator: training", 40, chief)
    time.sleep(1.5)
    servers[3].kill()
    servers[3].wait(timeout=30)
    killed_during_training = "ps_coordinator: 1500 steps" not in (tmp_path /
                                                                  "chief.log").read_text()
    servers.append(
        ps_testlib.start(["-m", "mxrec_pipeline.cluster.ps_server"],
                         ps_testlib.env_of(cluster, "worker", 1), tmp_path / "worker1-again.log"))
    code = lib.wait_all([chief], 50)[0]
  finally:
    lib.kill_all([chief, *servers])
  log = (tmp_path / "chief.log").read_text(errors="replace")
  assert code == 0, log[-3000:]
  assert killed_during_training
  assert "Worker /job:worker/replica:0/task:1 failed" in log
  out = np.load(tmp_path / "out.npz")
  assert len(out["losses"]) == STEPS and np.isfinite(out["losses"]).all()
  assert STEPS <= int(out["step"]) <= STEPS + 1
  ps_test._check_owners(out)


def test_lost_ps_ends_the_job_naming_it(tmp_path):
  cluster = ps_testlib.cluster_of(num_workers=1, num_ps=2)
  servers = ps_testlib.start_servers(cluster, tmp_path)  # ps 0, ps 1, worker 0.
  chief = ps_testlib.start([str(ps_testlib.COORDINATOR),
                            str(tmp_path / "out.npz"),
                            str(STEPS)], ps_testlib.env_of(cluster, "chief", 0),
                           tmp_path / "chief.log")
  try:
    _wait_for(tmp_path / "chief.log", "ps_coordinator: training", 40, chief)
    time.sleep(1.0)
    servers[1].kill()
    code = lib.wait_all([chief], 40)[0]
  finally:
    lib.kill_all([chief, *servers])
  log = (tmp_path / "chief.log").read_text(errors="replace")
  assert code not in (0, None), log[-3000:]
  assert "PeerError: chief 0: lost ps 1 (UnavailableError)" in log, log[-3000:]
