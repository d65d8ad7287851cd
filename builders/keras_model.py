"""Ranking with an existing Keras model (TF-Ranking FAQ: "use my own Keras model").

`KerasModelBuilder` turns a Keras model that scores one (context, example)
pair into a listwise ranking model the pipeline trains and exports: tfr's
FlattenList repeats the context per example and flattens the lists, the model
scores every pair, tfr's RestoreList puts the scores back in lists.

Its features are dense; id features through the sparse core need
mxrec_pipeline.keras.model.ModelBuilder or a builder of your own. See
docs/writing-a-ranker.md#5-wrap-an-existing-keras-model for an example.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import tensorflow as tf

from mxrec_pipeline.keras import model as model_lib


class _KerasModelScorer(model_lib.UnivariateScorer):
  """tfr UnivariateScorer calling a Keras model on the flattened features."""

  def __init__(self, model: tf.keras.Model):
    self._model = model

  def _score_flattened(self, context_features, example_features):
    logits = self._model({**context_features, **example_features})
    return tf.reshape(logits, [-1, 1])


class KerasModelBuilder(model_lib.AbstractModelBuilder):
  """A ranking model from a Keras model that scores one (context, example) pair.

  The wrapped model's contract:

    inputs:  a dict keyed by feature name, one entry per context and per example
             feature: [batch, *feature_shape] of the feature's dtype (the shape
             and dtype of its tf.io.FixedLenFeature; e.g. [batch, 1] float32);
             `batch` here is every (list, example) pair of a ranking batch.
    output:  [batch, 1] or [batch] float32 scores.

  `build()` runs under the pipeline's distribution strategy, where every
  variable must be created. So a model *instance* is cloned there
  (tf.keras.models.clone_model, weights copied): the pipeline trains the clone
  (`pipeline.model`), never the object you passed. A zero-argument *function*
  returning the model is called there instead, with no clone; it is the way
  to wrap a subclassed model, with `input_specs`.

  Args:
    model: A functional or Sequential tf.keras.Model whose inputs are named
      as the features, or a function () -> tf.keras.Model.
    context_feature_names: Model inputs that are context (query/user) features.
    example_feature_names: Model inputs that are example (document/item)
      features; at least one.
    mask_feature_name: Name of the [batch_size, list_size] bool list mask.
    input_specs: Feature name -> tf.TensorSpec([None, *feature_shape], dtype)
      of one pair; None reads them from the model's inputs.
    name: Name of the ranking model.

  Raises:
    ValueError: no example feature, a name in both lists, a model without
      named inputs and no `input_specs`, or feature names that are not
      exactly the model's inputs (the message names the difference).
  """

  def __init__(self, model: tf.keras.Model | Callable[[], tf.keras.Model],
               context_feature_names: Sequence[str], example_feature_names: Sequence[str],
               mask_feature_name: str, input_specs: Mapping[str, tf.TensorSpec] | None = None,
               name: str | None = None):
    self._model = model
    self._context_names = list(context_feature_names)
    self._example_names = list(example_feature_names)
    self._mask_feature_name = mask_feature_name
    self._input_specs = dict(input_specs) if input_specs is not None else None
    self._name = name
    if not self._example_names:
      raise ValueError("KerasModelBuilder: `example_feature_names` must name at least one "
                       "model input")
    both = sorted(set(self._context_names) & set(self._example_names))
    if both:
      raise ValueError(f"KerasModelBuilder: features {both} are both context and example "
                       "features")
    if not isinstance(model, tf.keras.Model) and not callable(model):
      raise ValueError(f"KerasModelBuilder: `model` must be a tf.keras.Model or a function "
                       f"returning one, got {type(model).__name__}")
    if self._input_specs is not None:
      self._check_names(self._input_specs)
    elif isinstance(model, tf.keras.Model):
      self._check_names(self._model_input_specs(model))

  def build(self) -> model_lib.SparseRankingModel:
    """See `AbstractModelBuilder`. Call under the pipeline's strategy scope."""
    model = self._model_in_scope()
    specs = self._input_specs or self._model_input_specs(model)
    self._check_names(specs)
    listwise = {}
    for name, spec in specs.items():
      per_list = [None] if name in self._example_names else []
      listwise[name] = tf.TensorSpec([None, *per_list, *spec.shape[1:]], spec.dtype)
    return model_lib.ModelBuilder(
        input_creator=model_lib.TypeSpecInputCreator(listwise, self._context_names,
                                                     self._example_names), preprocessor={},
        scorer=_KerasModelScorer(model), mask_feature_name=self._mask_feature_name,
        name=self._name).build()

  def _model_in_scope(self) -> tf.keras.Model:
    if not isinstance(self._model, tf.keras.Model):
      model = self._model()
      if not isinstance(model, tf.keras.Model):
        raise ValueError(f"KerasModelBuilder: the model function returned "
                         f"{type(model).__name__}, not a tf.keras.Model")
      return model
    clone = tf.keras.models.clone_model(self._model)
    clone.set_weights(self._model.get_weights())
    return clone

  def _model_input_specs(self, model: tf.keras.Model) -> dict[str, tf.TensorSpec]:
    inputs = getattr(model, "inputs", None)
    if not inputs:
      raise ValueError(
          f"KerasModelBuilder: model '{model.name}' has no inputs to read the features' "
          "shapes from (a subclassed model?); build it functionally or pass `input_specs`")
    return {name: tf.TensorSpec(t.shape, t.dtype) for name, t in zip(model.input_names, inputs)}

  def _check_names(self, specs: Mapping[str, tf.TensorSpec]) -> None:
    named = set(self._context_names) | set(self._example_names)
    missing, unnamed = sorted(named - set(specs)), sorted(set(specs) - named)
    if missing or unnamed:
      raise ValueError(
          f"KerasModelBuilder: the feature names must be exactly the model's inputs "
          f"{sorted(specs)}; not inputs: {missing}; inputs neither context nor example "
          f"features: {unnamed}")
