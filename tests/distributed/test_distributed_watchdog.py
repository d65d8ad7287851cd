"""distributed/watchdog.py with a fake key-value store and clock: who is named, and when.

Two or three workers publish progress; a worker whose own progress stalls for
the timeout names the workers behind the others, or says every worker waits
at the same point; one whose progress moves never fires; an unreadable peer
is named with "no answer"; nothing fires before the first batch. The real
store and a hung worker: tests/cluster/test_cluster_training.py.
"""

import threading
import time

import pytest

from mxrec_pipeline.distributed import watchdog


class FakeStore:
  """A key-value store shared by the fake workers; a get of an absent key waits, as the real one."""

  def __init__(self):
    self.values = {}
    self._changed = threading.Condition()

  def set_config_key_value(self, key, value):
    with self._changed:
      assert key not in self.values, key  # The real store refuses to overwrite.
      self.values[key] = value
      self._changed.notify_all()

  def delete_config_key_value(self, key):
    with self._changed:
      del self.values[key]

  def get_config_key_value(self, key):
    with self._changed:
      self._changed.wait_for(lambda: key in self.values)
      return self.values[key]


def _workers(names, timeout_s=10.0):
  store, now, stuck = FakeStore(), [0.0], {}
  dogs = {
      name: watchdog.Watchdog(name, names, timeout_s, clock=lambda: now[0], store=store,
                              on_stuck=lambda m, n=name: stuck.setdefault(n, m),
                              read_timeout_s=0.2) for name in names
  }
  for dog in dogs.values():
    dog._publish()  # What start() does first, without the thread.
  return dogs, now, store


def test_the_worker_behind_the_others_is_named_after_the_timeout():
  dogs, now, _ = _workers(["worker 0", "worker 1"])
  for dog in dogs.values():
    dog.tick("began train batch 4")
    dog.tick("ended train batch 4")
    assert dog.check() is None
  dogs["worker 0"].tick("began train batch 5")  # Worker 1 hangs before its batch 5.
  assert [d.check() for d in dogs.values()] == [None, None]
  now[0] = 9.9
  assert [d.check() for d in dogs.values()] == [None, None]
  now[0] = 10.0
  message = dogs["worker 0"].check()
  assert message == ("worker 0 of a 2-worker cluster stopped: no progress for 10 s "
                     "(pipeline.stuck_worker_timeout_s 10): worker 1 stuck behind the others "
                     "(worker 0: began train batch 5; worker 1: ended train batch 4)")


def test_workers_waiting_at_the_same_point_are_all_reported():
  dogs, now, _ = _workers(["chief 0", "worker 0", "worker 1"])
  for dog in dogs.values():
    dog.tick("began train batch 7")
    dog.check()
  now[0] = 30.0
  message = dogs["worker 1"].check()
  assert message.startswith("worker 1 of a 3-worker cluster stopped: no progress for 30 s")
  assert "every worker waits at the same point, an input pipeline or a collective inside a " \
      "step is stuck (chief 0: began train batch 7; worker 0: began train batch 7; worker 1: " \
      "began train batch 7)" in message


def test_progress_keeps_the_watchdog_quiet_and_a_silent_peer_gives_no_answer():
  dogs, now, store = _workers(["worker 0", "worker 1"])
  for second in range(1, 50):
    now[0] = float(second)
    dogs["worker 0"].tick(f"ended train batch {second}")
    assert dogs["worker 0"].check() is None
  del store.values["mxrec_progress/worker_1"]  # A peer whose progress cannot be read.
  now[0] = 100.0
  assert "worker 1 stuck behind the others (worker 0: ended train batch 49; worker 1: no " \
      "answer)" in dogs["worker 0"].check()


def test_the_thread_calls_on_stuck_once():
  store, fired = FakeStore(), threading.Event()
  messages = []
  dog = watchdog.Watchdog("worker 0", ["worker 0"], 0.3, store=store, on_stuck=lambda m:
                          (messages.append(m), fired.set()))
  dog.start(poll_s=0.05)
  time.sleep(0.5)
  assert not fired.is_set()  # Before the first batch (setting up, tracing) nothing fires.
  dog.tick("began train batch 0")
  assert fired.wait(5)
  dog.stop()
  assert len(messages) == 1 and "worker 0 of a 1-worker cluster stopped" in messages[0]


@pytest.mark.parametrize("value", [0, -1, float("inf")])
def test_bad_timeouts_are_refused(value):
  from mxrec_pipeline import hparams  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="`stuck_worker_timeout_s` must be a finite positive"):
    hparams.PipelineHparams(model_dir="m", stuck_worker_timeout_s=value)
