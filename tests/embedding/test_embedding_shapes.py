"""TPUEmbedding's output-shape priority: FeatureConfig, then build(), then the input."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline import embedding as tpu_embedding

DIM = 2


def _embedding(table_name="t", **feature_kwargs):
  table = tpu_embedding.TableConfig(16, DIM, name=table_name)
  return tpu_embedding.Embedding({"watched": tpu_embedding.FeatureConfig(table, **feature_kwargs)},
                                 tpu_embedding.SGD(0.1))


def _shape(embedding, ids, **kwargs):
  embedding.enqueue({"watched": ids}, training=False, **kwargs)
  return embedding.dequeue()["watched"].shape.as_list()


def _ids(batch_size, n=1):
  return tf.constant(np.arange(batch_size * n).reshape([batch_size, n]), tf.int64)


def test_input_shape_is_used_when_nothing_is_declared_and_may_change():
  embedding = _embedding()
  assert _shape(embedding, _ids(4)) == [4, DIM]
  # Unlike TPUEmbedding, a shape only seen in an input is not frozen.
  assert _shape(embedding, _ids(3)) == [3, DIM]
  assert embedding.output_shapes == [tf.TensorShape(None)]


def test_feature_config_output_shape_wins_and_mismatches_name_the_feature():
  embedding = _embedding(output_shape=[4])
  assert _shape(embedding, _ids(4)) == [4, DIM]
  with pytest.raises(ValueError, match=r"feature watched.*set to \(4,\).*\(3,\)"):
    _shape(embedding, _ids(3))


def test_feature_config_output_shape_beats_build():
  embedding = _embedding(output_shape=[4])
  with pytest.raises(ValueError, match=r"feature watched.*set to \(4,\).*\(8,\)"):
    embedding.build({"watched": tf.TensorShape([8, 1])})


def test_build_shapes_beat_the_input():
  embedding = _embedding()
  embedding.build({"watched": [4, 1]})
  assert embedding.output_shapes == [tf.TensorShape([4])]
  assert _shape(embedding, _ids(4)) == [4, DIM]
  with pytest.raises(ValueError, match="feature watched"):
    _shape(embedding, _ids(5))
  embedding.build({"watched": [5, 1]})  # Built already: ignored, as TPUEmbedding does.
  assert embedding.output_shapes == [tf.TensorShape([4])]


def test_unknown_dimensions_match_any_size():
  embedding = _embedding()
  embedding.build({"watched": tf.TensorShape([None, 1])})
  assert _shape(embedding, _ids(4)) == [4, DIM]
  assert _shape(embedding, _ids(7)) == [7, DIM]


def test_build_with_batch_size():
  embedding = _embedding(max_sequence_length=3)
  embedding.build(per_replica_batch_size=2)
  assert embedding.output_shapes == [tf.TensorShape([2, 3])]
  ragged = tf.ragged.constant([[1, 2, 3, 4], [5]], dtype=tf.int64)
  assert _shape(embedding, ragged) == [2, 3, DIM]


def test_output_shape_of_as_many_elements_reshapes():
  """A rank-1 incoming shape below a higher declared rank is reshaped (TPUEmbedding)."""
  embedding = _embedding(output_shape=[2, 3])
  ids = tf.constant([[1], [2], [3], [4], [5], [6]], tf.int64)
  embedding.enqueue({"watched": ids}, training=True)
  out = embedding.dequeue()["watched"]
  flat = embedding({"watched": ids})["watched"]
  embedding.apply_gradients({"watched": None})
  assert out.shape.as_list() == [2, 3, DIM]
  np.testing.assert_array_equal(out.numpy().reshape([6, DIM]), flat.numpy().reshape([6, DIM]))


def test_sequence_shape_from_the_input():
  embedding = _embedding(max_sequence_length=4)
  assert _shape(embedding, tf.ragged.constant([[1], [2, 3]], dtype=tf.int64)) == [2, 4, DIM]


@pytest.mark.parametrize("ids, message", [
    (tf.constant(3, tf.int64), "rank 1 and above dense.*rank 0 for input watched"),
    (tf.constant([[1, 2], [3, 4]], tf.int64), "last dimension 1.*input watched"),
    (tf.SparseTensor([[0]], tf.constant([1], tf.int64),
                     [2]), "rank 2 and above sparse.*rank 1 for input watched"),
    (np.array([[1.5], [2.5]]), "watched: ids must be int32, int64 or string"),
])
def test_bad_inputs_name_the_feature(ids, message):
  with pytest.raises(ValueError, match=message):
    _shape(_embedding(), ids)


def test_ragged_output_shape_must_be_a_multiple_of_the_batch():
  embedding = _embedding(output_shape=[3, 1])
  with pytest.raises(ValueError, match="Feature watched.*multiple of the batch size"):
    _shape(embedding, tf.ragged.constant([[1], [2, 3]], dtype=tf.int64))


def test_weights_on_dense_or_sequence_inputs_are_rejected():
  embedding = _embedding()
  with pytest.raises(ValueError, match="Weight specified for watched, but its input is dense"):
    _shape(embedding, _ids(2), weights={"watched": tf.ones([2, 1])})
  ragged = tf.ragged.constant([[1], [2, 3]], dtype=tf.int64)
  with pytest.raises(ValueError, match="Weight for watched is of type SparseTensor"):
    _shape(embedding, ragged, weights={"watched": ragged.to_sparse()})
  sequence = _embedding("sequence", max_sequence_length=2)
  with pytest.raises(ValueError, match="watched, but it is a sequence feature"):
    _shape(sequence, ragged, weights={"watched": tf.ones_like(ragged, tf.float32)})


def test_gradient_of_the_wrong_shape_names_the_path():
  embedding = _embedding()
  embedding.enqueue({"watched": _ids(4)}, training=True)
  embedding.dequeue()
  with pytest.raises(ValueError, match=r"gradient of shape \(3, 2\) at path watched"):
    embedding.apply_gradients({"watched": tf.zeros([3, DIM])})
