"""A cluster of local processes: `mxrec-pipeline train CONFIG --local-cluster workers=N`.

`run` starts N copies of a training command on this machine, each with the
TF_CONFIG of one task of a cluster on free localhost ports (as TF's own
multi-worker tests do, tensorflow/python/distribute/multi_worker_test_base.py),
streams the chief's output (worker 0: the cluster has no "chief" job) and
writes every other worker's output to a log file. With ps=M
(ParameterServerStrategy) the command runs as the "chief" task (the
coordinator) beside N "worker" and M "ps" tasks running
`python -m mxrec_pipeline.cluster.ps_server`; the job ends when the chief
ends, and a worker server that dies is started again at its address. With
evaluator=1 the command also runs as a sidecar "evaluator" task
(mxrec_pipeline/sidecar.py), and the job ends when it ends too.
`python -m mxrec_pipeline.cluster.local workers=2,ps=2 -- COMMAND...` launches
any coordinator program this way. Every process started is stopped (SIGTERM,
then SIGKILL) as soon as one fails, or on Ctrl-C, naming the task and its
log. TensorFlow-free: the launcher only starts and watches processes.
See docs/distributed.md#on-one-machine---local-cluster.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import random
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
DEFAULT_WORKER_RESTARTS = 3  # Restarts of each lost ParameterServerStrategy worker server.
POLL_S = 0.1  # Seconds between two looks at the processes.
LOWEST_PORT = 10000  # free_ports draws from here up to the kernel's ephemeral range.
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class LocalClusterError(ValueError):
  """A bad `--local-cluster` value; the message names it."""


@dataclasses.dataclass(frozen=True)
class LocalClusterSpec:
  """The tasks of a local cluster.

  Attributes:
    workers: Worker tasks, >= 1 (MultiWorkerMirroredStrategy: worker 0 is the
      chief; ParameterServerStrategy: they run what the chief schedules).
    ps: Parameter-server tasks, >= 0; > 0 adds a "chief" task (the
      ParameterServerStrategy coordinator) and the ps tasks.
    evaluator: 0 or 1 (only with ps > 0): a sidecar "evaluator" task running
      the chief's command outside the training cluster
      (mxrec_pipeline/sidecar.py); the job ends when it has validated the
      last checkpoint.
  """

  workers: int
  ps: int = 0
  evaluator: int = 0

  def __post_init__(self):
    if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
      raise LocalClusterError(f"`workers` must be a positive int, got {self.workers!r}")
    if isinstance(self.ps, bool) or not isinstance(self.ps, int) or self.ps < 0:
      raise LocalClusterError(f"`ps` must be an int >= 0, got {self.ps!r}")
    if self.evaluator not in (0, 1) or isinstance(self.evaluator, bool):
      raise LocalClusterError(f"`evaluator` must be 0 or 1, got {self.evaluator!r}")
    if self.evaluator and not self.ps:
      raise LocalClusterError("`evaluator` goes with ParameterServerStrategy: give ps=M too "
                              "(under MultiWorkerMirroredStrategy the workers validate)")

  def tasks(self) -> list[tuple[str, int]]:
    """(job, index) of every task, the chief first.

    Workers 0..N-1; with ps: chief 0, the workers, the ps tasks and evaluator 0.
    """
    workers = [(tf_config.WORKER, i) for i in range(self.workers)]
    if not self.ps:
      return workers
    return [(tf_config.CHIEF, 0), *workers, *((tf_config.PS, i) for i in range(self.ps)),
            *((tf_config.EVALUATOR, 0),) * self.evaluator]


def parse_spec(text: str) -> LocalClusterSpec:
  """Parses `workers=N[,ps=M[,evaluator=1]]`, e.g. "workers=2".

  Raises:
    LocalClusterError: an unknown key, a key twice, a value that is not an
      int >= 0, no `workers`, or workers < 1; the message quotes `text`.
  """
  values = {}
  for part in text.split(","):
    key, sep, value = part.strip().partition("=")
    key = key.strip()
    if not sep or key not in ("workers", "ps", "evaluator"):
      raise LocalClusterError(f"--local-cluster {text!r}: expected workers=N[,ps=M[,evaluator=1]], "
                              f"got {part!r}")
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
  """`count` distinct TCP ports free on `host` now, below the kernel's ephemeral port range.

  Each is checked by binding it, then released. Ports are drawn at random
  from [LOWEST_PORT, the ephemeral range's start) (Linux:
  /proc/sys/net/ipv4/ip_local_port_range, typically 32768): the kernel
  hands ports of the ephemeral range to every outgoing connection (the
  workers' own gRPC channels, other programs) and to every bind to port 0,
  so a port freed there is soon taken again. Where that range leaves too
  few ports below it, falls back to ports the kernel picks (port 0). Another
  process may still take a port before the worker binds it; TF then fails
  to start its server, naming the address.

  Raises:
    OSError: fewer than `count` ports could be bound.
  """
  low = _ephemeral_port_start()
  candidates = list(range(LOWEST_PORT, low)) if low - LOWEST_PORT >= 64 * count else []
  random.SystemRandom().shuffle(candidates)
  ports: list[int] = []
  for port in candidates:
    if len(ports) == count:
      break
    if _bindable(host, port):
      ports.append(port)
  while len(ports) < count:  # No room below the ephemeral range: the kernel picks.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      s.bind((host, 0))
      port = s.getsockname()[1]
    if port not in ports:
      ports.append(port)
  return ports


def _ephemeral_port_start(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
  """The first port of the kernel's ephemeral range (32768, Linux's default, if unreadable)."""
  try:
    with open(path, encoding="ascii") as f:
      return int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return 32768


def _bindable(host: str, port: int) -> bool:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    try:
      s.bind((host, port))
    except OSError:
      return False
  return True


def cluster_tf_configs(spec: LocalClusterSpec, host: str = "localhost") -> list[str]:
  """The TF_CONFIG of each task of `spec` (in `spec.tasks()` order) on free ports of `host`.

  An evaluator is outside the training cluster (TF's convention): its
  TF_CONFIG names the cluster and its own task, no address of its own.
  """
  tasks = spec.tasks()
  training = [(job, index) for job, index in tasks if job != tf_config.EVALUATOR]
  cluster: dict[str, list[str]] = {}
  for (job, _), port in zip(training, free_ports(len(training), host)):
    cluster.setdefault(job, []).append(f"{host}:{port}")
  return [tf_config.dumps(cluster, job, index) for job, index in tasks]


def server_command() -> list[str]:
  """The argv of a ps or worker task of a ParameterServerStrategy cluster."""
  return [sys.executable, "-m", "mxrec_pipeline.cluster.ps_server"]


@dataclasses.dataclass
class _Task:
  name: str  # "worker 1"
  process: subprocess.Popen
  log_path: str | None  # None: output streamed (the chief).
  serves: bool = False  # A ParameterServerStrategy server: runs until stopped.
  argv: Sequence[str] = ()
  env: dict[str, str] | None = None
  restarts: int = 0  # Times a lost ParameterServerStrategy worker was started again.

  @property
  def restartable(self) -> bool:
    """A ParameterServerStrategy worker server: the coordinator survives losing it."""
    return self.serves and self.name.startswith(tf_config.WORKER + " ")


def run(command: Callable[[int], Sequence[str]], spec: LocalClusterSpec, log_dir: str,
        env: dict[str, str] | None = None, grace_s: float = DEFAULT_GRACE_S,
        out: TextIO | None = None, server_argv: Sequence[str] | None = None,
        max_worker_restarts: int = DEFAULT_WORKER_RESTARTS) -> int:
  """Runs a local cluster until every task ends, or one fails; returns an exit status.

  Task i runs `command(i)` (with ps > 0: the chief and an evaluator run
  `command(0)`, the worker and ps tasks `server_command()`) with TF_CONFIG
  (`cluster_tf_configs`) added to `env` (default: os.environ),
  PYTHONUNBUFFERED=1 and TMPDIR set to a new temporary directory, deleted
  when all tasks ended (with what a killed task left there). The chief
  (worker 0, or chief 0 with ps > 0) writes to this process's stdout and
  stderr; the other tasks to
  `log_dir/<job>-<i>.log`. Each task dies with this process (Linux
  PR_SET_PDEATHSIG), so none outlives a launcher that is killed.

  With ps > 0, a worker server that exits while the chief runs (e.g.
  SIGKILLed) is started again with the same argv and TF_CONFIG, so at the
  same address, its output appended to its log: TF's recovery from a lost
  worker (ClusterCoordinator retries the worker's in-flight closures on the
  others and waits until the worker is back, then reconnects it; TF 2.15's
  WorkerPreemptionHandler updates the whole cluster, so without the restart
  the coordinator waits for the worker until its 3,600 s limit).

  Example:

    ```python
    spec = parse_spec("workers=2")
    status = run(lambda task: [sys.executable, "-m", "mxrec_pipeline.cli", "train", "job.yaml"],
                 spec, log_dir="runs/job/local_cluster")
    ```

  Args:
    command: Task index -> the argv of that task.
    spec: The cluster.
    log_dir: Directory of the other workers' logs (created).
    env: Environment of the tasks; TF_CONFIG is set on top of it.
    grace_s: Seconds between SIGTERM and SIGKILL when stopping tasks.
    out: Where the launcher's own messages go (default sys.stderr).
    server_argv: The argv of the ps and worker tasks when spec.ps > 0
      (default `server_command()`).
    max_worker_restarts: Restarts of each ParameterServerStrategy worker
      server; one that exits once more fails the job as a ps does.

  Returns:
    0 when every task exits with 0 (with ps > 0: when the chief does; the
    servers are stopped then). When a task exits with another status (or a
    ps server of a ParameterServerStrategy cluster exits at all, or a worker
    server past its restarts), the others are stopped, a message names the
    task, its status and its log,
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
    for (job, index), config in zip(spec.tasks(), cluster_tf_configs(spec)):
      task_env = {**base_env, tf_config.ENV_VAR: config}
      serves = bool(spec.ps) and job not in (tf_config.CHIEF, tf_config.EVALUATOR)
      argv = (server_argv or server_command()) if serves else command(index)
      tasks.append(_start(job, index, argv, task_env, log_dir, chief=not tasks, serves=serves))
    for task in tasks:
      where = f"logs to {task.log_path}" if task.log_path else "the chief, output below"
      print(f"local cluster: {task.name} (pid {task.process.pid}) {where}", file=out, flush=True)
    return _watch(tasks, out, max_worker_restarts)
  except KeyboardInterrupt:
    print("local cluster: interrupted, stopping every worker", file=out, flush=True)
    return 130
  finally:
    stop(tasks, grace_s)
    shutil.rmtree(scratch, ignore_errors=True)


def _start(job: str, index: int, argv: Sequence[str], env: dict[str, str], log_dir: str,
           chief: bool, serves: bool = False) -> _Task:
  name = f"{job} {index}"
  if chief:
    return _Task(
        name, subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                               preexec_fn=_die_with_parent), None, argv=argv, env=env)
  task = _Task(name, None, os.path.join(log_dir, f"{job}-{index}.log"), serves, argv, env)
  _spawn(task, "wb")
  return task


