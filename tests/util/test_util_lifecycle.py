"""The lifecycle's building blocks: the model_dir claim, fault points, manifests, full storage."""

import errno
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from mxrec_pipeline.keras import checkpoints as checkpoints_lib
from mxrec_pipeline.keras import manifest
from mxrec_pipeline.util import faults
from mxrec_pipeline.util import model_dir_lock
from mxrec_pipeline.util import storage


@pytest.fixture
def other_process():
  """A live process that is not this one."""
  process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  yield process.pid
  process.kill()
  process.wait()


def _claim(path, **fields):
  claim = {
      "host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
      "heartbeat": time.time()
  } | fields
  (path / model_dir_lock.LOCK_FILE).write_text(json.dumps(claim))


def test_a_live_claim_refuses_a_second_job_naming_the_holder(tmp_path, other_process):
  _claim(tmp_path, pid=other_process)
  with pytest.raises(
      model_dir_lock.ModelDirInUse,
      match=rf"in use by another job \(host {socket.gethostname()}, pid "
      rf"{other_process}, heartbeat \d+ s ago"):
    model_dir_lock.ModelDirLock(str(tmp_path)).acquire()
  assert json.loads((tmp_path / model_dir_lock.LOCK_FILE).read_text())["pid"] == other_process


def test_the_claim_of_a_dead_process_or_a_stale_heartbeat_is_taken_over(tmp_path, capsys):
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  _claim(tmp_path, pid=int(dead.stdout))
  with model_dir_lock.ModelDirLock(str(tmp_path)) as lock:
    assert lock.holder()["pid"] == os.getpid()
  assert "taking over the claim of a job that is gone" in capsys.readouterr().out
  assert not (tmp_path / model_dir_lock.LOCK_FILE).exists()  # Released.
  # Another host's claim: judged by its heartbeat only.
  _claim(tmp_path, host="elsewhere", pid=1, heartbeat=time.time() - 5)
  with pytest.raises(model_dir_lock.ModelDirInUse, match="host elsewhere, pid 1"):
    model_dir_lock.ModelDirLock(str(tmp_path), stale_after_s=60).acquire()
  with model_dir_lock.ModelDirLock(str(tmp_path), heartbeat_s=1, stale_after_s=2) as lock:
    assert lock.holder()["host"] == socket.gethostname()


# Waits for a start time, then tries to claim the model_dir; prints "RESULT won" or
# "RESULT in use", then
# holds a win until told to stop (a file), so that the others see a live claim.
_CONTENDER = """
import os, sys, time
from mxrec_pipeline.util import model_dir_lock
model_dir, start, stop = sys.argv[1], float(sys.argv[2]), sys.argv[3]
time.sleep(max(0.0, start - time.time()))
try:
  lock = model_dir_lock.ModelDirLock(model_dir, heartbeat_s=0.05, stale_after_s=30).acquire()
except model_dir_lock.ModelDirInUse:
  print("RESULT in use", flush=True)
  sys.exit(0)
print("RESULT won", flush=True)
while not os.path.exists(stop):
  time.sleep(0.05)
lock.release()
"""


def test_jobs_taking_over_a_dead_claim_at_once_leave_one_owner(tmp_path):
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  stop = tmp_path / "stop"
  for attempt in range(2):  # Rounds of 6 contenders, all released between rounds.
    _claim(tmp_path, pid=int(dead.stdout), heartbeat=time.time() - 120)
    start = time.time() + 3.0  # After every contender imported the module.
    contenders = [
        subprocess.Popen(
            [sys.executable, "-c", _CONTENDER,
             str(tmp_path), str(start),
             str(stop)], stdout=subprocess.PIPE, text=True) for _ in range(6)
    ]
    try:
      lines = []
      for process in contenders:  # (Takeover messages come before the result.)
        lines.append(next(line for line in process.stdout if line.startswith("RESULT"))[7:].strip())
      assert sorted(lines) == ["in use"] * 5 + ["won"], (attempt, lines)
      winner = contenders[lines.index("won")].pid
      assert json.loads((tmp_path / model_dir_lock.LOCK_FILE).read_text())["pid"] == winner
    finally:
      stop.touch()
      for process in contenders:
        process.wait(timeout=30)
      stop.unlink()
    assert not (tmp_path / model_dir_lock.LOCK_FILE).exists()


