"""DASALC on LETOR data: the neural ranker that matches LambdaMART, from tfr's building blocks.

Qin et al., "Are Neural Rankers still Outperformed by Gradient Boosted Decision
Trees?", ICLR 2021 (https://openreview.net/forum?id=Ut1vF_q_vC): DASALC, "DNN
with Data Augmentation and Self-Attention for Listwise Context", is

* the log1p transform of every feature, `sign(x) * log1p(|x|)` (mslr_dnn's
  `Log1pConcatPreprocessor`), with Gaussian noise added at training
  (`tf.keras.layers.GaussianNoise`; tfr 0.5.5 has no noise layer of its own);
* a per-document DNN (Dense -> batch normalization -> ReLU -> dropout);
* multi-head self-attention across the documents of a list
  (`tfr.keras.layers.DocumentInteractionAttention`, Pasumarthi et al. 2020),
  joining the DNN's output per document (`model.combine`: concatenation, or
  the latent cross `h * (1 + W a)`), then Dense(1);
* a listwise softmax loss (`pipeline.loss: softmax_loss`);
* an ensemble of `model.ensemble_size` independently initialized networks,
  their scores averaged (`EnsembleMean`).

Data, feature names, the width and the baseline are mslr_dnn's (builders/mslr.py).
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_ranking as tfr

from builders.base import MASK_FEATURE
from builders.ensemble import EnsembleMean
from builders.letor_dasalc_config import DasalcModelConfig
from builders.mslr import Log1pConcatPreprocessor, MslrDnn
from builders.mslr_config import MslrDataConfig
from mxrec_pipeline.keras import model as model_lib

FEATURES = "features"


class DasalcScorer(tfr.keras.model.Scorer):
  """Scores a list with DASALC (see the module docstring).

  Args:
    config: The model config.
    feature_name: The example feature holding all features, log1p-transformed,
      [batch_size, list_size, num_features] float32.
  """

  def __init__(self, config: DasalcModelConfig, feature_name: str = FEATURES):
    self._config = config
    self._feature_name = feature_name

  def __call__(self, context_features, example_features, mask):
    """[batch_size, list_size] float32 scores. See tfr's `Scorer`."""
    del context_features
    config = self._config
    x = example_features[self._feature_name]
    if config.input_noise_stddev:
      x = tf.keras.layers.GaussianNoise(config.input_noise_stddev, name="input_noise")(x)
    members = [self._member(x, mask, i) for i in range(config.ensemble_size)]
    scores = members[0] if len(members) == 1 else tf.keras.layers.Concatenate()(members)
    return EnsembleMean(name="ensemble_mean")(scores)

  def _member(self, x, mask, index: int):
    """Member `index`'s scores, [batch_size, list_size, 1] float32."""
    config = self._config
    prefix = f"member_{index}"
    h = x
    for j, units in enumerate(config.hidden_layer_dims):
      h = tf.keras.layers.Dense(units, name=f"{prefix}_dense_{j}")(h)
      h = tf.keras.layers.BatchNormalization(momentum=config.batch_norm_moment,
                                             name=f"{prefix}_batch_norm_{j}")(h)
      h = tf.keras.layers.ReLU()(h)
      if config.dropout:
        h = tf.keras.layers.Dropout(config.dropout, name=f"{prefix}_dropout_{j}")(h)
    if config.num_attention_heads:
      a = tfr.keras.layers.DocumentInteractionAttention(num_heads=config.num_attention_heads,
                                                        head_size=config.attention_head_size,
                                                        num_layers=config.num_attention_layers,
                                                        dropout=config.dropout,
                                                        name=f"{prefix}_attention")((x, mask))
      if config.combine == "concat":
        h = tf.keras.layers.Concatenate(name=f"{prefix}_concat")([h, a])
      else:  # latent_cross
        cross = tf.keras.layers.Dense(config.hidden_layer_dims[-1], name=f"{prefix}_cross")(a)
        h = tf.keras.layers.Multiply(name=f"{prefix}_latent_cross")([h, cross + 1.0])
    return tf.keras.layers.Dense(1, name=f"{prefix}_logit")(h)


class LetorDasalc(MslrDnn):
  """DASALC on LETOR files of any width; data and baseline as `MslrDnn`."""

  name = "letor_dasalc"
  DataConfig = MslrDataConfig
  ModelConfig = DasalcModelConfig

  def build_model_builder(self, model: DasalcModelConfig, seed):
    del seed  # No table; dense initializers follow the pipeline's global seed.
    _, example_spec, _ = self.feature_specs()
    return model_lib.ModelBuilder(
        input_creator=model_lib.FeatureSpecInputCreator({}, example_spec),
        preprocessor=Log1pConcatPreprocessor(list(example_spec), FEATURES,
                                             moments=self.standardizing(model)),
        scorer=DasalcScorer(model, FEATURES), mask_feature_name=MASK_FEATURE, name=self.name)
