"""The step protocol: enqueue(training=True) -> dequeue -> apply_gradients, and its errors."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline import embedding as tpu_embedding

import embedding_testlib as lib

DIM = 2


@pytest.fixture(name="embedding")
def _embedding():
  table = tpu_embedding.TableConfig(16, DIM, name="t")
  return tpu_embedding.Embedding({"ids": tpu_embedding.FeatureConfig(table)},
                                 tpu_embedding.SGD(0.1))


FEATURES = {"ids": tf.constant([[1], [2]], tf.int64)}


def _loss(activations):
  return tf.reduce_sum(activations["ids"])


def test_apply_gradients_without_enqueue_raises(embedding):
  with pytest.raises(RuntimeError, match="apply_gradients was called without enqueue"):
    embedding.apply_gradients({"ids": tf.zeros([2, DIM])})


def test_dequeue_without_enqueue_raises(embedding):
  with pytest.raises(RuntimeError, match="dequeue was called without enqueue"):
    embedding.dequeue()


def test_enqueue_twice_without_apply_gradients_raises(embedding):
  embedding.enqueue(FEATURES, training=True)
  embedding.dequeue()
  with pytest.raises(
      RuntimeError, match="previous enqueue\\(training=True\\) was not followed "
      "by apply_gradients"):
    embedding.enqueue(FEATURES, training=True)
  # Reported once: the unapplied enqueue is dropped and the next step runs.
  expected = float(tf.reduce_sum(embedding(FEATURES)["ids"]))
  assert lib.train_step(embedding, FEATURES, _loss) == pytest.approx(expected)
  embedding.enqueue(FEATURES, training=True)
  with pytest.raises(RuntimeError, match="not followed by apply_gradients"):
    embedding.enqueue(FEATURES, training=False)


def test_apply_gradients_after_evaluation_enqueue_raises(embedding):
  embedding.enqueue(FEATURES, training=False)
  activations = embedding.dequeue()
  with pytest.raises(RuntimeError, match="after enqueue\\(training=False\\)"):
    embedding.apply_gradients(tf.nest.map_structure(tf.zeros_like, activations))
  embedding.enqueue(FEATURES, training=False)  # Evaluation steps need no apply_gradients.
  embedding.enqueue(FEATURES, training=True)


def test_second_apply_gradients_raises(embedding):
  embedding.enqueue(FEATURES, training=True)
  activations = embedding.dequeue()
  gradients = tf.nest.map_structure(tf.ones_like, activations)
  embedding.apply_gradients(gradients)
  with pytest.raises(RuntimeError, match="without enqueue"):
    embedding.apply_gradients(gradients)


def test_gradients_of_another_structure_raise(embedding):
  embedding.enqueue(FEATURES, training=True)
  embedding.dequeue()
  with pytest.raises(ValueError, match="don't have the same nested structure"):
    embedding.apply_gradients({"other": tf.zeros([2, DIM])})


def test_steps_in_tf_function_train_and_evaluate(embedding):
  """The TPUEmbedding docs' training_step / evaluation_step, with no strategy."""
  strategy = tf.distribute.get_strategy()
  dataset = tf.data.Dataset.from_tensors((FEATURES, tf.constant([1.0, 2.0]))).repeat()
  iterator = iter(dataset)

  @tf.function
  def training_step(dataset_iterator, num_steps):

    def tpu_step(labels):
      with tf.GradientTape() as tape:
        activations = embedding.dequeue()
        tape.watch(activations)
        loss = tf.reduce_sum(tf.reduce_sum(activations["ids"], 1) * labels)
      embedding.apply_gradients(tape.gradient(loss, activations))

    for _ in tf.range(num_steps):
      embedding_features, labels = next(dataset_iterator)
      embedding.enqueue(embedding_features, training=True)
      strategy.run(tpu_step, args=(labels,))

  @tf.function
  def evaluation_step(dataset_iterator):
    embedding_features, _ = next(dataset_iterator)
    embedding.enqueue(embedding_features, training=False)
    return strategy.run(embedding.dequeue)

  table = list(embedding.embedding_tables.values())[0]
  before = table.numpy().copy()
  training_step(iterator, tf.constant(3))
  after = table.numpy()
  # SGD(0.1), gradient = label per element, 3 steps: rows 0 (id 1) and 1 (id 2) move. The
  # reference takes the same three float32 steps (a row near zero loses digits to rounding).
  expected = before[:2].copy()
  for _ in range(3):
    expected -= np.float32(0.1) * np.array([[1.0], [2.0]], np.float32)
  np.testing.assert_allclose(after[:2], expected, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(after[2:], before[2:])
  np.testing.assert_allclose(evaluation_step(iterator)["ids"].numpy(), after[:2], rtol=1e-6)


def test_dequeue_in_another_function_than_enqueue_raises(embedding):
  tf.function(lambda: embedding.enqueue(FEATURES, training=False))()
  with pytest.raises(RuntimeError, match="same step \\(tf.function\\)"):
    tf.function(embedding.dequeue)()


def test_enqueue_inside_strategy_run_raises(embedding):
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  with pytest.raises(RuntimeError, match="enqueue must be called outside strategy.run"):
    strategy.run(lambda: embedding.enqueue(FEATURES))


def test_full_table_fails_the_step_naming_it():
  table = tpu_embedding.TableConfig(2, DIM, name="tiny")
  embedding = tpu_embedding.Embedding({"ids": tpu_embedding.FeatureConfig(table)},
                                      tpu_embedding.SGD(0.1))
  with pytest.raises(tf.errors.ResourceExhaustedError, match="tiny"):
    embedding.enqueue({"ids": tf.constant([[1], [2], [3]], tf.int64)})


def test_string_ids_are_hashed_like_the_sparse_core(embedding):
  strings = tf.constant([["a"], ["b"], ["a"]])
  lib.train_step(embedding, {"ids": strings}, _loss)
  index = lib.row_of(embedding, list(embedding.embedding_tables)[0])
  keys = tf.strings.to_hash_bucket_fast(tf.constant(["a", "b"]), 2**63 - 1).numpy().tolist()
  assert index == {keys[0]: 0, keys[1]: 1}