def test_a_takeover_in_progress_refuses_and_one_left_by_a_killed_job_expires(tmp_path, capsys):
  _claim(tmp_path, host="elsewhere", pid=1, heartbeat=time.time() - 120)  # Dead.
  mutex = tmp_path / (model_dir_lock.LOCK_FILE + ".takeover")
  mutex.write_text("{}")
  with pytest.raises(model_dir_lock.ModelDirInUse, match="another job is taking over the claim"):
    model_dir_lock.ModelDirLock(str(tmp_path), stale_after_s=60).acquire()
  assert json.loads((tmp_path / model_dir_lock.LOCK_FILE).read_text())["host"] == "elsewhere"
  os.utime(mutex, (time.time() - 120, time.time() - 120))  # Its job was killed mid-takeover.
  with model_dir_lock.ModelDirLock(str(tmp_path), stale_after_s=60) as lock:
    assert lock.holder()["pid"] == os.getpid() and not mutex.exists()
  assert "taking over the claim of a job that is gone (host elsewhere, pid 1)" in (
      capsys.readouterr().out)


def test_a_job_whose_claim_was_taken_over_stops_its_heartbeat(tmp_path, capsys):
  lock = model_dir_lock.ModelDirLock(str(tmp_path), heartbeat_s=0.05, stale_after_s=1).acquire()
  _claim(tmp_path, host="elsewhere", pid=7)  # Judged dead while it was stopped, taken over.
  time.sleep(0.3)
  assert json.loads((tmp_path / model_dir_lock.LOCK_FILE).read_text())["pid"] == 7
  lock.release()  # Leaves the other job's claim.
  assert json.loads((tmp_path / model_dir_lock.LOCK_FILE).read_text())["pid"] == 7
  assert "the claim of this job was taken over by host elsewhere, pid 7" in capsys.readouterr().err


def test_the_heartbeat_keeps_the_claim_fresh_and_one_process_shares_it(tmp_path):
  with model_dir_lock.ModelDirLock(str(tmp_path), heartbeat_s=0.05, stale_after_s=1) as lock:
    first = lock.holder()["heartbeat"]
    time.sleep(0.3)
    assert lock.holder()["heartbeat"] > first
    with model_dir_lock.ModelDirLock(str(tmp_path)):  # The same process: shared.
      pass
    assert lock.holder()["pid"] == os.getpid()  # The inner one did not remove it.
  assert not (tmp_path / model_dir_lock.LOCK_FILE).exists()
  with pytest.raises(ValueError, match="heartbeat_s"):
    model_dir_lock.ModelDirLock(str(tmp_path), heartbeat_s=5, stale_after_s=5)


def test_fault_specs_are_checked_and_count_per_point():
  assert faults.parse("export") == ("export", 1)
  assert faults.parse("train_batch:7") == ("train_batch", 7)
  for bad in ("nowhere", "export:0", "export:x", "train_batch:-1"):
    with pytest.raises(ValueError, match=faults.ENV):
      faults.parse(bad)
  points = faults.FaultPoints()
  for _ in range(3):
    points.reach("train_batch")  # Never kills without a spec.
  with pytest.raises(ValueError, match="unknown fault point 'typo'"):
    points.reach("typo")
  with pytest.raises(ValueError, match="unknown fault point"):
    faults.FaultPoints("nowhere@worker:1", "worker:1")
  faults.FaultPoints("export@worker:1", "worker:0").reach("export")  # Another task's fault.


