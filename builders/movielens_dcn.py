"""A DCN-v2 ranker on MovieLens-100k, written by subclassing AbstractModelBuilder.

The worked example of docs/writing-a-ranker.md. Same task, data, tables and
baseline as `movielens_listwise` (builders/movielens.py); the model differs:
every feature of a (user, movie) pair, the id embeddings looked up through the
sparse core included, is concatenated into x0, then a cross network learns
explicit feature crosses,

    x_{l+1} = x0 * (W_l x_l + b_l) + x_l          (* elementwise)

followed by a small DNN and one logit per movie: the stacked structure of
DCN-v2 (Wang et al., "DCN V2: Improved Deep & Cross Network and Practical
Lessons for Web-scale Learning to Rank Systems", WWW 2021, eq. 1 and Fig. 2).
With `projection_dim` set, W_l is the low-rank U_l V_l of the paper's section 5.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import tensorflow as tf
import tensorflow_ranking as tfr

from builders import movielens
from builders.base import MASK_FEATURE
from builders.movielens_dcn_config import DcnModelConfig
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras.layers import SparseFeature, TableSpec


def cross(x0: tf.Tensor, x: tf.Tensor, projected: tf.Tensor) -> tf.Tensor:
  """One DCN-v2 cross: `x0 * projected + x`.

  Args:
    x0: [batch_size, dim] float32, the network's input.
    x: [batch_size, dim] float32, the previous cross's output (x0 at first).
    projected: [batch_size, dim] float32, `W x + b` of this cross.

  Returns:
    [batch_size, dim] float32.
  """
  return x0 * projected + x


@tf.keras.utils.register_keras_serializable(package="builders")
class Cross(tf.keras.layers.Layer):
  """A DCN-v2 cross layer: call with `(x0, x)`, both [batch_size, dim] float32.

  Returns `x0 * (W x + b) + x`, [batch_size, dim] float32; W is [dim, dim], or
  U V with U [dim, projection_dim], V [projection_dim, dim] when
  `projection_dim` is set (DCN-v2's low-rank cross).

  Args:
    projection_dim: Rank of W, > 0; None for a full-rank W.
  """

  def __init__(self, projection_dim: int | None = None, **kwargs):
    super().__init__(**kwargs)
    if projection_dim is not None and projection_dim <= 0:
      raise ValueError(f"Cross: `projection_dim` must be positive, got {projection_dim}")
    self.projection_dim = projection_dim
    self._down = None
    self._dense = None

  def build(self, input_shape):
    dim = input_shape[0][-1]
    if self.projection_dim is not None:
      self._down = tf.keras.layers.Dense(self.projection_dim, use_bias=False, name="u")
    self._dense = tf.keras.layers.Dense(dim, name="w")
    super().build(input_shape)

  def call(self, inputs):
    x0, x = inputs
    hidden = self._down(x) if self._down is not None else x
    return cross(x0, x, self._dense(hidden))

  def get_config(self):
    return {**super().get_config(), "projection_dim": self.projection_dim}


class DcnModelBuilder(model_lib.AbstractModelBuilder):
  """Builds a DCN-v2 ranking model whose id features go through the sparse core.

  tfr's three steps, written out: `create_inputs` (raw features as Keras
  inputs), `preprocess` (numeric features scaled; id features arrive already
  embedded), `score` (cross network + DNN per example). `build` hands them to
  mxrec's ModelBuilder, which swaps every sparse id input for the batch's
  insertion results (restore indices, unique rows) and a SparseLookup layer
  before `preprocess` sees it, and returns a SparseRankingModel.

  Args:
    context_feature_spec, example_feature_spec: tf.io specs of the raw features.
    sparse_features: The id features looked up in tables.
    tables: Their TableSpecs.
    config: DcnModelConfig (cross and DNN sizes).
    preprocess_spec: Feature name -> fn applied to that feature's tensor.
    mask_feature_name: Name of the [batch_size, list_size] bool list mask.
    seed: Seed of the tables' initial rows.
    name: Model name.
  """

  def __init__(self, context_feature_spec: Mapping, example_feature_spec: Mapping,
               sparse_features: Sequence[SparseFeature], tables: Sequence[TableSpec],
               config: DcnModelConfig, preprocess_spec: Mapping[str, Callable] | None = None,
               mask_feature_name: str = MASK_FEATURE, seed: int | None = None,
               name: str = "dcn_ranker"):
    self._context_spec = dict(context_feature_spec)
    self._example_spec = dict(example_feature_spec)
    self._sparse_features = list(sparse_features)
    self._tables = list(tables)
    self._config = config
    self._preprocessor = model_lib.PreprocessorWithSpec(dict(preprocess_spec or {}))
    self._mask_feature_name = mask_feature_name
    self._seed = seed
    self._name = name

  def create_inputs(self):
    """(context_inputs, example_inputs): Keras inputs of the raw features."""
    return model_lib.FeatureSpecInputCreator(self._context_spec, self._example_spec)()

  def preprocess(self, context_features, example_features, mask):
    """Applies `preprocess_spec`; ragged features become dense. See tfr's Preprocessor."""
    return self._preprocessor(context_features, example_features, mask)

  def score(self, context_features, example_features, mask):
    """Cross network + DNN on each (context, example) pair.

    Args:
      context_features: name -> [batch_size, dim] float32.
      example_features: name -> [batch_size, list_size, dim] float32.
      mask: [batch_size, list_size] bool.

    Returns:
      [batch_size, list_size] float32 logits.
    """
    # tfr's FlattenList: context features repeated per example, lists flattened.
    context, examples = tfr.keras.layers.FlattenList()((context_features, example_features, mask))
    features = {**context, **examples}
    x0 = tf.keras.layers.Concatenate(axis=-1)([
        tf.keras.layers.Flatten()(tf.cast(features[name], tf.float32)) for name in sorted(features)
    ])
    x = x0
    for i in range(self._config.num_cross_layers):
      x = Cross(self._config.projection_dim, name=f"cross_{i}")((x0, x))
    for i, units in enumerate(self._config.hidden_layer_dims):
      x = tf.keras.layers.Dense(units, activation="relu", name=f"hidden_{i}")(x)
      if self._config.dropout:
        x = tf.keras.layers.Dropout(self._config.dropout)(x)
    logits = tf.keras.layers.Dense(1, name="logit")(x)
    return tfr.keras.layers.RestoreList()((logits, mask))

  def build(self) -> model_lib.SparseRankingModel:
    """The SparseRankingModel; call under the pipeline's strategy scope."""
    return model_lib.ModelBuilder(input_creator=self.create_inputs, preprocessor=self.preprocess,
                                  scorer=self.score, mask_feature_name=self._mask_feature_name,
                                  sparse_features=self._sparse_features, tables=self._tables,
                                  seed=self._seed, name=self._name).build()


class MovieLensDcn(movielens.MovieLensListwise):
  """MovieLens-100k lists ranked by DCN-v2: see the module docstring.

  Data, labels (`data.relevance`), tables, preprocessing and baseline are
  movielens_listwise's; only the scorer differs.
  """

  name = "movielens_dcn"
  ModelConfig = DcnModelConfig

  def build_model_builder(self, model: DcnModelConfig, seed):
    features, tables = self.sparse_features(model)
    context, example, _ = self.feature_specs()
    return DcnModelBuilder(context, example, features, tables, model,
                           preprocess_spec=movielens.PREPROCESS_SPEC, seed=seed,
                           name="movielens_dcn")
