"""Epochs of a training run: their steps, their shuffle seeds, and the gate that bounds insertion.

A run trains its epochs on one tf.data iterator (one `model.fit` over the
epochs that have the same number of steps): building a dataset, starting its
iterator and instantiating its functions costs about a second of CPU on the
MovieLens job, and paying it once instead of once per epoch is what
`BaseDatasetBuilder.build_train_epochs` is for. Insertion of the ids still
never runs past the epoch being trained (docs/restarts.md): an `EpochGate`
holds the stream at each epoch's first batch, before its insertion, until the
pipeline releases that epoch at `on_epoch_begin`, which Keras calls after the
previous epoch's validation and checkpoint.
"""

from __future__ import annotations

import math
from typing import Sequence

import tensorflow as tf


def epoch_seed(seed: int | None, epoch: int) -> int | None:
  """The shuffle seed of epoch `epoch` of a run seeded `seed` (None: None).

  (seed * 1_000_003 + epoch) mod 2**31: distinct for the epochs of a run and
  independent of when the run started or resumed.
  """
  return None if seed is None else (seed * 1_000_003 + epoch) % 2**31


def epoch_steps(num_epochs: int, num_train_steps: int | None) -> list[int | None]:
  """Training steps of each epoch: None (one pass each) or exactly num_train_steps in all.

  Epochs get ceil(num_train_steps / num_epochs) steps, the last one the rest;
  epochs that would get none are dropped: (2, 8) -> [4, 4], (3, 8) -> [3, 3, 2],
  (20, 1) -> [1], (3, None) -> [None, None, None].
  """
  if num_train_steps is None:
    return [None] * num_epochs
  per_epoch = math.ceil(num_train_steps / num_epochs)
  return [min(per_epoch, num_train_steps - start) for start in range(0, num_train_steps, per_epoch)]


def epoch_groups(plan: Sequence[int | None], start_epoch: int) -> list[tuple[int, int]]:
  """The runs of consecutive epochs of `plan[start_epoch:]` that have the same steps.

  Each group is trained by one `model.fit` on one iterator (Keras takes one
  `steps_per_epoch` per fit): [4, 4, 4, 2] from 0 -> [(0, 3), (3, 4)];
  [None] * 6 from 2 -> [(2, 6)]; [] -> [].

  Returns:
    (first epoch, end epoch) pairs, end exclusive, covering
    `range(start_epoch, len(plan))` in order.
  """
  groups = []
  for epoch in range(start_epoch, len(plan)):
    if groups and plan[epoch] == plan[groups[-1][0]]:
      groups[-1] = (groups[-1][0], epoch + 1)
    else:
      groups.append((epoch, epoch + 1))
  return groups


class EpochGate(tf.keras.callbacks.Callback):
  """Holds a training stream at each epoch's first batch until the epoch is released.

  `hold` is mapped over each epoch's batches before insertion (see
  `BaseDatasetBuilder.build_train_epochs`): the first batch of epoch `e`
  waits for a token that `on_epoch_begin(e)` (or `release(e)`) puts in a
  FIFOQueue, so the stream's prefetch parses ahead into the next epoch but
  inserts none of its ids until the previous epoch has been trained,
  validated and checkpointed. Keras calls `on_epoch_begin` on the run's
  callbacks; the pipeline puts the gate among them.

  The queue is a stock TF resource on the host (`/CPU:0`). `close()` ends
  the gate: a batch still waiting fails, which ends its iterator (the
  pipeline closes the gate when training stops, e.g. EarlyStopping before
  the last epoch of a stream).

  Args:
    epochs: How many epochs the gate may release ahead of the stream, > 0
      (the queue's capacity; the pipeline passes the run's epochs).

  Raises:
    ValueError: `epochs` < 1.
  """

  def __init__(self, epochs: int):
    super().__init__()
    if epochs < 1:
      raise ValueError(f"EpochGate: `epochs` must be positive, got {epochs}")
    with tf.device("/CPU:0"):
      self._queue = tf.queue.FIFOQueue(capacity=epochs, dtypes=[tf.int64], shapes=[[]],
                                       name="epoch_gate")

  def release(self, epoch: int) -> None:
    """Lets the stream insert the batches of epoch `epoch` (0-based)."""
    self._queue.enqueue(tf.constant(epoch, tf.int64))

  def on_epoch_begin(self, epoch, logs=None):
    self.release(epoch)

  def close(self) -> None:
    """Ends the gate: the stream's waiting batch, if any, fails (its iterator is being dropped)."""
    if not self._queue.is_closed():
      self._queue.close(cancel_pending_enqueues=True)

  def hold(self, epoch: tf.Tensor, index: tf.Tensor, element):
    """A tf.data map function: `element` once its epoch is released (when `index` is 0).

    tf.data goes on to the next elements after one fails, so a failed wait
    must stop them too: a batch whose wait fails (the gate closed, or another
    epoch released, which closes the gate) fails, and so does every batch
    after it while the gate is closed.

    Args:
      epoch: int64 scalar, the epoch of the element's stream.
      index: int64 scalar, the element's position in its epoch (0: wait).
      element: The batch (any nest of tensors, ragged and sparse included).

    Returns:
      `element`, each component computed after the wait, so that no later
      op (insertion) can read it before the epoch is released.

    Raises (when the batch runs):
      InvalidArgumentError: the released epoch is not `epoch` (the stream and
        the training loop disagree on which epoch is next), or the gate is
        closed (the run stopped before this epoch), or it closed while the
        batch waited (tf.data reports the queue's OutOfRange this way).
    """

    def close():
      with tf.control_dependencies([self._queue.close(cancel_pending_enqueues=True)]):
        return tf.constant(False)

    def wait():
      token = self._queue.dequeue()
      same = tf.cond(tf.equal(token, epoch), lambda: tf.constant(True), close)
      check = tf.debugging.Assert(
          same, ["EpochGate: released epoch", token, "but the stream's next epoch is", epoch])
      with tf.control_dependencies([check]):
        return tf.identity(token)

    def still_open():
      check = tf.debugging.Assert(
          tf.logical_not(self._queue.is_closed()),
          ["EpochGate: closed (the run stopped); no batch of epoch", epoch, "is inserted"])
      with tf.control_dependencies([check]):
        return tf.identity(epoch)

    token = tf.cond(tf.equal(index, 0), wait, still_open)
    with tf.control_dependencies([token]):
      return tf.nest.map_structure(tf.identity, element, expand_composites=True)
