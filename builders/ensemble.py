"""Averaging the scores of an ensemble of scorers (shared by letor_dasalc and movielens)."""

from __future__ import annotations

import tensorflow as tf


@tf.keras.utils.register_keras_serializable(package="mxrec_pipeline")
class EnsembleMean(tf.keras.layers.Layer):
  """The scores of an ensemble: the members' mean; at training, one member per list.

  Inference (training False): `mean(scores, axis=-1)`. Training: list b of
  the batch takes member `b mod k`'s score, so each member's gradient comes
  from its own lists only (the members train as k models on disjoint parts
  of each batch, without co-adapting to their average); the members are the
  k seeds of DASALC's ensemble (Qin et al. 2021, section 4.4).

  Call args:
    scores: [batch_size, list_size, k] float32, member j's scores in [..., j].
    training: Python or tensor bool.

  Returns:
    [batch_size, list_size] float32.
  """

  def call(self, scores, training=None):

    def one_member_per_list():
      k = tf.shape(scores)[-1]
      member = tf.math.floormod(tf.range(tf.shape(scores)[0]), k)
      return tf.reduce_sum(scores * tf.one_hot(member, k, dtype=scores.dtype)[:, None, :], -1)

    def mean():
      return tf.reduce_mean(scores, axis=-1)

    if training is None:
      training = tf.keras.backend.learning_phase()
    if isinstance(training, bool):
      return one_member_per_list() if training else mean()
    return tf.cond(tf.cast(training, tf.bool), one_member_per_list, mean)
