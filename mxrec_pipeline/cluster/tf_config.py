"""TF_CONFIG: read, validate, and say which task is the chief. TensorFlow-free.

Every process of a multi-worker job gets the cluster and its own task in the
`TF_CONFIG` environment variable, as tf.distribute's TFConfigClusterResolver
reads it:

  {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"]},
   "task": {"type": "worker", "index": 1}}

TF's resolver accepts many malformed values and fails later, deep in the gRPC
server or a collective op; `parse` checks everything a MultiWorkerMirroredStrategy
job needs first and names the culprit (the key, the job, the task). The chief
is TF's (multi_worker_util.is_chief): the "chief" task when the cluster has
one, else worker 0. Only the chief writes the run's outputs (TensorBoard
logs, metrics.json, checkpoints, exports); see docs/distributed.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Mapping

ENV_VAR = "TF_CONFIG"
CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"
# The job names of tf.distribute's multi-worker strategies.
JOB_NAMES = (CHIEF, WORKER, PS, EVALUATOR)


class TFConfigError(ValueError):
  """TF_CONFIG is malformed; the message names the key, job or task at fault."""


class PeerError(RuntimeError):
  """Training stopped because another task of the cluster failed or could not be reached."""


# A task in TF's device names and errors: "/job:worker/replica:0/task:1", "/job:worker/task:1".
_TASK_IN_TEXT = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")


@dataclasses.dataclass(frozen=True)
class TFConfig:
  """A validated TF_CONFIG.

  Attributes:
    cluster: Job name ("chief", "worker", "ps", "evaluator") -> the
      "host:port" addresses of its tasks, in task-index order.
    task_type: This process's job name.
    task_index: This process's index in its job, >= 0.
    rpc_layer: TF_CONFIG's "rpc_layer" ("grpc" when absent).
  """

  cluster: Mapping[str, tuple[str, ...]]
  task_type: str
  task_index: int
  rpc_layer: str = "grpc"

  @property
  def task_name(self) -> str:
    """"worker 1", "chief 0": the task as errors and logs name it."""
    return f"{self.task_type} {self.task_index}"

  @property
  def address(self) -> str:
    """This task's "host:port" in the cluster, where its TensorFlow server listens."""
    return self.cluster[self.task_type][self.task_index]

  def server_start_error(self, reason: str) -> TFConfigError:
    """The error for this task's server failing to start at its address (e.g. port in use)."""
    return TFConfigError(f"{self.task_name} could not start its TensorFlow server at "
                         f"{self.address} (its {ENV_VAR} address; is the port used by another "
                         f"process?): {reason}")

  @property
  def chief(self) -> tuple[str, int]:
    """(job, index) of the chief: ("chief", 0) if the cluster has one, else ("worker", 0)."""
    return (CHIEF, 0) if CHIEF in self.cluster else (WORKER, 0)

  @property
  def is_chief(self) -> bool:
    """Whether this process is the chief (tf.distribute's multi_worker_util.is_chief)."""
    return (self.task_type, self.task_index) == self.chief

  @property
  def is_evaluator(self) -> bool:
    """Whether this process is the sidecar evaluator (task type "evaluator", sidecar.py)."""
    return self.task_type == EVALUATOR

  @property
  def num_workers(self) -> int:
    """Tasks that train in lockstep under MultiWorkerMirroredStrategy: chief + workers."""
    return len(self.cluster.get(CHIEF, ())) + len(self.cluster.get(WORKER, ()))

  def peers_named_in(self, text: str) -> list[str]:
    """The other tasks ("worker 1") that a TF error text names, in order of first mention."""
    found = []
    for job, index in _TASK_IN_TEXT.findall(text):
      name = f"{job} {int(index)}"
      if name != self.task_name and name not in found:
        found.append(name)
    return found

  def to_json(self) -> str:
    """The TF_CONFIG string of this config."""
    return dumps(self.cluster, self.task_type, self.task_index)


def dumps(cluster: Mapping[str, list[str] | tuple[str, ...]], task_type: str,
          task_index: int) -> str:
  """The TF_CONFIG JSON of a cluster and one task of it (what a launcher sets)."""
  return json.dumps({
      "cluster": {job: list(addresses) for job, addresses in cluster.items()},
      "task": {"type": task_type, "index": task_index}
  })


