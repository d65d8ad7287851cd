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


def _kill_during_training(tmp_path, num_workers, victim, restart=False):
  """Trains STEPS on chief + workers + 2 ps, SIGKILLs `victim` (job, index) mid-training.

  With `restart`, starts the victim again with its TF_CONFIG (as a cluster
  manager restarts a pod). Returns (chief's exit code, its log, whether the
  kill came before the training ended).
  """
  cluster = ps_testlib.cluster_of(num_workers=num_workers, num_ps=2)
  servers = ps_testlib.start_servers(cluster, tmp_path)  # ps 0, ps 1, then the workers.
  chief = ps_testlib.start([str(ps_testlib.COORDINATOR),
                            str(tmp_path / "out.npz"),
                            str(STEPS)], ps_testlib.env_of(cluster, "chief", 0),
                           tmp_path / "chief.log")
  victim_process = servers[victim[1] + (2 if victim[0] == "worker" else 0)]
  try:
    _wait_for(tmp_path / "chief.log", "ps_coordinator: training", 40, chief)
    time.sleep(1.5)
    victim_process.kill()
    victim_process.wait(timeout=30)
    during = f"ps_coordinator: {STEPS} steps" not in (tmp_path / "chief.log").read_text()
    if restart:
      servers.append(
          ps_testlib.start(["-m", "mxrec_pipeline.cluster.ps_server"],
                           ps_testlib.env_of(cluster, *victim), tmp_path / "restarted.log"))
    code = lib.wait_all([chief], 50)[0]
  finally:
    lib.kill_all([chief, *servers])
  return code, (tmp_path / "chief.log").read_text(errors="replace"), during


def test_killed_and_restarted_worker_is_survived(tmp_path):
  code, log, during = _kill_during_training(tmp_path, 2, ("worker", 1), restart=True)
  assert code == 0, log[-3000:]
  assert during
  assert "Worker /job:worker/replica:0/task:1 failed" in log
  out = np.load(tmp_path / "out.npz")
  assert len(out["losses"]) == STEPS and np.isfinite(out["losses"]).all()
  assert STEPS <= int(out["step"]) <= STEPS + 1
  ps_test._check_owners(out)


def test_lost_ps_ends_the_job_naming_it(tmp_path):
  code, log, during = _kill_during_training(tmp_path, 1, ("ps", 1))
  assert during
  assert code not in (0, None), log[-3000:]
  assert "PeerError: chief 0: lost ps 1 (UnavailableError)" in log, log[-3000:]
