"""SGD / Adagrad / Adam equal NumPy references of TPUEmbedding's math; bad optimizers raise."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline import embedding as tpu_embedding

import embedding_testlib as lib

ROWS, DIM = 12, 2
# Feature "a": one id per example; feature "b": bags of ids (sum), same table.
# Ids repeat within and across features; ids 40, 41 skip steps (lazy rows rest).
STEPS = [
    (np.array([[10], [11], [10]]), [[11, 12], [10], []]),
    (np.array([[12], [12], [40]]), [[13, 13, 10], [], [11]]),
    (np.array([[41], [13], [10]]), [[12], [10, 11], [40]]),
]
TARGETS = [
    np.random.RandomState(s).normal(size=[2, 3, DIM]).astype(np.float32) for s in range(len(STEPS))
]


def _run(optimizer, learning_rates=None):
  """Trains STEPS eagerly; returns (final table, row of each id)."""
  table = tpu_embedding.TableConfig(
      ROWS, DIM, combiner="sum", name="t",
      initializer=lib.constant_initializer(lib.initial_rows(ROWS, DIM)))
  embedding = tpu_embedding.Embedding(
      {"a": tpu_embedding.FeatureConfig(table), "b": tpu_embedding.FeatureConfig(table)}, optimizer)
  for step, ((a, b), target) in enumerate(zip(STEPS, TARGETS)):
    if learning_rates is not None:
      learning_rates[0].assign(learning_rates[1][step])
    features = {"a": tf.constant(a, tf.int64), "b": tf.ragged.constant(b, dtype=tf.int64)}
    lib.train_step(
        embedding, features, lambda act, t=target:
        (tf.reduce_sum(tf.square(act["a"] - t[0])) + tf.reduce_sum(tf.square(act["b"] - t[1]))))
  return embedding.embedding_tables[table].numpy(), lib.row_of(embedding, table)


def _reference(update, row_of, slots, learning_rates):
  """NumPy training of STEPS with `update(w, slots, rows, grads, lr)`."""
  w = lib.initial_rows(ROWS, DIM).astype(np.float64)
  for step, ((a, b), target) in enumerate(zip(STEPS, TARGETS)):
    grads = {}
    for i, key in enumerate(a[:, 0]):
      grads.setdefault(row_of[key], []).append(2 * (w[row_of[key]] - target[0, i]))
    for i, bag in enumerate(b):
      bag_sum = sum((w[row_of[k]] for k in bag), np.zeros(DIM))
      for key in bag:
        grads.setdefault(row_of[key], []).append(2 * (bag_sum - target[1, i]))
    rows = np.array(sorted(grads))
    summed = np.stack([np.sum(grads[r], axis=0) for r in rows])
    update(w, slots, rows, summed, learning_rates[step])
  return w


def _sgd(w, slots, rows, g, lr):
  w[rows] -= lr * g


def _adagrad(w, slots, rows, g, lr):
  slots["acc"][rows] += g**2
  w[rows] -= lr * g / np.sqrt(slots["acc"][rows])


def _adam(beta_1, beta_2, eps, inside, lazy=True):

  def update(w, slots, rows, g, lr):
    if not lazy:  # Every row, with zero gradient where not looked up.
      dense = np.zeros_like(w)
      dense[rows] = g
      rows, g = np.arange(ROWS), dense
    m, v = slots["m"], slots["v"]
    m[rows] = beta_1 * m[rows] + (1 - beta_1) * g
    v[rows] = beta_2 * v[rows] + (1 - beta_2) * g**2
    denom = np.sqrt(v[rows] + eps**2) if inside else np.sqrt(v[rows]) + eps
    w[rows] -= lr * m[rows] / denom

  return update


def _clipped(update, grad_limits, weight_limits):

  def clipped(w, slots, rows, g, lr):
    update(w, slots, rows, np.clip(g, *grad_limits), lr)
    w[rows] = np.clip(w[rows], *weight_limits)

  return clipped


def _zeros(value=0.0):
  return np.full([ROWS, DIM], value)


CASES = {
    "sgd": (tpu_embedding.SGD(0.05), _sgd, {}),
    "adagrad":
        (tpu_embedding.Adagrad(0.3, initial_accumulator_value=0.2), _adagrad, {"acc": _zeros(0.2)}),
    "adam_sum_inside_sqrt": (tpu_embedding.Adam(0.1, beta_1=0.8, beta_2=0.95, epsilon=1e-3),
                             _adam(0.8, 0.95, 1e-3, inside=True), {"m": _zeros(), "v": _zeros()}),
    "adam_eps_outside": (tpu_embedding.Adam(0.1, beta_1=0.8, beta_2=0.95, epsilon=1e-3,
                                            sum_inside_sqrt=False),
                         _adam(0.8, 0.95, 1e-3, inside=False), {"m": _zeros(), "v": _zeros()}),
    "sgd_clipped": (tpu_embedding.SGD(0.05, clipvalue=1.5, clip_weight_min=-0.6,
                                      clip_weight_max=0.7), _clipped(_sgd, (-1.5, 1.5),
                                                                     (-0.6, 0.7)), {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_optimizer_matches_numpy(name):
  optimizer, update, slots = CASES[name]
  table, row_of = _run(optimizer)
  lr = optimizer.learning_rate
  expected = _reference(update, row_of, {k: v.copy() for k, v in slots.items()}, [lr] * 3)
  np.testing.assert_allclose(table, expected, rtol=2e-5, atol=2e-6)
  if name != "sgd_clipped":  # Lazy: rows of ids never looked up keep their initial value.
    unused = sorted(set(range(ROWS)) - set(row_of.values()))
    np.testing.assert_array_equal(table[unused], lib.initial_rows(ROWS, DIM)[unused])


def test_non_lazy_adam_moves_every_row_with_momentum():
  optimizer = tpu_embedding.Adam(0.1, beta_1=0.8, beta_2=0.95, epsilon=1e-3, lazy_adam=False)
  table, row_of = _run(optimizer)
  expected = _reference(_adam(0.8, 0.95, 1e-3, inside=True, lazy=False), row_of,
                        {"m": _zeros(), "v": _zeros()}, [0.1] * 3)
  np.testing.assert_allclose(table, expected, rtol=2e-5, atol=2e-6)


def test_callable_learning_rate_is_read_every_step():
  schedule = [0.3, 0.1, 0.05]
  learning_rate = tf.Variable(schedule[0])
  table, row_of = _run(tpu_embedding.SGD(lambda: learning_rate), (learning_rate, schedule))
  expected = _reference(_sgd, row_of, {}, schedule)
  np.testing.assert_allclose(table, expected, rtol=2e-5, atol=2e-6)


def test_table_optimizer_overrides_the_global_one():
  rows = lib.initial_rows(8, DIM)
  own = tpu_embedding.TableConfig(8, DIM, name="own", optimizer=tpu_embedding.SGD(0.5),
                                  initializer=lib.constant_initializer(rows))
  shared = tpu_embedding.TableConfig(8, DIM, name="global",
                                     initializer=lib.constant_initializer(rows))
  embedding = tpu_embedding.Embedding(
      {"x": tpu_embedding.FeatureConfig(own), "y": tpu_embedding.FeatureConfig(shared)},
      tpu_embedding.Adagrad(0.5, initial_accumulator_value=1.0))
  ids = tf.constant([[3]], tf.int64)
  lib.train_step(embedding, {"x": ids, "y": ids},
                 lambda act: tf.reduce_sum(act["x"]) + tf.reduce_sum(act["y"]))
  # Gradient 1 per element: SGD moves by 0.5, Adagrad by 0.5 * 1 / sqrt(1 + 1).
  np.testing.assert_allclose(embedding.embedding_tables[own].numpy()[0], rows[0] - 0.5, rtol=1e-6)
  np.testing.assert_allclose(embedding.embedding_tables[shared].numpy()[0],
                             rows[0] - 0.5 / np.sqrt(2.0), rtol=1e-6)


def _feature_config(**table_kwargs):
  return tpu_embedding.FeatureConfig(tpu_embedding.TableConfig(8, DIM, name="t", **table_kwargs))


@pytest.mark.parametrize("optimizer, message", [
    (tf.keras.optimizers.Adam(), "Adam is an unsupported optimizer class"),
    (tf.tpu.experimental.embedding.SGD(0.1),
     "replace tf.tpu.experimental.embedding.SGD with mxrec_pipeline.embedding.SGD"),
    ("adam", "str is an unsupported optimizer class"),
])
def test_unsupported_optimizer_raises(optimizer, message):
  with pytest.raises(ValueError, match=message):
    tpu_embedding.Embedding(_feature_config(), optimizer)
  with pytest.raises(ValueError, match="TableConfig t: .*unsupported optimizer class"):
    tpu_embedding.Embedding(_feature_config(optimizer=optimizer), None)


@pytest.mark.parametrize("make, error, message", [
    (lambda: tpu_embedding.SGD(-1.0), ValueError, "`learning_rate` must be a positive"),
    (lambda: tpu_embedding.Adam(beta_1=1.0), ValueError, "`beta_1` must be >= 0 and < 1"),
    (lambda: tpu_embedding.Adam(epsilon=0.0), ValueError, "`epsilon` must be positive"),
    (lambda: tpu_embedding.Adam(lazy_adam=False, use_gradient_accumulation=False), ValueError,
     "gradient accumulation must be used"),
    (lambda: tpu_embedding.Adagrad(initial_accumulator_value=0.0), ValueError,
     "`initial_accumulator_value` must be a positive"),
    (lambda: tpu_embedding.SGD(use_gradient_accumulation=False, clipvalue=1.0), ValueError,
     "`clipvalue` must be None"),
    (lambda: tpu_embedding.SGD(clipvalue=(2.0, 1.0)), ValueError, "min <= max"),
    (lambda: tpu_embedding.SGD(weight_decay_factor=0.1), NotImplementedError,
     "`weight_decay_factor` is not available"),
    (lambda: tpu_embedding.Adam(slot_variable_creation_fn=lambda *a: None), NotImplementedError,
     "`slot_variable_creation_fn` is not available"),
])
def test_bad_optimizer_parameters(make, error, message):
  with pytest.raises(error, match=message):
    make()


def test_apply_gradients_without_optimizer_raises():
  embedding = tpu_embedding.Embedding(_feature_config(), None)
  embedding.enqueue(tf.constant([[1]], tf.int64))
  activations = embedding.dequeue()
  with pytest.raises(RuntimeError, match=r"tables \['t'\] have no optimizer"):
    embedding.apply_gradients(tf.ones_like(activations))
