"""Hash optimizers equal NumPy references step by step: eager, tf.function, TF1 session."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.optimizers import adagrad, gradient_descent, lazy_adam
from mxrec_pipeline.util.initialize import init

import sparse_testlib as lib

CAPACITY, DIM = 10, 2
# Repeated ids within each batch; ids 3, 4, 6, 7 skip steps, so their rows must rest.
BATCHES = [
    np.array([[1, 2, 1], [3, 1, 2]], np.int64),
    np.array([[2, 2, 2], [2, 4, 4]], np.int64),
    np.array([[5, 1, 5], [5, 5, 6]], np.int64),
    np.array([[3, 3, 6], [1, 7, 2]], np.int64),
]
TARGETS = [
    np.random.RandomState(step).normal(size=[2, 3, DIM]).astype(np.float32)
    for step in range(len(BATCHES))
]

OPTIMIZERS = {
    "lazy_adam": (lambda: lazy_adam.create_hash_optimizer(learning_rate=0.1, beta1=0.8, beta2=0.95,
                                                          epsilon=1e-3),
                  lambda: lib.NumpyLazyAdam(0.1, beta1=0.8, beta2=0.95, epsilon=1e-3), 0.0),
    "gradient_descent":
        (lambda: gradient_descent.create_hash_optimizer(0.1), lambda: lib.NumpySgd(0.1), None),
    "adagrad": (lambda: adagrad.create_hash_optimizer(0.3, initial_accumulator_value=0.2),
                lambda: lib.NumpyAdagrad(0.3, initial_accumulator_value=0.2), 0.2),
}


def _loss(emb, target):
  return tf.reduce_sum(tf.square(emb - target))


def _run_eager(make_optimizer, compiled):
  """[(rows, slots, index, iterations)] after each step."""
  init()
  table = lib.make_table(dim=DIM, capacity=CAPACITY)
  optimizer = make_optimizer()

  def step(ids, target):
    with tf.GradientTape() as tape:
      loss = _loss(embedding.sparse_lookup(table, ids), target)
    grad = tape.gradient(loss, table.variable)
    optimizer.apply_gradients([(grad, table.variable)])

  if compiled:
    step = tf.function(step)
  states = []
  for ids, target in zip(BATCHES, TARGETS):
    step(tf.constant(ids), tf.constant(target))
    slots = {name: optimizer.get_slot("t", name).numpy() for name in optimizer.slot_initial_values}
    states.append(
        (table.variable.numpy(), slots, lib.index_dict(table), optimizer.iterations.numpy()))
  return states


def _run_session(make_optimizer):
  """As _run_eager, in a tf.compat.v1 graph and session (eager stays on elsewhere)."""
  with tf.Graph().as_default():
    init()
    table = lib.make_table(dim=DIM, capacity=CAPACITY)
    optimizer = make_optimizer()
    ids = tf.compat.v1.placeholder(tf.int64, [None, None])
    target = tf.compat.v1.placeholder(tf.float32, [None, None, DIM])
    loss = _loss(embedding.sparse_lookup(table, ids), target)
    grads = tf.compat.v1.gradients(loss, [table.variable])
    assert isinstance(grads[0], tf.IndexedSlices)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = optimizer.apply_gradients(zip(grads, [table.variable]), global_step=global_step)
    assert isinstance(train_op, tf.Operation)
    slots = {name: optimizer.get_slot("t", name) for name in optimizer.slot_initial_values}
    export = table.key_index.export()
    states = []
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for step, (ids_value, target_value) in enumerate(zip(BATCHES, TARGETS)):
        sess.run(train_op, {ids: ids_value, target: target_value})
        rows, slot_values, (keys, key_rows), iterations, gstep = sess.run(
            [table.variable, slots, export, optimizer.iterations, global_step])
        assert gstep == step + 1
        states.append((rows, slot_values, dict(zip(keys.tolist(), key_rows.tolist())), iterations))
  return states


RUNNERS = {
    "eager": lambda make: _run_eager(make, compiled=False),
    "tf_function": lambda make: _run_eager(make, compiled=True),
    "session": _run_session,
}


@pytest.mark.parametrize("mode", list(RUNNERS))
@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_optimizer_equals_numpy_reference_step_by_step(optimizer_name, mode):
  make_optimizer, make_reference, slot_initial = OPTIMIZERS[optimizer_name]
  reference = make_reference()
  w = lib.initial_rows(CAPACITY, DIM).astype(np.float64)
  shape = [CAPACITY, DIM]
  slots = {name: np.full(shape, slot_initial, np.float64) for name in reference.slot_names}

  states = RUNNERS[mode](make_optimizer)
  assert len(states) == len(BATCHES)
  before_w, before_slots = lib.initial_rows(
      CAPACITY, DIM), {name: s.astype(np.float32) for name, s in slots.items()}
  for t, ((got_w, got_slots, index, iterations), ids,
          target) in enumerate(zip(states, BATCHES, TARGETS), start=1):
    rows = np.vectorize(index.get)(ids)
    grads = 2.0 * (w[rows] - target)  # d loss / d emb at every position.
    touched, summed = lib.summed_row_grads(rows.reshape(-1), grads.reshape(-1, DIM))
    reference.step(w, slots, touched, summed, t)

    assert iterations == t
    assert sorted(got_slots) == sorted(slots)
    np.testing.assert_allclose(got_w, w, rtol=1e-5, atol=1e-6, err_msg=f"rows, step {t}")
    for name in slots:
      np.testing.assert_allclose(got_slots[name], slots[name], rtol=1e-5, atol=1e-7,
                                 err_msg=f"slot {name}, step {t}")
    # Lazy: rows this batch did not touch, and their slots, kept their exact values.
    resting = np.setdiff1d(np.arange(CAPACITY), touched)
    np.testing.assert_array_equal(got_w[resting], before_w[resting])
    for name in slots:
      np.testing.assert_array_equal(got_slots[name][resting], before_slots[name][resting])
    before_w, before_slots = got_w, got_slots


def test_duplicate_slices_of_one_row_are_summed_before_the_update():
  # Adam is not linear in the gradient: applying two slices of one row separately
  # would differ from one update with their sum.
  init()
  table = lib.make_table(dim=DIM, capacity=CAPACITY)
  optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.1)
  values = tf.constant([[1.0, -2.0], [3.0, 0.5], [0.25, 0.25]])
  grad = tf.IndexedSlices(values, tf.constant([4, 1, 4], tf.int64), tf.constant([CAPACITY, DIM]))
  optimizer.apply_gradients([(grad, table.variable)])

  reference = lib.NumpyLazyAdam(0.1)
  w = lib.initial_rows(CAPACITY, DIM).astype(np.float64)
  slots = {"m": np.zeros_like(w), "v": np.zeros_like(w)}
  reference.step(w, slots, np.array([1, 4]), np.array([[3.0, 0.5], [1.25, -1.75]]), 1)
  np.testing.assert_allclose(table.variable.numpy(), w, rtol=1e-6)
  np.testing.assert_allclose(optimizer.get_slot("t", "m").numpy(), slots["m"], rtol=1e-6)


def test_apply_gradients_errors_and_none_gradients():
  init()
  table = lib.make_table()
  optimizer = lazy_adam.create_hash_optimizer()
  dense = tf.Variable(tf.zeros([3]), name="dense_w")
  with pytest.raises(ValueError, match=r"variable 'dense_w:0' is not a table of the current run"):
    optimizer.apply_gradients([(tf.ones([3]), dense)])
  with pytest.raises(ValueError, match=r"the gradient of table 't' is dense \(EagerTensor\)"):
    optimizer.apply_gradients([(tf.ones([10, 3]), table.variable)])
  with pytest.raises(KeyError):
    optimizer.get_slot("t", "m")  # No slots before the first apply_gradients.
  # Only None gradients: nothing to update, so no step is counted either.
  optimizer.apply_gradients([(None, table.variable)])
  assert optimizer.iterations.numpy() == 0
  np.testing.assert_array_equal(table.variable.numpy(), lib.initial_rows(10, 3))


@pytest.mark.parametrize("make, message", [
    (lambda: lazy_adam.create_hash_optimizer(learning_rate=0.0), r"`learning_rate` must be "
     r"positive, got 0.0"),
    (lambda: lazy_adam.create_hash_optimizer(beta1=1.0), r"`beta1` must be in \[0, 1\), got 1.0"),
    (lambda: lazy_adam.create_hash_optimizer(beta2=-0.1), r"`beta2` must be in \[0, 1\)"),
    (lambda: lazy_adam.create_hash_optimizer(epsilon=0), r"`epsilon` must be positive, got 0"),
    (lambda: gradient_descent.create_hash_optimizer(-1.0), r"`learning_rate` must be positive"),
    (lambda: adagrad.create_hash_optimizer(initial_accumulator_value=0.0),
     r"`initial_accumulator_value` must be positive, got 0.0"),
])
def test_optimizer_arguments_are_validated(make, message):
  with pytest.raises(ValueError, match=message):
    make()
