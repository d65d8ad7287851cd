"""FTRL hash optimizer: NumPy reference step by step (eager, tf.function, session),
TensorFlow's own FtrlOptimizer, mxRec's arguments, the factory."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.optimizers import factory, ftrl
from mxrec_pipeline.util.initialize import init

import sparse_testlib as lib

CAPACITY, DIM = 8, 2
# Repeated ids within each batch; ids 3, 4, 6 skip steps, so their rows must rest.
BATCHES = [
    np.array([[1, 2, 1], [3, 1, 2]], np.int64),
    np.array([[2, 2, 2], [2, 4, 4]], np.int64),
    np.array([[5, 1, 5], [5, 5, 6]], np.int64),
    np.array([[3, 3, 6], [1, 0, 2]], np.int64)
]
TARGETS = [
    np.random.RandomState(10 + step).normal(size=[2, 3, DIM]).astype(np.float32)
    for step in range(len(BATCHES))
]
SETTINGS = {
    "defaults": dict(),
    "regularized": dict(learning_rate_power=-0.3, initial_accumulator_value=0.3,
                        l1_regularization_strength=1.0, l2_regularization_strength=0.1,
                        l2_shrinkage_regularization_strength=0.2),
}


def _reference(kwargs):
  return lib.NumpyFtrl(0.5, lr_power=kwargs.get("learning_rate_power", -0.5),
                       initial_accumulator_value=kwargs.get("initial_accumulator_value", 0.1),
                       l1=kwargs.get("l1_regularization_strength",
                                     0.0), l2=kwargs.get("l2_regularization_strength", 0.0),
                       l2_shrinkage=kwargs.get("l2_shrinkage_regularization_strength", 0.0))


def _loss(emb, target):
  return tf.reduce_sum(tf.square(emb - target))


def _run_eager(kwargs, compiled):
  init()
  table = lib.make_table(dim=DIM, capacity=CAPACITY)
  optimizer = ftrl.create_hash_optimizer(0.5, **kwargs)

  def step(ids, target):
    with tf.GradientTape() as tape:
      loss = _loss(embedding.sparse_lookup(table, ids), target)
    optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])

  step = tf.function(step) if compiled else step
  states = []
  for ids, target in zip(BATCHES, TARGETS):
    step(tf.constant(ids), tf.constant(target))
    slots = {name: optimizer.get_slot("t", name).numpy() for name in ("accum", "linear")}
    states.append((table.variable.numpy(), slots, lib.index_dict(table)))
  return states


def _run_session(kwargs):
  with tf.Graph().as_default():
    init()
    table = lib.make_table(dim=DIM, capacity=CAPACITY)
    optimizer = ftrl.create_hash_optimizer(0.5, **kwargs)
    ids = tf.compat.v1.placeholder(tf.int64, [None, None])
    target = tf.compat.v1.placeholder(tf.float32, [None, None, DIM])
    loss = _loss(embedding.sparse_lookup(table, ids), target)
    grads = tf.compat.v1.gradients(loss, [table.variable])
    train_op = optimizer.apply_gradients(zip(grads, [table.variable]))
    slots = {name: optimizer.get_slot("t", name) for name in ("accum", "linear")}
    export = table.key_index.export()
    states = []
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for ids_value, target_value in zip(BATCHES, TARGETS):
        sess.run(train_op, {ids: ids_value, target: target_value})
        rows, slot_values, (keys, key_rows) = sess.run([table.variable, slots, export])
        states.append((rows, slot_values, dict(zip(keys.tolist(), key_rows.tolist()))))
  return states


RUNNERS = {
    "eager": lambda kwargs: _run_eager(kwargs, False),
    "tf_function": lambda kwargs: _run_eager(kwargs, True), "session": _run_session
}


@pytest.mark.parametrize("mode", list(RUNNERS))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_ftrl_equals_numpy_reference_step_by_step(setting, mode):
  kwargs = SETTINGS[setting]
  reference = _reference(kwargs)
  w = lib.initial_rows(CAPACITY, DIM).astype(np.float64)
  slots = {
      "accum": np.full_like(w, reference.initial_accumulator_value), "linear": np.zeros_like(w)
  }
  before_w = lib.initial_rows(CAPACITY, DIM)
  for t, ((got_w, got_slots, index), ids,
          target) in enumerate(zip(RUNNERS[mode](kwargs), BATCHES, TARGETS), start=1):
    rows = np.vectorize(index.get)(ids)
    touched, summed = lib.summed_row_grads(rows.reshape(-1),
                                           (2.0 * (w[rows] - target)).reshape(-1, DIM))
    reference.step(w, slots, touched, summed, t)
    np.testing.assert_allclose(got_w, w, rtol=1e-5, atol=1e-6, err_msg=f"rows, step {t}")
    for name in slots:
      np.testing.assert_allclose(got_slots[name], slots[name], rtol=1e-5, atol=1e-6,
                                 err_msg=f"slot {name}, step {t}")
    resting = np.setdiff1d(np.arange(CAPACITY), touched)
    np.testing.assert_array_equal(got_w[resting], before_w[resting])
    before_w = got_w
  if setting == "regularized":  # L1 drives some weights to exactly zero.
    assert np.count_nonzero(got_w[touched] == 0.0) > 0


def test_ftrl_equals_tensorflow_ftrl_on_duplicate_slices():
  init()
  table = lib.make_table(dim=DIM, capacity=CAPACITY)
  kwargs = SETTINGS["regularized"]
  optimizer = ftrl.create_hash_optimizer(0.2, **kwargs)
  dense = tf.Variable(lib.initial_rows(CAPACITY, DIM))
  tf_optimizer = tf.compat.v1.train.FtrlOptimizer(0.2, **kwargs)
  for step in range(3):
    grad = tf.IndexedSlices(
        tf.constant(np.random.RandomState(step).normal(size=[4, DIM]).astype(np.float32)),
        tf.constant([1, 3, 1, 5 + step], tf.int64), tf.constant([CAPACITY, DIM], tf.int64))
    optimizer.apply_gradients([(grad, table.variable)])
    tf_optimizer.apply_gradients([(grad, dense)])
  np.testing.assert_allclose(table.variable.numpy(), dense.numpy(), rtol=1e-5, atol=1e-6)
  for slot in ("accum", "linear"):
    np.testing.assert_allclose(
        optimizer.get_slot("t", slot).numpy(),
        tf_optimizer.get_slot(dense, slot).numpy(), rtol=1e-5, atol=1e-6)


def test_mxrec_signature_slot_names_and_factory():
  init()
  table = lib.make_table(dim=DIM, capacity=CAPACITY)
  optimizer = ftrl.create_hash_optimizer(0.1, False, "MyFtrl", accum_name="n", linear_name="z")
  assert optimizer.slot_initial_values == {"n": 0.1, "z": 0.0}
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(embedding.sparse_lookup(table, tf.constant([1, 2], tf.int64)))
  optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])
  assert optimizer.get_slot("t", "n").name == "t/MyFtrl/n:0"
  assert isinstance(factory.get_optimizer("ftrl", 0.1, l1_regularization_strength=0.1), ftrl.Ftrl)
  assert "ftrl" in str(pytest.raises(ValueError, factory.get_optimizer, "nope", 0.1).value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(learning_rate=0.0), r"`learning_rate` must be positive, got 0.0"),
    (dict(learning_rate_power=0.5), r"`learning_rate_power` must be <= 0, got 0.5"),
    (dict(initial_accumulator_value=0.0), r"`initial_accumulator_value` must be positive"),
    (dict(l1_regularization_strength=-1.0), r"`l1_regularization_strength` must be >= 0"),
    (dict(l2_shrinkage_regularization_strength=-1.0),
     r"`l2_shrinkage_regularization_strength` must be >= 0"),
    (dict(accum_name="a", linear_name="a"), r"`accum_name` and `linear_name` must differ"),
    (dict(linear_name="x/y"), r"`linear_name` must be a string without '/'"),
])
def test_ftrl_arguments_are_validated(kwargs, message):
  kwargs = dict(dict(learning_rate=0.1), **kwargs)
  with pytest.raises(ValueError, match=message):
    ftrl.create_hash_optimizer(**kwargs)


def test_unknown_keyword_raises_instead_of_being_dropped():
  with pytest.raises(TypeError, match=r"unexpected keyword argument 'l1'"):
    ftrl.create_hash_optimizer(0.1, l1=0.5)  # pylint: disable=unexpected-keyword-arg


def test_ftrl_refuses_dynamic_expansion_runs():
  init(use_dynamic_expansion=True)
  with pytest.raises(
      ValueError, match=r"Ftrl: The dynamic expansion mode is not compatible "
      r"with the optimizer"):
    ftrl.create_hash_optimizer(0.1)
