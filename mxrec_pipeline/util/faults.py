"""Fault points: kill the process on purpose at a named point of a run's life.

A restart test (or a user rehearsing a preemption) sets the environment
variable `MXREC_FAULT=<point>[:<n>][@<task type>:<index>]`; the process
SIGKILLs itself the n-th time (default 1st) it reaches `<point>`, exactly as a
preempted job dies: no exception, no cleanup, no flush. With `@worker:1` only
the cluster task of that TF_CONFIG dies (one worker of a cluster whose
processes all see the variable). `MXREC_FAULT=hang:<point>...` makes the
process hang there instead, alive but stuck (its Python thread sleeps for
good), as a deadlocked input pipeline would. Points (see docs/restarts.md):

  train_batch        after a training batch (n counts this process's batches)
  validation         at the start of an epoch's validation
  checkpoint_shards  after the table shards of a checkpoint, before ckpt-N
  checkpoint_files   after ckpt-N's files, before its completeness marker
  export             after an export is written, before it is renamed in

Unset (the default), nothing is killed. A run holds one `FaultPoints`.
"""

from __future__ import annotations

import json
import os
import signal
import time

ENV = "MXREC_FAULT"
POINTS = ("train_batch", "validation", "checkpoint_shards", "checkpoint_files", "export")
HANG = "hang:"


def parse(spec: str) -> tuple[str, int]:
  """(point, n) of a `MXREC_FAULT` value "point[:n]" (without its "@task").

  Raises:
    ValueError: an unknown point or an n that is not a positive int (named).
  """
  point, _, count = spec.partition(":")
  if point not in POINTS:
    raise ValueError(f"{ENV}={spec!r}: unknown fault point {point!r}; known: {list(POINTS)}")
  if count and (not count.isdigit() or int(count) < 1):
    raise ValueError(f"{ENV}={spec!r}: the count after ':' must be a positive int")
  return point, int(count or 1)


class FaultPoints:
  """The fault points of one run: counts the times each is reached, kills at the named one.

  Args:
    spec: "point[:n][@type:index]" (see the module docstring), or None: never kills.
    task: This process's cluster task "type:index", or None (no cluster).

  Raises:
    ValueError: a bad spec (see `parse`).
  """

  def __init__(self, spec: str | None = None, task: str | None = None):
    self._hang = bool(spec) and spec.startswith(HANG)
    spec, _, only = (spec or "").removeprefix(HANG).partition("@")
    self._target = parse(spec) if spec and (not only or only == task) else None
    self._counts: dict[str, int] = {}

  @classmethod
  def from_environment(cls) -> "FaultPoints":
    """The FaultPoints of `MXREC_FAULT` (unset or empty: none), for TF_CONFIG's task."""
    try:
      task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
      task = f"{task['type']}:{task['index']}"
    except (ValueError, KeyError, TypeError, AttributeError):
      task = None
    return cls(os.environ.get(ENV) or None, task)

  def reach(self, point: str) -> None:
    """Marks that the run reached `point`; SIGKILLs (or hangs) the process when the spec names
    this time."""
    if point not in POINTS:
      raise ValueError(f"unknown fault point {point!r}; known: {list(POINTS)}")
    self._counts[point] = self._counts.get(point, 0) + 1
    if self._target == (point, self._counts[point]):
      if self._hang:
        print(f"{ENV}: hanging the process at {point}:{self._counts[point]}", flush=True)
        while True:
          time.sleep(3600)
      print(f"{ENV}: killing the process at {point}:{self._counts[point]}", flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
