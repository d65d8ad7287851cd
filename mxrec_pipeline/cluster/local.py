"""A cluster of local processes: `mxrec-pipeline train CONFIG --local-cluster workers=N`.

Starts N copies of a training command on this machine, each with the
TF_CONFIG of one task of a cluster on free localhost ports (as TF's own
multi-worker tests do, tensorflow/python/distribute/multi_worker_test_base.py),
streams the chief's output (worker 0: the cluster has no "chief" job) and
writes every other worker's output to a log file. It stops every process it
started (SIGTERM, then SIGKILL after a grace period) as soon as one exits with
a non-zero status or on Ctrl-C, naming the task and its log. TensorFlow-free:
the launcher process only starts and watches processes.

Example:

  ```python
  spec = parse_spec("workers=2")
  status = run(lambda task: [sys.executable, "-m", "mxrec_pipeline.cli", "train", "job.yaml"],
               spec, log_dir="runs/job/local_cluster")
  ```
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, Sequence, TextIO

from mxrec_pipeline.cluster import tf_config

DEFAULT_GRACE_S = 10.0  # Seconds between SIGTERM and SIGKILL when stopping a worker.
POLL_S = 0.1  # Seconds between two looks at the processes.
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class LocalClusterError(ValueError):
  """A bad `--local-cluster` value; the message names it."""


@dataclasses.dataclass(frozen=True)
class LocalClusterSpec:
  """The tasks of a local cluster.

  Attributes:
    workers: Worker tasks, >= 1 (MultiWorkerMirroredStrategy; worker 0 is the chief).
    ps: Parameter-server tasks (ParameterServerStrategy): must be 0 for now.
  """

  workers: int
  ps: int = 0

  def __post_init__(self):
    if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
      raise LocalClusterError(f"`workers` must be a positive int, got {self.workers!r}")
    if self.ps:
      raise LocalClusterError(f"ps={self.ps}: ParameterServerStrategy is not supported yet; "
                              "use workers=N (MultiWorkerMirroredStrategy)")


def parse_spec(text: str) -> LocalClusterSpec:
  """Parses `workers=N[,ps=M]`, e.g. "workers=2".

  Raises:
    LocalClusterError: an unknown key, a key twice, a value that is not an
      int >= 0, no `workers`, workers < 1, or ps > 0 (not supported yet);
      the message quotes `text`.
  """
  values = {}
  for part in text.split(","):
    key, sep, value = part.strip().partition("=")
    key = key.strip()
    if not sep or key not in ("workers", "ps"):
      raise LocalClusterError(f"--local-cluster {text!r}: expected workers=N[,ps=M], got {part!r}")
    if key in values:
      raise LocalClusterError(f"--local-cluster {text!r}: `{key}` is given twice")
    if not value.strip().isdigit():
      raise LocalClusterError(f"--local-cluster {text!r}: `{key}` must be an int >= 0, "
                              f"got {value!r}")
    values[key] = int(value)
  if "workers" not in values:
    raise LocalClusterError(f"--local-cluster {text!r}: give the number of workers, e.g. "
                            "workers=2")
  try:
    return LocalClusterSpec(**values)
  except LocalClusterError as e:
    raise LocalClusterError(f"--local-cluster {text!r}: {e}") from None


def free_ports(count: int, host: str = "localhost") -> list[int]:
  """`count` distinct TCP ports free on `host` now (each bound to port 0, then released).

  Another process may take a port between this call and the worker binding
  it; TF then fails to start its server, naming the address.
  """
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind((host, 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def cluster_tf_configs(spec: LocalClusterSpec, host: str = "localhost") -> list[str]:
  """The TF_CONFIG of each task of `spec` ("worker" 0..N-1) on free ports of `host`."""
  cluster = {tf_config.WORKER: [f"{host}:{port}" for port in free_ports(spec.workers, host)]}
  return [tf_config.dumps(cluster, tf_config.WORKER, i) for i in range(spec.workers)]


@dataclasses.dataclass
class _Task:
  name: str  # "worker 1"
  process: subprocess.Popen
  log_path: str | None  # None: output streamed (the chief).


def run(command: Callable[[int], Sequence[str]], spec: LocalClusterSpec, log_dir: str,
        env: dict[str, str] | None = None, grace_s: float = DEFAULT_GRACE_S,
        out: TextIO | None = None) -> int:
  """Runs a local cluster until every task ends, or one fails; returns an exit status.

  Task i runs `command(i)` with TF_CONFIG (`cluster_tf_configs`) added to
  `env` (default: os.environ), PYTHONUNBUFFERED=1 and TMPDIR set to a new
  temporary directory, deleted when all tasks ended (with what a killed
  task left there). The chief (worker 0)
  writes to this process's stdout and stderr; worker i > 0 to
  `log_dir/worker-<i>.log`. Each task dies with this process (Linux
  PR_SET_PDEATHSIG), so none outlives a launcher that is killed.

  Args:
    command: Task index -> the argv of that task.
    spec: The cluster.
    log_dir: Directory of the other workers' logs (created).
    env: Environment of the tasks; TF_CONFIG is set on top of it.
    grace_s: Seconds between SIGTERM and SIGKILL when stopping tasks.
    out: Where the launcher's own messages go (default sys.stderr).

  Returns:
    0 when every task exits with 0. When a task exits with another status,
    the others are stopped, a message names the task, its status and its log,
    and the chief's status is returned if the chief failed first, else 1.
    130 on KeyboardInterrupt (Ctrl-C), after stopping every task.
  """
  out = out or sys.stderr
  os.makedirs(log_dir, exist_ok=True)
  tasks = []
  # The tasks' TMPDIR (where non-chief workers keep their model_dir): deleted at the end,
  # even when a task was killed before it could delete its own files.
  scratch = tempfile.mkdtemp(prefix="mxrec-local-cluster-")
  try:
    base_env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1", "TMPDIR": scratch}
    for index, config in enumerate(cluster_tf_configs(spec)):
      task_env = {**base_env, tf_config.ENV_VAR: config}
      tasks.append(_start(index, command(index), task_env, log_dir))
    for task in tasks:
      where = f"logs to {task.log_path}" if task.log_path else "the chief, output below"
      print(f"local cluster: {task.name} (pid {task.process.pid}) {where}", file=out, flush=True)
    return _watch(tasks, out)
  except KeyboardInterrupt:
    print("local cluster: interrupted, stopping every worker", file=out, flush=True)
    return 130
  finally:
    stop(tasks, grace_s)
    shutil.rmtree(scratch, ignore_errors=True)


def _start(index: int, argv: Sequence[str], env: dict[str, str], log_dir: str) -> _Task:
  name = f"{tf_config.WORKER} {index}"
  if index == 0:
    return _Task(
        name, subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                               preexec_fn=_die_with_parent), None)
  log_path = os.path.join(log_dir, f"{tf_config.WORKER}-{index}.log")
  with open(log_path, "wb") as log:
    process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
  return _Task(name, process, log_path)


def _die_with_parent() -> None:
  """In the child before exec: SIGKILL when the launcher dies (Linux; elsewhere nothing)."""
  if sys.platform.startswith("linux"):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _watch(tasks: list[_Task], out: TextIO) -> int:
  """Waits until every task exited 0 (returns 0) or one failed (returns its status code)."""
  running = list(tasks)
  while running:
    for task in list(running):
      status = task.process.poll()
      if status is None:
        continue
      running.remove(task)
      if status != 0:
        where = f"its log: {task.log_path}" if task.log_path else "its output is above"
        others = [t.name for t in running]
        print(
            f"local cluster: error: {task.name} exited with status {_describe(status)}; {where}" +
            (f"; stopping {', '.join(others)}" if others else ""), file=out, flush=True)
        if task is tasks[0]:
          return status if status > 0 else 128 - status
        return 1
    if running:
      time.sleep(POLL_S)
  return 0


def _describe(status: int) -> str:
  """"1", or "-9 (SIGKILL)" for a process killed by a signal (Popen's negative status)."""
  if status >= 0:
    return str(status)
  try:
    return f"{status} ({signal.Signals(-status).name})"
  except ValueError:
    return str(status)


def stop(tasks: Sequence[_Task], grace_s: float = DEFAULT_GRACE_S) -> None:
  """Stops the tasks still running: SIGTERM, then SIGKILL after `grace_s`; reaps all."""
  for task in tasks:
    if task.process.poll() is None:
      task.process.terminate()
  deadline = time.monotonic() + grace_s
  for task in tasks:
    try:
      task.process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      task.process.kill()
      task.process.wait()
