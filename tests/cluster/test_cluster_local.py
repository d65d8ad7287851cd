"""The local-cluster launcher (mxrec_pipeline/cluster/local.py) on small Python commands.

The tasks here are `python -c` one-liners, not trainings: what is tested is
the launcher (TF_CONFIG per task, output routing, exit statuses, stopping
every process). tests/cluster/test_cluster_training.py runs real trainings.
"""

import io
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

import cluster_testlib as lib
from mxrec_pipeline.cluster import local
from mxrec_pipeline.cluster import tf_config

REPO = pathlib.Path(__file__).resolve().parents[2]

# Prints the task's TF_CONFIG, then does what its task index says.
TASK = """
import os, json, signal, sys, time
config = json.loads(os.environ["TF_CONFIG"])
print("TF_CONFIG", json.dumps(config), flush=True)
print("TMPDIR", os.environ.get("TMPDIR"), flush=True)
action = sys.argv[1 + config["task"]["index"]]
if action == "ignore_term":
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  print("ignoring SIGTERM", flush=True)
if action in ("forever", "ignore_term"):
  while True:
    time.sleep(1)
sys.exit(int(action))
"""


def _run(tmp_path, actions, grace_s=local.DEFAULT_GRACE_S):
  env, marker = lib.marked_env()
  out = io.StringIO()
  try:
    spec = local.LocalClusterSpec(workers=len(actions))
    status = local.run(lambda task: [sys.executable, "-c", TASK, *actions], spec,
                       str(tmp_path / "logs"), env=env, grace_s=grace_s, out=out)
    assert lib.marked_pids(marker) == []  # Every process it started is gone.
  finally:
    lib.kill_marked(marker)
  return status, out.getvalue()


@pytest.mark.parametrize("text, spec", [
    ("workers=2", local.LocalClusterSpec(2)),
    (" workers = 3 ", local.LocalClusterSpec(3)),
    ("workers=1,ps=0", local.LocalClusterSpec(1, 0)),
    ("workers=2,ps=1", local.LocalClusterSpec(2, 1)),
])
def test_parse_spec(text, spec):
  assert local.parse_spec(text) == spec


@pytest.mark.parametrize("text, message", [
    ("", "expected workers=N"),
    ("workers", "expected workers=N"),
    ("chiefs=1", "expected workers=N"),
    ("workers=two", "`workers` must be an int >= 0, got 'two'"),
    ("workers=-1", "`workers` must be an int >= 0, got '-1'"),
    ("workers=0", "`workers` must be a positive int, got 0"),
    ("workers=2,workers=3", "`workers` is given twice"),
    ("ps=1", "give the number of workers"),
    ("workers=2,ps=x", "`ps` must be an int >= 0, got 'x'"),
])
def test_parse_spec_errors_quote_the_value(text, message):
  with pytest.raises(local.LocalClusterError, match=message) as error:
    local.parse_spec(text)
  assert f"--local-cluster {text!r}" in str(error.value)


def test_every_task_gets_its_tf_config_chief_streams_others_log(tmp_path, capfd):
  status, out = _run(tmp_path, ["0", "0", "0"])
  assert status == 0
  chief_out = capfd.readouterr().out
  configs = [json.loads(chief_out.split("TF_CONFIG ", 1)[1].splitlines()[0])]
  for index in (1, 2):
    log = (tmp_path / "logs" / f"worker-{index}.log").read_text()
    assert f"worker {index} (pid " in out and str(tmp_path / "logs" / f"worker-{index}.log") in out
    configs.append(json.loads(log.split("TF_CONFIG ", 1)[1].splitlines()[0]))
  # One TMPDIR for the tasks, deleted at the end.
  (tmp_dir,) = {
      line.split(" ", 1)[1] for line in chief_out.splitlines() if line.startswith("TMPDIR")
  }
  assert os.path.basename(tmp_dir).startswith("mxrec-local-cluster-")
  assert not os.path.exists(tmp_dir)
  addresses = configs[0]["cluster"]["worker"]
  assert len(set(addresses)) == 3 and all(a.startswith("localhost:") for a in addresses)
  for index, config in enumerate(configs):
    parsed = tf_config.parse(json.dumps(config))
    assert parsed.cluster == {"worker": tuple(addresses)}
    assert (parsed.task_type, parsed.task_index, parsed.is_chief) == ("worker", index, index == 0)


