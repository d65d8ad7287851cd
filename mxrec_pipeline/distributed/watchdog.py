"""A stuck MultiWorkerMirroredStrategy worker ends the job, named, instead of hanging it.

A worker that is alive but stuck (its Python or its input pipeline hung)
answers the strategy's health checks from gRPC threads, and its peers wait in
their collectives forever. Each worker therefore publishes its progress, a
count of the training and validation batches it began and ended, in the
cluster's coordination-service key-value store (`mxrec_progress/<task>`),
and a watchdog thread watches its own: when it has not moved for
`stuck_worker_timeout_s` (counted from its first batch), the worker reads every
worker's published progress,
names the ones behind the others (all of them when every worker waits at the
same point: an input pipeline or a collective stuck inside a step), prints
the error and exits with status 1; the launcher, or the cluster manager,
then stops the rest. One daemon thread per process, no per-collective
timeout threads (TF 2.15 keeps one per collective op, docs/distributed.md).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

import tensorflow as tf
from tensorflow.python.eager import context  # The coordination service's key-value store.

KEY = "mxrec_progress/{}"
READ_TIMEOUT_S = 5.0  # A peer's progress that cannot be read within this counts as unknown.


def _exit(message: str) -> None:
  print(f"mxrec-pipeline train: error: {message}", file=sys.stderr, flush=True)
  os._exit(1)  # The main thread is blocked in a collective: nothing else can end it.


class Watchdog:
  """Publishes this worker's progress and ends the process when it stalls (see the module).

  Args:
    task: This worker's task name ("worker 1", "chief 0").
    tasks: Every worker's task name, this one included (all train in lockstep).
    timeout_s: Seconds without progress of this worker that end it. Longer
      than the longest pause between two batches: a checkpoint save, an
      export, the first batch's tracing.
    clock: Seconds, `time.monotonic` by default (tests pass a fake).
    on_stuck: Called with the error message on a stall; the default prints
      it and exits with status 1.
    store: An object with set_config_key_value, get_config_key_value and
      delete_config_key_value (default: the coordination service's, through
      TF's eager context).
    read_timeout_s: A worker whose progress cannot be read within this
      counts as giving no answer.
  """

  def __init__(self, task: str, tasks: list[str], timeout_s: float,
               clock: Callable[[], float] = time.monotonic, on_stuck: Callable[[str], None] = _exit,
               store=None, read_timeout_s: float = READ_TIMEOUT_S):
    self._task, self._tasks, self._timeout_s = task, list(tasks), timeout_s
    self._clock, self._on_stuck, self._read_timeout_s = clock, on_stuck, read_timeout_s
    self._store = store if store is not None else context.context()
    self._lock = threading.Lock()
    self._count, self._where = 0, "starting"
    self._published = None
    self._last_change = clock()
    self._stop = threading.Event()
    self._thread = None

  def tick(self, where: str) -> None:
    """Records progress: `where` is what this worker just did ("train batch 12 ended")."""
    with self._lock:
      self._count += 1
      self._where = where

  def start(self, poll_s: float | None = None) -> None:
    """Publishes the first progress and starts the watching thread (every `poll_s` seconds)."""
    self._publish()
    poll_s = poll_s if poll_s is not None else max(0.2, min(5.0, self._timeout_s / 10))
    self._thread = threading.Thread(target=self._run, args=(poll_s,), daemon=True,
                                    name="mxrec-watchdog")
    self._thread.start()

  def stop(self) -> None:
    """Stops watching (the end of training)."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=10)

  def check(self) -> str | None:
    """One round: publishes new progress; on a stall, the error message (else None)."""
    now = self._clock()
    with self._lock:
      count, where = self._count, self._where
    if count != self._published or count == 0:  # Before the first batch: setting up, tracing.
      if count != self._published:
        self._publish(count, where)
      self._last_change = now
      return None
    if now - self._last_change < self._timeout_s:
      return None
    return self._stall_message(now - self._last_change)

  def _run(self, poll_s: float) -> None:
    while not self._stop.wait(poll_s):
      try:
        message = self.check()
      except tf.errors.OpError:  # The store is gone (the leader ended): the job ends anyway.
        return
      if message is not None:
        self._on_stuck(message)
        return

  def _publish(self, count: int = 0, where: str = "starting") -> None:
    key = KEY.format(self._task.replace(" ", "_"))
    if self._published is not None:
      self._store.delete_config_key_value(key)
    self._store.set_config_key_value(key, f"{count} {where}")
    self._published = count

  def _read(self, task: str) -> tuple[int, str] | None:
    """`task`'s published (count, where), or None when it cannot be read in time."""
    out = []

    def read():
      try:
        out.append(self._store.get_config_key_value(KEY.format(task.replace(" ", "_"))))
      except tf.errors.OpError:
        pass

    reader = threading.Thread(target=read, daemon=True)  # A get waits while the key is absent.
    reader.start()
    reader.join(self._read_timeout_s)
    if not out:
      return None
    count, _, where = out[0].partition(" ")
    return int(count), where

  def _stall_message(self, stalled_s: float) -> str:
    progress = {task: self._read(task) for task in self._tasks}
    known = [p[0] for p in progress.values() if p is not None]
    ahead = max(known, default=None)
    behind = [
        task for task, p in progress.items() if p is None or (ahead is not None and p[0] < ahead)
    ]
    states = "; ".join(
        f"{task}: {'no answer' if p is None else p[1]}" for task, p in progress.items())
    head = (f"{self._task} of a {len(self._tasks)}-worker cluster stopped: no progress for "
            f"{stalled_s:.0f} s (pipeline.stuck_worker_timeout_s {self._timeout_s:g})")
    if behind:
      return f"{head}: {' and '.join(behind)} stuck behind the others ({states})"
    return (f"{head}: every worker waits at the same point, an input pipeline or a collective "
            f"inside a step is stuck ({states})")


class WatchdogCallback(tf.keras.callbacks.Callback):
  """Ticks a Watchdog at every batch's begin and end, in training and in validation."""

  def __init__(self, watchdog: Watchdog):
    super().__init__()
    self._watchdog = watchdog
    self._supports_tf_logs = True  # It reads no logs: Keras need not fetch them every batch.

  def on_train_batch_begin(self, batch, logs=None):
    self._watchdog.tick(f"began train batch {batch}")

  def on_train_batch_end(self, batch, logs=None):
    self._watchdog.tick(f"ended train batch {batch}")

  def on_test_batch_begin(self, batch, logs=None):
    self._watchdog.tick(f"began validation batch {batch}")

  def on_test_batch_end(self, batch, logs=None):
    self._watchdog.tick(f"ended validation batch {batch}")

  def on_epoch_end(self, epoch, logs=None):
    self._watchdog.tick(f"ended epoch {epoch + 1}")
