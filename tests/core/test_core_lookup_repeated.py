"""A lookup's gradient trains the table as the dedup read's and a dense reference do.

core/lookup.py's `id_embeddings` in training reads the distinct rows, then
every id's with a gradient that the native MxSumByRestore sums per distinct
row: the table's gradient holds each distinct row once. Gradients that repeat
rows (`gather_per_id`, each id's row read from the table; also
`Embedding.apply_gradients` and replicas' concatenated gradients) must train
the same: every optimizer of tables sums them (the fused native updates for
float32 tables, the TF-op updates after tf.unique for float64 tables, stock
Keras optimizers). Each run is compared with the dedup read through TF's
gather (its gradient summed by TF's UnsortedSegmentSum) and with a dense
tf.Variable trained by a NumPy reference.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import admission, key_index, lookup
from mxrec_pipeline.optimizers import adagrad, ftrl, gradient_descent, lazy_adam
from mxrec_pipeline.util import initialize

import sparse_testlib as lib

CAPACITY, DIM = 10, 3
# Ids repeat within each batch; ids 3, 4, 6, 7 skip steps, so their rows rest.
BATCHES = [
    np.array([[1, 2, 1], [3, 1, 2]], np.int64),
    np.array([[2, 2, 2], [2, 4, 4]], np.int64),
    np.array([[5, 1, 5], [5, 5, 6]], np.int64),
    np.array([[3, 3, 6], [1, 7, 2]], np.int64),
]
TARGETS = [np.random.RandomState(step).normal(size=[2, 3, DIM]) for step in range(len(BATCHES))]

OPTIMIZERS = {
    "lazy_adam": (lambda: lazy_adam.LazyAdam(0.1, beta1=0.8, beta2=0.95, epsilon=1e-3),
                  lambda: lib.NumpyLazyAdam(0.1, beta1=0.8, beta2=0.95, epsilon=1e-3)),
    "adagrad": (lambda: adagrad.Adagrad(0.3, initial_accumulator_value=0.2),
                lambda: lib.NumpyAdagrad(0.3, initial_accumulator_value=0.2)),
    "sgd": (lambda: gradient_descent.GradientDescent(0.1), lambda: lib.NumpySgd(0.1)),
    "ftrl":
        (lambda: ftrl.Ftrl(0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02),
         lambda: lib.NumpyFtrl(0.1, l1=0.01, l2=0.02)),
}

READS = {
    "id_embeddings": lambda table, rows, restore: lookup.id_embeddings(
        table, rows, restore, training=True),
    "repeated": lambda table, rows, restore: lookup.gather_per_id(table.variable, rows, restore),
    "dedup": lambda table, rows, restore: lookup.per_id(
        lookup.unique_embeddings(table, rows, training=True), restore),
}


def _train(read, make_optimizer, value_dtype=tf.float32):
  """Trains a fresh table on BATCHES; returns (rows, slots, index, gradient sizes)."""
  initialize.terminate_config_initializer()
  initialize.init()
  table = lib.make_table(dim=DIM, capacity=CAPACITY, value_dtype=value_dtype)
  optimizer = make_optimizer()
  container = initialize.get_config_initializer().container

  @tf.function
  def step(ids, target):
    unique_rows, restore = admission.insert(container, "t",
                                            tf.reshape(key_index.to_keys(ids), [-1]), True)
    with tf.GradientTape() as tape:
      emb = READS[read](table, unique_rows, tf.reshape(restore, tf.shape(ids)))
      loss = tf.reduce_sum(tf.square(emb - tf.cast(target, value_dtype)))
    grad = tape.gradient(loss, table.variable)
    optimizer.apply_gradients([(grad, table.variable)])
    return tf.size(grad.indices)

  sizes = [
      int(step(tf.constant(ids), tf.constant(target))) for ids, target in zip(BATCHES, TARGETS)
  ]
  slots = {}
  if hasattr(optimizer, "get_slot") and not isinstance(optimizer, tf.keras.optimizers.Optimizer):
    slots = {name: optimizer.get_slot("t", name).numpy() for name in optimizer.slot_initial_values}
  return table.variable.numpy(), slots, lib.index_dict(table), sizes


def _dense_reference(make_reference, slot_initial_values, index):
  """(rows, slots) of a dense tf.Variable whose gradient a NumPy optimizer applies."""
  reference = make_reference()
  w = lib.initial_rows(CAPACITY, DIM).astype(np.float64)
  slots = {
      name: np.full(w.shape, slot_initial_values[name], np.float64) for name in reference.slot_names
  }
  dense = tf.Variable(w)
  for t, (ids, target) in enumerate(zip(BATCHES, TARGETS), start=1):
    rows = np.vectorize(index.get)(ids)
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(tf.gather(dense, rows) - target))
    grad = tf.convert_to_tensor(tape.gradient(loss, dense)).numpy()
    touched = np.unique(rows)
    reference.step(w, slots, touched, grad[touched], t)
    dense.assign(w)
  return w, slots


@pytest.mark.parametrize("read", ["id_embeddings", "repeated"])
@pytest.mark.parametrize("value_dtype", [tf.float32, tf.float64], ids=["fused", "tf_ops"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_lookups_train_as_the_dedup_read_and_a_dense_reference(name, value_dtype, read):
  make, make_reference = OPTIMIZERS[name]
  # float64 tables update with TF ops, after tf.unique + unsorted_segment_sum.
  assert (value_dtype in make().sums_repeated_rows_of) == (value_dtype == tf.float32)
  got_w, got_slots, index, sizes = _train(read, make, value_dtype)
  dedup_w, dedup_slots, dedup_index, dedup_sizes = _train("dedup", make, value_dtype)

  # One gradient slice per distinct row (id_embeddings, as the dedup read), or
  # one per id, rows repeated (gather_per_id).
  assert dedup_sizes == [np.unique(ids).size for ids in BATCHES]
  assert sizes == (dedup_sizes if read == "id_embeddings" else [ids.size for ids in BATCHES])
  assert index == dedup_index
  np.testing.assert_allclose(got_w, dedup_w, rtol=1e-6, atol=1e-7)
  assert sorted(got_slots) == sorted(dedup_slots)
  for slot in got_slots:
    np.testing.assert_allclose(got_slots[slot], dedup_slots[slot], rtol=1e-6, atol=1e-7)

  want_w, want_slots = _dense_reference(make_reference, make().slot_initial_values, index)
  np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
  for slot in got_slots:
    np.testing.assert_allclose(got_slots[slot], want_slots[slot], rtol=1e-5, atol=1e-6)
  # Rows no batch touched kept their initial values.
  untouched = np.setdiff1d(np.arange(CAPACITY), list(index.values()))
  np.testing.assert_array_equal(got_w[untouched], lib.initial_rows(CAPACITY, DIM)[untouched])


@pytest.mark.parametrize("read", ["id_embeddings", "repeated"])
def test_stock_keras_optimizer_trains_as_a_dense_gradient(read):
  got_w, _, index, sizes = _train(read, lambda: tf.keras.optimizers.Adam(0.1))
  assert sizes == [(ids if read == "repeated" else np.unique(ids)).size for ids in BATCHES]
  # Keras Adam deduplicates IndexedSlices itself; its update of a sparse
  # gradient equals that of the dense gradient.
  dense = tf.Variable(lib.initial_rows(CAPACITY, DIM))
  optimizer = tf.keras.optimizers.Adam(0.1)
  for ids, target in zip(BATCHES, TARGETS):
    rows = np.vectorize(index.get)(ids)
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(tf.gather(dense, rows) - tf.cast(target, tf.float32)))
    optimizer.apply_gradients([(tf.convert_to_tensor(tape.gradient(loss, dense)), dense)])
  np.testing.assert_allclose(got_w, dense.numpy(), rtol=1e-5, atol=1e-6)


def test_ragged_restore_and_rows_without_a_row():
  initialize.terminate_config_initializer()
  initialize.init()
  table = lib.make_table(dim=DIM, capacity=CAPACITY)
  unique_rows = tf.constant([4, -1, 7], tf.int64)
  restore = tf.ragged.constant([[0, 1, 0], [], [2, 2]], tf.int32)
  rows = table.variable.numpy()

  got = lookup.id_embeddings(table, unique_rows, restore, training=False, default_value=0.5)
  assert isinstance(got, tf.RaggedTensor)
  want = [[rows[4], [0.5] * DIM, rows[4]], [], [rows[7], rows[7]]]
  for got_row, want_row in zip(got.to_list(), want):
    np.testing.assert_allclose(np.reshape(got_row, [-1, DIM]), np.reshape(want_row, [-1, DIM]))

  # Admission: an id without a row reads the default and gets no gradient.
  with tf.GradientTape() as tape:
    emb = lookup.id_embeddings(table, unique_rows, restore, training=True, admitting=True)
    loss = tf.reduce_sum(emb.flat_values)
  grad = tape.gradient(loss, table.variable)
  assert isinstance(grad, tf.IndexedSlices)
  # Each distinct row once, its ids' gradients summed (two ids each).
  order = np.argsort(grad.indices.numpy())
  assert grad.indices.numpy()[order].tolist() == [4, 7]
  np.testing.assert_array_equal(
      tf.convert_to_tensor(grad.values).numpy()[order], np.full([2, DIM], 2.0))
  np.testing.assert_array_equal(emb.flat_values.numpy()[1], np.zeros(DIM))