def parse(text: str) -> TFConfig:
  """Validates a TF_CONFIG string into a TFConfig.

  Raises:
    TFConfigError: not JSON or not an object; no "cluster" or "task"; an
      unknown job name; a job that is not a non-empty list of distinct
      "host:port" strings; more than one chief; no chief or worker; a task
      whose type is not a job of the cluster or whose index is out of range
      (an "evaluator" task may be outside the cluster, as TF's sidecar
      evaluator is: then its index is 0).
      The message names the key or task.
  """
  try:
    raw = json.loads(text)
  except json.JSONDecodeError as e:
    raise TFConfigError(f"{ENV_VAR} is not valid JSON ({e}): {text[:200]!r}") from e
  if not isinstance(raw, dict):
    raise TFConfigError(f"{ENV_VAR} must be a JSON object with 'cluster' and 'task', got "
                        f"{type(raw).__name__}")
  for key in ("cluster", "task"):
    if key not in raw:
      raise TFConfigError(f"{ENV_VAR} has no '{key}' (it needs 'cluster' and 'task')")
  cluster = _parse_cluster(raw["cluster"])
  task_type, task_index = _parse_task(raw["task"], cluster)
  rpc_layer = raw.get("rpc_layer", "grpc")
  if not isinstance(rpc_layer, str) or not rpc_layer:
    raise TFConfigError(f"{ENV_VAR}['rpc_layer'] must be a non-empty string, got {rpc_layer!r}")
  return TFConfig(cluster=cluster, task_type=task_type, task_index=task_index, rpc_layer=rpc_layer)


def from_environment(environ: Mapping[str, str] | None = None) -> TFConfig | None:
  """The validated TF_CONFIG of `environ` (default os.environ); None when unset or empty.

  Raises:
    TFConfigError: see `parse`.
  """
  text = (os.environ if environ is None else environ).get(ENV_VAR, "")
  return parse(text) if text.strip() else None


def _parse_cluster(cluster) -> dict[str, tuple[str, ...]]:
  if not isinstance(cluster, dict) or not cluster:
    raise TFConfigError(f"{ENV_VAR}['cluster'] must be a non-empty object of job name -> "
                        f"addresses, got {cluster!r}")
  parsed, seen = {}, {}
  for job, addresses in cluster.items():
    where = f"{ENV_VAR}['cluster']['{job}']"
    if job not in JOB_NAMES:
      raise TFConfigError(f"{ENV_VAR}['cluster'] has unknown job '{job}'; known: "
                          f"{list(JOB_NAMES)}")
    if not isinstance(addresses, list) or not addresses:
      raise TFConfigError(f"{where} must be a non-empty list of 'host:port', got {addresses!r}")
    for index, address in enumerate(addresses):
      _check_address(address, f"{where}[{index}] ({job} {index})")
      if address in seen:
        raise TFConfigError(f"{where}[{index}]: address {address} is also {seen[address]}")
      seen[address] = f"{job} {index}"
    parsed[job] = tuple(addresses)
  if len(parsed.get(CHIEF, ())) > 1:
    raise TFConfigError(f"{ENV_VAR}['cluster']['chief'] has {len(parsed[CHIEF])} tasks; "
                        "a cluster has at most one chief")
  if CHIEF not in parsed and WORKER not in parsed:
    raise TFConfigError(f"{ENV_VAR}['cluster'] has no 'chief' or 'worker' job: nothing trains")
  return parsed


def _check_address(address, where: str) -> None:
  host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
  if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
    raise TFConfigError(f"{ENV_VAR}['cluster'] {where}: expected 'host:port' with a port in "
                        f"1..65535, got {address!r}")


def _parse_task(task, cluster: dict[str, tuple[str, ...]]) -> tuple[str, int]:
  if not isinstance(task, dict):
    raise TFConfigError(f"{ENV_VAR}['task'] must be an object {{'type': ..., 'index': ...}}, "
                        f"got {task!r}")
  for key in ("type", "index"):
    if key not in task:
      raise TFConfigError(f"{ENV_VAR}['task'] has no '{key}'")
  task_type, index = task["type"], task["index"]
  if task_type == EVALUATOR and EVALUATOR not in cluster:
    # TF's convention: the evaluator is outside the training cluster (it reads checkpoints).
    if index != 0 or isinstance(index, bool):
      raise TFConfigError(f"{ENV_VAR}['task'] is evaluator {index!r}: an evaluator outside the "
                          "cluster is evaluator 0")
    return task_type, index
  if task_type not in cluster:
    raise TFConfigError(f"{ENV_VAR}['task']['type'] is {task_type!r}, not a job of the cluster "
                        f"{sorted(cluster)}")
  if isinstance(index, bool) or not isinstance(index, int):
    raise TFConfigError(f"{ENV_VAR}['task']['index'] must be an int, got {index!r}")
  if not 0 <= index < len(cluster[task_type]):
    raise TFConfigError(f"{ENV_VAR}['task'] is {task_type} {index}, but the cluster has "
                        f"{len(cluster[task_type])} '{task_type}' task(s) (indexes 0.."
                        f"{len(cluster[task_type]) - 1})")
  return task_type, index
