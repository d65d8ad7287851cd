"""Failures of a 2-worker job end it with a clear error instead of a hang.

A table config that differs between workers is refused on every worker,
naming the table and the field; a worker that crashes, or stops answering,
makes the other fail (at the latest after the collective timeout given to
MultiWorkerMirroredStrategy's CommunicationOptions) rather than hang.
"""

import json

import pytest

import distributed_testlib as lib

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# Far below the stalled worker's 600 s: the survivor must end by the timeout.
DEADLINE_S = 45


def _args(tmp_path, i, *extra):
  return ["--out", str(tmp_path / f"out{i}.npz"), "--steps", "4", "--timeout_s", "5", *extra]


def _error(tmp_path, i):
  return json.loads((tmp_path / f"out{i}.npz.error.json").read_text())


def test_mismatched_table_config_refused_naming_the_table(tmp_path):
  args = [_args(tmp_path, 0), _args(tmp_path, 1, "--dim", "8")]
  codes, _ = lib.run_workers(2, args, tmp_path, deadline_s=DEADLINE_S)
  assert codes == [1, 1]
  for i in range(2):
    error = _error(tmp_path, i)
    assert error["type"] == "ValueError"
    assert "ShardedTable('item'): the workers disagree on `dim`: [4, 8]" in error["message"]


def _survivor_error(tmp_path, failing_flag, routing="all_gather"):
  """The surviving worker 0's error: its error.json, or its log's last lines.

  The survivor must end before DEADLINE_S. It normally exits 1 having written
  the error it caught. TF 2.15 may instead crash (a signal, seen once in CI as
  SIGSEGV) while it aborts the other in-flight collectives, after it has
  logged the error; the job still ends, with the error in the log, so a crash
  is accepted and its log returned as the message.
  """
  route = ["--routing", routing]
  processes = lib.start_cluster(
      2, [_args(tmp_path, 0, *route),
          _args(tmp_path, 1, failing_flag, "2", *route)], tmp_path)
  try:
    code = lib.wait_all(processes[:1], DEADLINE_S)[0]
  finally:
    lib.kill_all(processes)
  log = (tmp_path / "worker0.log").read_text(errors="replace")
  if code is not None and code < 0:  # Killed by a signal: TF's abort path crashed.
    return {"type": None, "message": log}
  assert code == 1, log[-3000:]
  return _error(tmp_path, 0)


def test_crashed_worker_ends_the_job_naming_it(tmp_path):
  error = _survivor_error(tmp_path, "--die_at_step")
  assert error["type"] in ("UnavailableError", "AbortedError", "CancelledError", None), error
  assert "task:1" in error["message"], error


@pytest.mark.parametrize("routing", ["all_gather", "all_to_all"])
def test_silent_worker_ends_the_job_at_the_collective_timeout(tmp_path, routing):
  error = _survivor_error(tmp_path, "--stall_at_step", routing)
  assert error["type"] in ("DeadlineExceededError", None), error
  assert "Collective has timed out" in error["message"], error
