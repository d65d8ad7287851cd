"""The letor_dasalc ranker's ModelConfig, TensorFlow-free (see builders/letor_dasalc.py).

Its data section is mslr_dnn's (`MslrDataConfig`): any LETOR files, width from
the data or `data.num_features`.
"""

from __future__ import annotations

import dataclasses

from builders.base_config import check_dnn_options

COMBINERS = ("concat", "latent_cross")


@dataclasses.dataclass
class DasalcModelConfig:
  """DASALC (Qin et al., ICLR 2021): log1p, input noise, a DNN and list attention, an ensemble.

  Attributes:
    hidden_layer_dims: Units of the per-document DNN's hidden layers, each > 0
      (Dense -> batch normalization -> ReLU -> dropout).
    dropout: Dropout rate of the DNN's hidden layers and of the attention,
      in [0, 1).
    input_noise_stddev: Standard deviation of the Gaussian noise added to the
      log1p-transformed features at training (data augmentation; 0: none),
      >= 0. No noise at inference.
    batch_norm_moment: Momentum of the batch normalizations' moving averages,
      in (0, 1).
    num_attention_heads: Heads of the multi-head self-attention across the
      list (tfr's DocumentInteractionAttention), > 0; 0 turns the attention
      off (a plain DNN on log1p features with noise).
    attention_head_size: Units of each head (and of the attention output), > 0.
    num_attention_layers: Stacked attention layers, > 0.
    combine: How a document's DNN output h and its attention output a make
      the input of the final Dense(1): "concat" ([h, a]) or "latent_cross"
      (h * (1 + W a), Beutel et al. 2018's latent cross).
    ensemble_size: Members of the ensemble, >= 1: independently initialized
      networks; list b of a training batch trains member b mod
      ensemble_size; at validation and in the export the score is the mean
      of the members' scores.
    standardize: Standardize the log1p features (each feature's mean and
      standard deviation over the training lists outside the holdout; as
      mslr_dnn's `model.standardize`) before the noise.
  """

  hidden_layer_dims: list[int] = dataclasses.field(default_factory=lambda: [64, 32])
  dropout: float = 0.3
  input_noise_stddev: float = 1.0
  batch_norm_moment: float = 0.99
  num_attention_heads: int = 2
  attention_head_size: int = 32
  num_attention_layers: int = 1
  combine: str = "concat"
  ensemble_size: int = 1
  standardize: bool = False

  def __post_init__(self):
    check_dnn_options(self.hidden_layer_dims, self.dropout, self.batch_norm_moment)
    if self.input_noise_stddev < 0.0:
      raise ValueError(f"model.input_noise_stddev must be >= 0, got {self.input_noise_stddev}")
    if self.num_attention_heads < 0:
      raise ValueError(f"model.num_attention_heads must be >= 0, got {self.num_attention_heads}")
    for name in ("attention_head_size", "num_attention_layers", "ensemble_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"model.{name} must be a positive int, got {getattr(self, name)}")
    if self.combine not in COMBINERS:
      raise ValueError(f"model.combine must be one of {list(COMBINERS)}, got {self.combine!r}")
