"""EnsembleMean against NumPy."""

import numpy as np
import tensorflow as tf

from builders import ensemble


def test_ensemble_mean_is_the_mean_at_inference_and_one_member_per_list_in_training():
  scores = tf.constant(np.arange(24, dtype=np.float32).reshape([4, 2, 3]))
  layer = ensemble.EnsembleMean()
  np.testing.assert_allclose(layer(scores, training=False), np.mean(scores.numpy(), -1))
  # List b takes member b mod 3.
  expected = np.stack([scores.numpy()[b, :, b % 3] for b in range(4)])
  np.testing.assert_allclose(layer(scores, training=True), expected)