def test_free_ports_are_below_the_ephemeral_range_distinct_and_skip_a_bound_one(monkeypatch):
  # The kernel gives ephemeral ports to outgoing connections: a port freed there is soon reused.
  start = local._ephemeral_port_start()
  ports = local.free_ports(8)
  assert len(set(ports)) == 8 and all(local.LOWEST_PORT <= p < start for p in ports)
  # A range of exactly 64 ports, all but one taken: that one is returned.
  monkeypatch.setattr(local, "_ephemeral_port_start", lambda: local.LOWEST_PORT + 64)
  taken = []
  try:
    for port in range(local.LOWEST_PORT + 1, local.LOWEST_PORT + 64):
      s = socket.socket()
      taken.append(s)
      s.bind(("localhost", port))
    assert local.free_ports(1) == [local.LOWEST_PORT]
  except OSError:
    pytest.skip("a port of the range is used by another process")
  finally:
    for s in taken:
      s.close()
  # No room below the range (e.g. ip_local_port_range starting at 1024): the kernel picks.
  monkeypatch.setattr(local, "_ephemeral_port_start", lambda: 1024)
  assert all(p >= 1024 for p in local.free_ports(3)) and len(set(local.free_ports(3))) == 3


def test_ephemeral_port_start_reads_the_kernel_setting_or_defaults(tmp_path):
  (tmp_path / "range").write_text("20000\t40000\n")
  assert local._ephemeral_port_start(str(tmp_path / "range")) == 20000
  assert local._ephemeral_port_start(str(tmp_path / "missing")) == 32768


def test_a_failed_worker_stops_the_others_and_is_named(tmp_path):
  status, out = _run(tmp_path, ["forever", "3", "forever"])
  assert status == 1
  log = tmp_path / "logs" / "worker-1.log"
  assert f"worker 1 exited with status 3; its log: {log}; stopping worker 0, worker 2" in out


def test_a_failed_chief_returns_its_status(tmp_path):
  status, out = _run(tmp_path, ["5", "forever"])
  assert status == 5
  assert "worker 0 exited with status 5; its output is above; stopping worker 1" in out


def test_stop_kills_a_task_that_ignores_sigterm(tmp_path):
  env, marker = lib.marked_env()
  try:
    tasks = [
        local._start("worker", i, [sys.executable, "-c", TASK, "ignore_term", "ignore_term"],
                     {**env, "TF_CONFIG": tf_config.dumps({"worker": ["h:1", "h:2"]}, "worker", i)},
                     str(tmp_path), chief=i == 0) for i in range(2)
    ]
    # SIGTERM is ignored once the task said so.
    lib.wait_for_text(tmp_path / "worker-1.log", "ignoring SIGTERM", 60, tasks[1].process)
    local.stop(tasks, grace_s=0.5)
    assert tasks[1].process.returncode == -9  # SIGTERM ignored, then SIGKILL.
    assert lib.marked_pids(marker) == []
  finally:
    lib.kill_marked(marker)


# `train --local-cluster` in a fresh process, with `local.run` recording what it would start.
CLI_WRAPPER = """
import json, sys
from mxrec_pipeline import cli
from mxrec_pipeline.cluster import local
calls = []
local.run = lambda command, spec, log_dir: calls.append((command(1), spec.workers, log_dir)) or 0
code = cli.main(sys.argv[1:])
print(json.dumps({"code": code, "calls": calls, "tensorflow": "tensorflow" in sys.modules}))
"""


def test_train_local_cluster_runs_the_same_command_without_tensorflow(tmp_path):
  config = str(REPO / "configs" / "mslr_dnn.yaml")
  args = [
      "train", config, "--local-cluster", "workers=3", "--fresh", "--set",
      f"pipeline.model_dir={tmp_path / 'run'}", "--set", "pipeline.early_stopping=null"
  ]
  process = subprocess.run([sys.executable, "-c", CLI_WRAPPER, *args], capture_output=True,
                           text=True, timeout=120, check=True)
  result = json.loads(process.stdout.strip().splitlines()[-1])
  assert result == {
      "code": 0, "tensorflow": False, "calls": [[[
          sys.executable, "-m", "mxrec_pipeline.cli", "train", config, "--verbose=2", "--fresh",
          "--set", f"pipeline.model_dir={tmp_path / 'run'}", "--set",
          "pipeline.early_stopping=null", "--set", "pipeline.strategy=MultiWorkerMirroredStrategy"
      ], 3,
                                                 str(tmp_path / "run" / "local_cluster")]]
  }


def test_local_cluster_refuses_early_stopping_once_without_starting_tasks(tmp_path):
  config = str(REPO / "configs" / "mslr_dnn.yaml")  # It sets pipeline.early_stopping.
  args = [
      "train", config, "--local-cluster", "workers=2", "--set",
      f"pipeline.model_dir={tmp_path / 'run'}"
  ]
  process = subprocess.run([sys.executable, "-c", CLI_WRAPPER, *args], capture_output=True,
                           text=True, timeout=120, check=True)
  result = json.loads(process.stdout.strip().splitlines()[-1])
  assert result == {"code": 2, "calls": [], "tensorflow": False}
  assert "`early_stopping` runs on one host" in process.stderr


