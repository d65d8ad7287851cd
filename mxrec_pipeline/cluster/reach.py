"""Waits until the tasks of a cluster accept connections, or names the ones that do not.

A ParameterServerStrategy coordinator whose ps or worker address nobody
listens on blocks in TensorFlow's connect (no error, no timeout). Calling
`wait_for_tasks` first turns that into an error naming the task and its
address. It only opens TCP connections (TensorFlow-free), as a gRPC channel's
first connect does.
"""

from __future__ import annotations

import socket
import time

from mxrec_pipeline.cluster import tf_config

DEFAULT_TIMEOUT_S = 60.0
_RETRY_S = 0.2


def _accepts(address: str, timeout_s: float) -> bool:
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
      return True
  except OSError:
    return False


def wait_for_tasks(config: tf_config.TFConfig, jobs=(tf_config.PS, tf_config.WORKER),
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
  """Returns once every task of `jobs` in `config.cluster` accepts a TCP connection.

  Args:
    config: The parsed TF_CONFIG (tf_config.parse) of this process.
    jobs: The jobs whose tasks must be up (default: ps and worker).
    timeout_s: Seconds to keep retrying (tasks may still be starting).

  Raises:
    tf_config.PeerError: tasks still unreachable after `timeout_s`, each
      named with its address ("ps 1 (localhost:1234)").
  """
  pending = [
      (job, i, address) for job in jobs for i, address in enumerate(config.cluster.get(job, ()))
  ]
  deadline = time.monotonic() + timeout_s
  while True:
    pending = [task for task in pending if not _accepts(task[2], _RETRY_S)]
    if not pending or time.monotonic() >= deadline:
      break
    time.sleep(_RETRY_S)
  if pending:
    names = ", ".join(f"{job} {i} ({address})" for job, i, address in pending)
    raise tf_config.PeerError(f"{config.task_name}: unreachable after {timeout_s:g} s: {names}; "
                              "is the task started (python -m mxrec_pipeline.cluster.ps_server) "
                              "and its address right in TF_CONFIG?")


def lost_ps_error(config: tf_config.TFConfig, error: Exception) -> tf_config.PeerError | None:
  """The PeerError naming the ps tasks a coordinator's error names, or None if it names none.

  ParameterServerStrategy cannot go on without a ps: ClusterCoordinator
  raises an UnavailableError at `join`/`fetch` whose text mentions
  "/job:ps/replica:0/task:<i>" among other tasks. The job must restart (every
  task) from its last checkpoint.

  Args:
    config: The coordinator's parsed TF_CONFIG.
    error: What `join` or `fetch` raised.
  """
  lost = [name for name in config.peers_named_in(str(error)) if name.startswith(f"{tf_config.PS} ")]
  if not lost:
    return None
  return tf_config.PeerError(
      f"{config.task_name}: lost {', '.join(lost)} ({type(error).__name__}); the job cannot go on "
      "without its ps tasks: restart every task and restore the last checkpoint "
      "(distributed/ps_checkpoint.restore)")
