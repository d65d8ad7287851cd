"""keras/save_schedule.SaveSchedule: which epoch ends save, and which saves are full.

Hand-worked sequences of save points (training step at each epoch end) for
each schedule of hparams.CheckpointSchedule, with a fake clock for the
seconds; a restart continuing a chain from its checkpoint's record.
"""

import pytest

from mxrec_pipeline.hparams import CheckpointSchedule, PipelineHparams
from mxrec_pipeline.keras.save_schedule import SaveSchedule


class FakeClock:

  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def _run(schedule: SaveSchedule, steps, clock=None, times=None) -> str:
  """Save points at `steps` (and `times`): "F" full save, "D" delta, "-" none; last one final."""
  marks = []
  for i, step in enumerate(steps):
    if clock is not None:
      clock.now = times[i]
    if not schedule.wants_save(step, final=i == len(steps) - 1):
      marks.append("-")
      continue
    now = schedule.now()
    full = schedule.full_due(step, now)
    schedule.saved(step, full, now)
    marks.append("F" if full else "D")
  return "".join(marks)


def _schedule(clock=None, **raw) -> SaveSchedule:
  return SaveSchedule(CheckpointSchedule.from_dict(raw), clock or FakeClock())


def test_by_default_every_epoch_saves_in_full():
  assert _run(_schedule(), [3, 6, 9, 12]) == "FFFF"


def test_full_every_epochs_counts_the_saves_of_a_chain():
  assert _run(_schedule(full_every_epochs=3), range(1, 8)) == "FDDFDDF"


def test_full_every_steps_counts_from_the_chain_s_full_save():
  # Full at step 2; steps 4, 6 within 5 of it; 8 is 6 past it; 10 within 5 of 8.
  assert _run(_schedule(full_every_steps=5), [2, 4, 6, 8, 10]) == "FDDFD"


def test_delta_every_steps_skips_epoch_ends_and_saves_the_last():
  # Saves at step 1 (the first), 3 (2 past 1), 5 (full: 4 past 1), 7; and 8, the last.
  assert _run(_schedule(full_every_steps=4, delta_every_steps=2), range(1, 9)) == "F-D-F-DD"


def test_seconds_read_one_clock_reading_per_decision():
  clock = FakeClock()
  schedule = _schedule(clock, full_every_s=60, delta_every_s=20)
  # t = 0 full; 10: too soon; 25 delta; 30 too soon; 61 full (61 s after the chain's start);
  # 70 too soon; 75 final.
  marks = _run(schedule, [1, 2, 3, 4, 5, 6, 7], clock,
               [1000 + t for t in (0, 10, 25, 30, 61, 70, 75)])
  assert marks == "F-D-F-D"
  assert schedule.chain_record() == {"full_step": 5, "full_time": 1061.0}


def test_a_restart_keeps_the_chain_s_full_save_and_counts_the_gap_from_the_restore():
  clock = FakeClock()
  before = _schedule(clock, full_every_s=60, delta_every_s=20)
  assert _run(before, [1], clock, [1000]) == "F"
  record = before.chain_record()
  after = _schedule(clock, full_every_s=60, delta_every_s=20)
  clock.now = 1040
  after.restored(1, chain_length=1, record=record)
  # 50: 10 s after the restore, no save; 65: a full one (65 s after the chain's full save).
  assert _run(after, [2, 3, 4], clock, [1050, 1065, 1066]) == "-FD"


def test_a_restore_that_cannot_build_on_its_chain_saves_in_full_next():
  schedule = _schedule(full_every_epochs=4)
  schedule.restored(7, chain_length=None, record={"full_step": 1})  # Another shard count.
  assert schedule.full_due(8, None)
  old = _schedule(full_every_steps=10)
  old.restored(7, chain_length=2, record=None)  # A checkpoint of a version before schedules.
  assert not old.full_due(16, None) and old.full_due(17, None)  # Counted from the restore.


def test_the_clock_is_read_only_for_schedules_in_seconds():

  def clock():
    raise AssertionError("read the clock")

  schedule = SaveSchedule(CheckpointSchedule.from_dict({"full_every_steps": 2}), clock)
  assert _run(schedule, [1, 2, 3, 4]) == "FDFD"
  assert schedule.chain_record() == {"full_step": 3}


@pytest.mark.parametrize("raw, message", [
    ({"full_every_steps": 0}, r"`checkpoint.full_every_steps` must be a positive int, got 0"),
    ({"keep_full": 1.5}, r"`checkpoint.keep_full` must be a positive int, got 1.5"),
    ({"full_every_s": -1}, r"`checkpoint.full_every_s` must be a positive number of seconds"),
    ({"delta_every_s": "60"}, r"`checkpoint.delta_every_s` must be a positive number of seconds"),
    ({"delta_every_s": float("inf")}, r"`checkpoint.delta_every_s` must be a positive number"),
    ({"full_every_epochs": 2, "full_every_s": 60
     }, r"full_every_epochs and full_every_s both set; choose one full-save schedule"),
    ({"full_every_steps": 2, "delta_every_steps": 1, "delta_every_s": 5
     }, r"delta_every_steps and delta_every_s both set"),
    ({"delta_every_steps": 5}, r"`checkpoint.delta_every_steps` schedules delta saves, but every "
     r"save is full: set full_every_steps"),
    ({"delta_every_s": 5, "full_every_epochs": 1}, r"`checkpoint.delta_every_s` schedules delta"),
])
def test_schedule_errors_name_the_key(raw, message):
  with pytest.raises(ValueError, match=message):
    PipelineHparams(model_dir="m", checkpoint=raw)


def test_the_checkpoint_callback_saves_a_skipped_last_epoch_when_training_ends():
  from mxrec_pipeline.keras.callbacks import SparseCheckpoint  # pylint: disable=import-outside-toplevel

  class Checkpoint:  # What SparseCheckpoint uses of a TrainingCheckpoint.

    def __init__(self, wants):
      self.wants, self.saves = list(wants), []

    def wants_save(self):
      return self.wants.pop(0)

    def save(self, epochs_done):
      self.saves.append(epochs_done)

  checkpoint = Checkpoint([True, False, False])
  callback = SparseCheckpoint(checkpoint)
  for epoch in range(3):
    callback.on_epoch_end(epoch)
  assert checkpoint.saves == [1]
  callback.on_train_end()  # The last epoch (3), or the epoch an early stop ended on.
  callback.on_train_end()
  assert checkpoint.saves == [1, 3]
  checkpoint = Checkpoint([False, True])
  callback = SparseCheckpoint(checkpoint)
  callback.on_epoch_end(0)
  callback.on_epoch_end(1)
  callback.on_train_end()  # Epoch 2 was saved: nothing more.
  assert checkpoint.saves == [2]