LAUNCHER = """
import sys
from mxrec_pipeline.cluster import local
task = [sys.executable, "-c", sys.argv[1], "forever", "forever"]
sys.exit(local.run(lambda index: task, local.LocalClusterSpec(workers=2), sys.argv[2]))
"""


def _sigint_as_on_a_terminal():
  """Child setup: SIGINT's default action, as a shell in the foreground gives.

  A test run started in the background by a non-interactive shell inherits
  SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
  """
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_every_worker(tmp_path):
  env, marker = lib.marked_env()
  with open(tmp_path / "launcher.txt", "w", encoding="utf-8") as out:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, TASK,
                                 str(tmp_path / "logs")], env=env, stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=_sigint_as_on_a_terminal)
  try:
    lib.wait_for_text(tmp_path / "logs" / "worker-1.log", "TF_CONFIG", 60, launcher)
    # Ctrl-C while the job runs: every task started and listed by the launcher.
    lib.wait_for_text(tmp_path / "launcher.txt", "local cluster: worker 1 (pid", 60, launcher)
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=60) == 130
    assert "interrupted, stopping every worker" in (tmp_path / "launcher.txt").read_text()
    assert lib.marked_pids(marker) == []
  finally:
    launcher.kill()
    launcher.wait()
    lib.kill_marked(marker)


def _run_ps(tmp_path, chief_action, server_actions, **run_args):
  """A workers=1,ps=2 cluster: the chief runs TASK with `chief_action`, the servers SERVER."""
  env, marker = lib.marked_env()
  out = io.StringIO()
  server = """
import json, os, sys, time
config = json.loads(os.environ["TF_CONFIG"])
print("TF_CONFIG", json.dumps(config), flush=True)
action = sys.argv[1:][["worker", "ps"].index(config["task"]["type"]) + config["task"]["index"]]
if action != "forever":
  sys.exit(int(action))
while True:
  time.sleep(1)
"""
  try:
    status = local.run(lambda task: [sys.executable, "-c", TASK, chief_action],
                       local.LocalClusterSpec(workers=1, ps=2), str(tmp_path / "logs"), env=env,
                       out=out, server_argv=[sys.executable, "-c", server,
                                             *server_actions], **run_args)
    assert lib.marked_pids(marker) == []  # The servers were stopped too.
  finally:
    lib.kill_marked(marker)
  return status, out.getvalue()


def test_ps_cluster_chief_coordinates_servers_stopped_when_it_ends(tmp_path, capfd):
  status, out = _run_ps(tmp_path, "0", ["forever", "forever", "forever"])
  assert status == 0
  assert "chief 0 (pid " in out and "ps 1 (pid " in out
  chief = json.loads(capfd.readouterr().out.split("TF_CONFIG ", 1)[1].splitlines()[0])
  parsed = tf_config.parse(json.dumps(chief))
  assert (parsed.task_type, parsed.is_chief) == ("chief", True)
  assert [len(parsed.cluster[job]) for job in ("chief", "worker", "ps")] == [1, 1, 2]
  log = (tmp_path / "logs" / "ps-1.log").read_text()
  ps1 = tf_config.parse(log.split("TF_CONFIG ", 1)[1].splitlines()[0])
  assert (ps1.task_type, ps1.task_index, ps1.cluster) == ("ps", 1, parsed.cluster)


@pytest.mark.parametrize("ps1_status", ["0", "3"])
def test_ps_cluster_a_server_that_exits_is_named(tmp_path, ps1_status):
  status, out = _run_ps(tmp_path, "forever", ["forever", "forever", ps1_status])
  assert status == 1
  assert f"ps 1 exited with status {ps1_status}; its log: {tmp_path / 'logs' / 'ps-1.log'}" in out


def test_ps_cluster_a_lost_worker_is_started_again_then_named(tmp_path):
  # Worker 0 exits at once, every time: started again twice at its address, then a failure.
  status, out = _run_ps(tmp_path, "forever", ["3", "forever", "forever"], max_worker_restarts=2)
  assert status == 1
  log = tmp_path / "logs" / "worker-0.log"
  assert out.count("worker 0 exited with status 3; started again (pid ") == 2
  for restart in (1, 2):
    assert f"restart {restart} of 2) at the same address" in out
  assert f"error: worker 0 exited with status 3; its log: {log}" in out
  # Each start appended to the log, with the same TF_CONFIG.
  configs = [line for line in log.read_text().splitlines() if line.startswith("TF_CONFIG ")]
  assert len(configs) == 3 and len(set(configs)) == 1


def test_module_entry_point_refuses_a_bad_spec(capsys):
  assert local.main(["workers=0,ps=1", "--", "true"]) == 2
  assert "`workers` must be a positive int" in capsys.readouterr().err
  assert local.main(["workers=1,ps=1"]) == 2
