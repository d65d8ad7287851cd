"""*_by_addr optimizers on dynamic-expansion tables equal the plain optimizers'
NumPy references step by step (eager, tf.function, session with table.variable,
session with mxRec's collections), while the table grows past its
device_vocabulary_size; and their mxRec-style errors."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.constants import constants
from mxrec_pipeline.core import embedding
from mxrec_pipeline.optimizers import (adagrad, adagrad_by_addr, factory, gradient_descent,
                                       gradient_descent_by_addr, lazy_adam, lazy_adam_by_addr)
from mxrec_pipeline.util.initialize import get_use_dynamic_expansion, init

import sparse_testlib as lib

CAPACITY, DIM = 4, 2  # 8 distinct ids below: the table grows to two chunks.
BATCHES = [
    np.array([[1, 2, 1], [3, 1, 2]], np.int64),
    np.array([[2, 2, 2], [2, 4, 4]], np.int64),
    np.array([[5, 1, 5], [5, 5, 6]], np.int64),
    np.array([[3, 3, 6], [1, 7, 8]], np.int64)
]
TARGETS = [
    np.random.RandomState(20 + step).normal(size=[2, 3, DIM]).astype(np.float32)
    for step in range(len(BATCHES))
]

OPTIMIZERS = {
    "lazy_adam":
        (lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(learning_rate=0.1, beta1=0.8,
                                                                    beta2=0.95, epsilon=1e-3),
         lambda: lib.NumpyLazyAdam(0.1, beta1=0.8, beta2=0.95, epsilon=1e-3), {"m": 0.0, "v": 0.0}),
    "sgd": (lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1, weight_decay=0.0),
            lambda: lib.NumpySgd(0.1), {}),
    "sgd_weight_decay":
        (lambda: gradient_descent_by_addr.create_hash_optimizer_by_address(0.1, weight_decay=0.05),
         lambda: lib.NumpySgdWeightDecay(0.1, 0.05), {}),
    "adagrad": (lambda: adagrad_by_addr.create_hash_optimizer_by_address(
        0.3, initial_accumulator_value=0.2),
                lambda: lib.NumpyAdagrad(0.3, initial_accumulator_value=0.2), {"accumulator": 0.2}),
}


def _loss(emb, target):
  return tf.reduce_sum(tf.square(emb - target))


def _state(values, slot_names, index, iterations):
  """(rows [size, dim], {slot: [size, dim]}, key -> row, iterations) of an export."""
  slots = {name: values[:, DIM * (i + 1):DIM * (i + 2)] for i, name in enumerate(slot_names)}
  return values[:, :DIM], slots, index, iterations


def _run_eager(make_optimizer, compiled):
  init(use_dynamic_expansion=True)
  table = lib.make_table(dim=DIM, capacity=CAPACITY)
  optimizer = make_optimizer()

  def step(ids, target):
    with tf.GradientTape() as tape:
      loss = _loss(embedding.sparse_lookup(table, ids), target)
    grad = tape.gradient(loss, table.variable)
    assert isinstance(grad, tf.IndexedSlices)
    optimizer.apply_gradients([(grad, table.variable)])

  step = tf.function(step) if compiled else step
  states = []
  for ids, target in zip(BATCHES, TARGETS):
    step(tf.constant(ids), tf.constant(target))
    values, _ = table.store.export()
    states.append(
        _state(values.numpy(), optimizer.slot_initial_values, lib.index_dict(table),
               optimizer.iterations.numpy()))
  return states


def _run_session(make_optimizer, collections):
  with tf.Graph().as_default():
    init(use_dynamic_expansion=True)
    table = lib.make_table(dim=DIM, capacity=CAPACITY)
    optimizer = make_optimizer()
    ids = tf.compat.v1.placeholder(tf.int64, [None, None])
    target = tf.compat.v1.placeholder(tf.float32, [None, None, DIM])
    loss = _loss(embedding.sparse_lookup(table, ids), target)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    if collections:  # mxRec's training loop for dynamic expansion, verbatim.
      train_emb_list = tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
      train_address_list = tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
      assert len(train_emb_list) == len(train_address_list) == 1
      local_grads = tf.gradients(loss, train_emb_list)
      grads_and_vars = [(grad, address) for grad, address in zip(local_grads, train_address_list)]
    else:
      grads_and_vars = zip(tf.gradients(loss, [table.variable]), [table.variable])
    train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
    assert isinstance(train_op, tf.Operation)
    export = table.store.export()[0], table.key_index.export(), optimizer.iterations
    states = []
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for step, (ids_value, target_value) in enumerate(zip(BATCHES, TARGETS), start=1):
        sess.run(train_op, {ids: ids_value, target: target_value})
        values, (keys, rows), iterations = sess.run(export)
        assert sess.run(global_step) == step
        states.append(
            _state(values, optimizer.slot_initial_values, dict(zip(keys.tolist(), rows.tolist())),
                   iterations))
  return states


RUNNERS = {
    "eager": lambda make: _run_eager(make, compiled=False),
    "tf_function": lambda make: _run_eager(make, compiled=True),
    "session_variable": lambda make: _run_session(make, collections=False),
    "session_collections": lambda make: _run_session(make, collections=True),
}


@pytest.mark.parametrize("mode", list(RUNNERS))
@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
def test_by_addr_optimizer_equals_numpy_reference_while_growing(optimizer_name, mode):
  make_optimizer, make_reference, slot_initial = OPTIMIZERS[optimizer_name]
  reference = make_reference()
  # Every chunk of rows comes from the same constant initializer.
  w = np.tile(lib.initial_rows(CAPACITY, DIM), [2, 1]).astype(np.float64)
  slots = {name: np.full_like(w, slot_initial[name]) for name in reference.slot_names}
  before_w = w.astype(np.float32)
  before_slots = {name: s.astype(np.float32) for name, s in slots.items()}
  sizes = []
  for t, ((got_w, got_slots, index, iterations), ids,
          target) in enumerate(zip(RUNNERS[mode](make_optimizer), BATCHES, TARGETS), start=1):
    rows = np.vectorize(index.get)(ids)
    touched, summed = lib.summed_row_grads(rows.reshape(-1),
                                           (2.0 * (w[rows] - target)).reshape(-1, DIM))
    reference.step(w, slots, touched, summed, t)

    size = len(got_w)
    sizes.append(size)
    assert iterations == t
    assert sorted(got_slots) == sorted(slots)
    np.testing.assert_allclose(got_w, w[:size], rtol=1e-5, atol=1e-6, err_msg=f"rows, step {t}")
    for name in slots:
      np.testing.assert_allclose(got_slots[name], slots[name][:size], rtol=1e-5, atol=1e-7,
                                 err_msg=f"slot {name}, step {t}")
    # Lazy: untouched rows (grown ones included) and their slots kept their exact values.
    resting = np.setdiff1d(np.arange(size), touched)
    np.testing.assert_array_equal(got_w[resting], before_w[resting])
    for name in slots:
      np.testing.assert_array_equal(got_slots[name][resting], before_slots[name][resting])
    before_w[:size] = got_w
    for name in slots:
      before_slots[name][:size] = got_slots[name]
  # Rows are handed out in order: 3 keys, then 4, 6, 8 -- past CAPACITY, no error.
  assert sizes == [CAPACITY, CAPACITY, 2 * CAPACITY, 2 * CAPACITY]
  assert len(index) == 8


def test_two_lookups_of_one_table_are_summed_into_one_update():
  # Adam is not linear in the gradient: two updates of row 1 would differ.
  with tf.Graph().as_default():
    init(use_dynamic_expansion=True)
    table = lib.make_table(dim=DIM, capacity=CAPACITY)
    optimizer = lazy_adam_by_addr.create_hash_optimizer_by_address(learning_rate=0.1)
    first = embedding.sparse_lookup(table, tf.constant([1, 2], tf.int64))
    second = embedding.sparse_lookup(table, tf.constant([2, 2, 3], tf.int64))
    loss = tf.reduce_sum(first * [[1.0, -2.0], [3.0, 0.5]]) + tf.reduce_sum(second)
    local = tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
    addresses = tf.compat.v1.get_collection(constants.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    train_op = optimizer.apply_gradients(zip(tf.gradients(loss, local), addresses))
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(train_op)
      values, (keys, rows) = sess.run([table.store.export()[0], table.key_index.export()])
  # The two insertions are unordered in the graph: rows come from the index.
  index = dict(zip(keys.tolist(), rows.tolist()))
  reference = lib.NumpyLazyAdam(0.1)
  w = lib.initial_rows(CAPACITY, DIM).astype(np.float64)
  slots = {"m": np.zeros_like(w), "v": np.zeros_like(w)}
  grads = {1: [1.0, -2.0], 2: [3.0 + 2.0, 0.5 + 2.0], 3: [1.0, 1.0]}
  touched = np.array([index[key] for key in grads])
  order = np.argsort(touched)
  reference.step(w, slots, touched[order], np.array(list(grads.values()))[order], 1)
  np.testing.assert_allclose(values[:, :DIM], w, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(values[:, DIM:2 * DIM], slots["m"], rtol=1e-5, atol=1e-7)


def test_by_addr_optimizers_need_dynamic_expansion_as_in_mxrec():
  init()
  assert get_use_dynamic_expansion() is False
  message = r"The dynamic expansion mode is not compatible with the optimizer"
  for create in (lazy_adam_by_addr.create_hash_optimizer_by_address,
                 adagrad_by_addr.create_hash_optimizer_by_address,
                 lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1),
                 lambda: factory.get_optimizer("sgd_by_addr", 0.1)):
    with pytest.raises(ValueError, match=message + r".*init\(use_dynamic_expansion=True\)"):
      create()


def test_plain_hash_optimizers_refuse_dynamic_expansion_as_in_mxrec():
  init(use_dynamic_expansion=True)
  assert get_use_dynamic_expansion() is True
  for create in (lazy_adam.create_hash_optimizer, adagrad.create_hash_optimizer,
                 lambda: gradient_descent.create_hash_optimizer(0.1),
                 lambda: factory.get_optimizer("lazy_adam", 0.1)):
    with pytest.raises(
        ValueError, match=r"The dynamic expansion mode is not compatible with the "
        r"optimizer.*create_hash_optimizer_by_address"):
      create()


def test_apply_gradients_errors():
  init(use_dynamic_expansion=True)
  table = lib.make_table(dim=DIM, capacity=CAPACITY)
  optimizer = lazy_adam_by_addr.create_hash_optimizer_by_address()
  dense = tf.Variable(tf.zeros([3]), name="dense_w")
  with pytest.raises(
      ValueError, match=r"variable 'dense_w:0' is not the `variable` of a "
      r"dynamic-expansion table"):
    optimizer.apply_gradients([(tf.ones([3]), dense)])
  with pytest.raises(ValueError, match=r"the gradient of table 't' is dense"):
    optimizer.apply_gradients([(tf.ones([0, DIM]), table.variable)])
  with pytest.raises(ValueError, match=r"eagerly, apply \(gradient, table.variable\) pairs"):
    optimizer.apply_gradients([(tf.ones([1, DIM]), tf.constant([0], tf.int64))])
  optimizer.apply_gradients([(None, table.variable)])
  assert optimizer.iterations.numpy() == 0
  # A second optimizer may not update the table: its rows hold one optimizer's slots.
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(embedding.sparse_lookup(table, tf.constant([1], tf.int64)))
  grad = tape.gradient(loss, table.variable)
  optimizer.apply_gradients([(grad, table.variable)])
  other = adagrad_by_addr.create_hash_optimizer_by_address()
  with pytest.raises(
      ValueError, match=r"table 't' is already updated by optimizer "
      r"'LazyAdamByAddress' \(slots \['m', 'v'\]\)"):
    other.apply_gradients([(grad, table.variable)])


def test_graph_addresses_must_come_from_an_expansion_lookup():
  with tf.Graph().as_default():
    init(use_dynamic_expansion=True)
    lib.make_table(dim=DIM, capacity=CAPACITY)
    optimizer = gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1)
    rows = tf.constant([0], tf.int64, name="my_rows")
    with pytest.raises(
        ValueError, match=r"tensor 'my_rows:0' is not the addresses output of "
        r"a dynamic-expansion lookup.*"
        r"ASCEND_SPARSE_LOOKUP_ID_OFFSET"):
      optimizer.apply_gradients([(tf.ones([1, DIM]), rows)])


@pytest.mark.parametrize("make, message", [
    (lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(learning_rate=-1.0),
     r"`learning_rate` must be positive, got -1.0"),
    (lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(beta1=1.0),
     r"`beta1` must be in \[0, 1\), got 1.0"),
    (lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(epsilon=0.0),
     r"`epsilon` must be positive"),
    (lambda: adagrad_by_addr.create_hash_optimizer_by_address(initial_accumulator_value=0.0),
     r"`initial_accumulator_value` must be positive"),
    (lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1, weight_decay=2.0),
     r"`weight_decay` must be in \[0, 1\], got 2.0"),
])
def test_by_addr_arguments_are_validated(make, message):
  init(use_dynamic_expansion=True)
  with pytest.raises(ValueError, match=message):
    make()


def test_mxrec_defaults():
  init(use_dynamic_expansion=True)
  adam = lazy_adam_by_addr.create_hash_optimizer_by_address()
  assert (adam.learning_rate, adam.beta1, adam.beta2, adam.epsilon,
          adam.optimizer_name) == (0.001, 0.9, 0.999, 1e-8, "LazyAdamByAddress")
  ada = adagrad_by_addr.create_hash_optimizer_by_address()
  assert (ada.learning_rate, ada.slot_initial_values,
          ada.optimizer_name) == (0.001, {"accumulator": 0.9}, "Adagrad")
  sgd = gradient_descent_by_addr.create_hash_optimizer_by_addr(0.01)
  assert (sgd.weight_decay, sgd.optimizer_name) == (0.0001, "GradientDescentByAddr")
  assert (gradient_descent_by_addr.create_hash_optimizer_by_address
          is gradient_descent_by_addr.create_hash_optimizer_by_addr)