def _spawn(task: _Task, mode: str) -> None:
  """Starts `task.argv` as task.process, its output to its log (`mode` "wb" or "ab")."""
  with open(task.log_path, mode) as log:
    task.process = subprocess.Popen(task.argv, env=task.env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
  """In the child before exec: SIGKILL when the launcher dies (Linux; elsewhere nothing)."""
  if sys.platform.startswith("linux"):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _watch(tasks: list[_Task], out: TextIO, max_worker_restarts: int) -> int:
  """Waits until every task exited 0 (returns 0) or one failed (returns its status code).

  Servers (`_Task.serves`) are not waited for: the job ends when the others
  have; a ps server that exits before is a failure, whatever its status; a
  worker server is started again (`_restart`) up to `max_worker_restarts`
  times, then is a failure too.
  """
  running = list(tasks)
  while any(not task.serves for task in running):
    for task in list(running):
      status = task.process.poll()
      if status is None:
        continue
      if task.restartable and task.restarts < max_worker_restarts:
        _restart(task, status, out, max_worker_restarts)
        continue
      running.remove(task)
      if status != 0 or task.serves:
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


def _restart(task: _Task, status: int, out: TextIO, max_restarts: int) -> None:
  """Starts a lost ParameterServerStrategy worker again, with its TF_CONFIG (same address)."""
  task.restarts += 1
  _spawn(task, "ab")
  print(
      f"local cluster: {task.name} exited with status {_describe(status)}; started again "
      f"(pid {task.process.pid}, restart {task.restarts} of {max_restarts}) at the same address, "
      f"the coordinator retries its steps; its log: {task.log_path}", file=out, flush=True)


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


def main(argv: Sequence[str] | None = None) -> int:
  """`python -m mxrec_pipeline.cluster.local workers=N[,ps=M] -- COMMAND...`: runs a local cluster.

  The chief runs COMMAND; with ps=M the workers and ps tasks run
  `server_command()`, else every worker runs COMMAND. The other tasks' logs go
  to ./local_cluster/. Returns `run`'s status; 2 on a bad spec or no command.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  if len(argv) < 3 or argv[1] != "--":
    print("usage: python -m mxrec_pipeline.cluster.local workers=N[,ps=M] -- COMMAND...",
          file=sys.stderr)
    return 2
  try:
    spec = parse_spec(argv[0])
  except LocalClusterError as e:
    print(f"local cluster: error: {e}", file=sys.stderr)
    return 2
  return run(lambda task: argv[2:], spec, log_dir="local_cluster")


if __name__ == "__main__":
  sys.exit(main())