def test_a_fault_point_kills_the_process_the_nth_time_only():
  code = ("from mxrec_pipeline.util import faults\n"
          "p = faults.FaultPoints.from_environment()\n"
          "for i in range(5):\n"
          "  p.reach('validation'); p.reach('train_batch'); print(i, flush=True)\n")
  tf_config = '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": %d}}'
  for spec, task, lines in (("train_batch:3", None, 2), ("train_batch:3@worker:1", 1, 2),
                            ("train_batch:3@worker:1", 0, 5)):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"} | {faults.ENV: spec}
    if task is not None:
      env["TF_CONFIG"] = tf_config % task
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env=env)
    assert done.stdout.split()[:lines] == [str(i) for i in range(lines)], spec
    if lines == 2:
      assert done.returncode == -9
      assert done.stdout.split()[2:] == [
          "MXREC_FAULT:", "killing", "the", "process", "at", "train_batch:3"
      ]
    else:
      assert done.returncode == 0, done.stderr


def _save(directory, number, value=1.0):
  checkpoint = tf.train.Checkpoint(v=tf.Variable([value] * 64), best_metric=tf.Variable(0.0))
  return checkpoint.write(os.path.join(directory, f"ckpt-{number}"))


def test_manifest_vouches_for_sizes_and_format(tmp_path):
  prefix = _save(str(tmp_path), 1)
  assert "manifest" in manifest.problem(prefix) and "missing" in manifest.problem(prefix)
  manifest.write(prefix, {"tables": {"t": {"dim": 4}}})
  assert manifest.problem(prefix) is None
  assert manifest.read(prefix)["run"] == {"tables": {"t": {"dim": 4}}}
  data = tf.io.gfile.glob(prefix + ".data-*")[0]
  size = os.path.getsize(data)
  with open(data, "r+b") as f:
    f.truncate(size - 1)
  assert manifest.problem(prefix) == f"{data} holds {size - 1} bytes, {size} were written"
  os.remove(data)
  assert manifest.problem(prefix) == f"{data} is missing"
  record = json.loads(open(manifest.path(prefix), encoding="utf-8").read())
  record["format"] = manifest.FORMAT + 1
  open(manifest.path(prefix), "w", encoding="utf-8").write(json.dumps(record))
  assert f"format {manifest.FORMAT + 1}" in manifest.problem(prefix)
  open(manifest.path(prefix), "w", encoding="utf-8").write("{torn")
  assert "is unreadable" in manifest.problem(prefix)


def test_restorable_checkpoint_takes_the_newest_complete_one(tmp_path):
  directory = str(tmp_path)
  legacy = tf.train.Checkpoint(v=tf.Variable([1.0])).write(os.path.join(directory, "ckpt-1"))
  assert checkpoints_lib.restorable_checkpoint(directory) == (legacy, True, [])
  second = _save(directory, 2)
  manifest.write(second, {})
  third = _save(directory, 3)  # Killed before its manifest.
  latest, is_legacy, skipped = checkpoints_lib.restorable_checkpoint(directory)
  assert (latest, is_legacy) == (second, False)
  assert skipped == [(third, f"its manifest {third}.manifest.json is missing (the save did not "
                      "finish)")]


def test_manifest_differences_name_tables_and_fields():
  before = {"tables": {"user": {"dim": 16, "key_dtype": "int64"}, "old": {"dim": 4}}}
  now = {"tables": {"user": {"dim": 32, "key_dtype": "int64"}, "new": {"dim": 4}}}
  assert manifest.differences(before, now) == [
      "table 'old' is not in this config", "table 'new' is new in this config",
      "table 'user' dim 16 -> 32"
  ]
  assert manifest.differences(before, before) == []


def test_full_storage_becomes_one_line_naming_the_path():
  with pytest.raises(
      storage.StorageFullError,
      match=r"cannot write checkpoint ckpt-2 to /d: No space left on device; "
      r"ckpt-1 is intact; free space"):
    with storage.full_storage_named("checkpoint ckpt-2", "/d", "ckpt-1 is intact"):
      raise OSError(errno.ENOSPC, "No space left on device")
  with pytest.raises(storage.StorageFullError, match="File too large"):
    with storage.full_storage_named("x", "/d", "y"):
      raise tf.errors.UnknownError(None, None, "/d/f; File too large")
  with pytest.raises(PermissionError):  # Not a full disk: unchanged.
    with storage.full_storage_named("x", "/d", "y"):
      raise PermissionError(errno.EACCES, "denied")
