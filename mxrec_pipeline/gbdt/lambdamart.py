"""LightGBM's LambdaMART on a job's ELWC data, scored by the job's own metric code.

The strong classical baseline of learning to rank: gradient-boosted trees
trained with the LambdaRank gradients (Burges, "From RankNet to LambdaRank to
LambdaMART: An Overview", MSR-TR-2010-82), as LightGBM's objective
"lambdarank" implements them (its label gains 2^label - 1 are NDCG's gains in
tfr's metrics), trained with `lightgbm.train` and the parameters
`lightgbm.LGBMRanker` passes it (LGBMRanker's trees without scikit-learn).
`evaluate` trains on every whole list of the training file and scores the same
validation batches as the model with `evaluation.evaluate_scores`.
`feature_layout` maps the ELWC feature specs to columns: dense numeric
features, single-valued ids and strings as categorical, multi-valued ones
skipped.

LightGBM is an optional extra (`pip install 'mxrec-pipeline[lambdamart]'`),
imported here only when a job trains LambdaMART; without it `evaluate` says
why (`LIGHTGBM_MISSING`) and the job runs on.
See docs/configuration.md#lambdamart-optional-mxrec_pipelinegbdtconfigpy-lambdamartconfig.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Collection, Iterable, Mapping

import numpy as np
import tensorflow as tf

from mxrec_pipeline import evaluation
from mxrec_pipeline.gbdt.config import LambdaMartConfig

LIGHTGBM_MISSING = "lightgbm is not installed (pip install 'mxrec-pipeline[lambdamart]')"
DISABLED = "disabled (lambdamart.enabled: false)"
# LightGBM's default `label_gain` (2^i - 1) has entries for the grades 0..30.
MAX_LABEL = 30
NUMERIC, CATEGORICAL = "numeric", "categorical"
LIST_ID_FEATURE = "qid"  # The context feature naming a list, for `collect(list_ids=...)`.


class LambdaMartUnavailable(Exception):
  """LambdaMART cannot be trained on this job; `str(e)` is the reason, one line."""


@dataclasses.dataclass(frozen=True)
class Column:
  """A feature's columns in the LambdaMART matrix.

  Attributes:
    name: The ELWC feature.
    kind: NUMERIC or CATEGORICAL.
    width: Number of columns (values per document), >= 1; 1 for CATEGORICAL.
    is_context: A context feature, repeated for every document of the list.
  """

  name: str
  kind: str
  width: int
  is_context: bool


@dataclasses.dataclass(frozen=True)
class FeatureLayout:
  """The LambdaMART matrix's columns, in order, and the features left out.

  Attributes:
    columns: Context features first, then example features, each in spec order.
    skipped: Names of the features that have no column (multi-valued).
    list_feature: A dense example feature: its `[batch_size, list_size, ...]`
      shape gives a batch's list size.
  """

  columns: tuple[Column, ...]
  skipped: tuple[str, ...]
  list_feature: str

  @property
  def column_names(self) -> list[str]:
    """One name per matrix column: the feature's, with `[i]` when it has several values."""
    return [
        c.name if c.width == 1 else f"{c.name}[{i}]" for c in self.columns for i in range(c.width)
    ]

  @property
  def categorical_indices(self) -> list[int]:
    """Matrix column indices of the CATEGORICAL features (LightGBM's `categorical_feature`)."""
    indices, start = [], 0
    for column in self.columns:
      if column.kind == CATEGORICAL:
        indices.append(start)
      start += column.width
    return indices


def feature_layout(
    context_spec: Mapping[str, object], example_spec: Mapping[str, object],
    id_features: Collection[str] = ()) -> FeatureLayout:
  """Which ELWC features become which LambdaMART columns.

  - numeric: a FixedLenFeature of float32 or int64 that is not a sparse id
    feature, one column per value (LETOR's `custom_features_*`, MovieLens'
    age and year); context features are repeated for every document;
  - categorical: a single-valued id feature (int64 or string; MovieLens'
    user_id, item_id, gender, occupation, zip) or any single-valued string
    feature: codes numbered as values first appear in the training file
    (sorted within a batch); values never seen there are missing (NaN) in
    validation;
  - skipped (named in metrics.json): multi-valued features (RaggedFeature,
    VarLenFeature or several ids per document: MovieLens' genres and title
    tokens).

  Args:
    context_spec, example_spec: The ranker's ELWC feature specs (name ->
      tf.io.FixedLenFeature, RaggedFeature, VarLenFeature, ...).
    id_features: Names of the sparse id features (the ranker's SparseFeatures).

  Returns:
    The layout; it may have no column (then `train` refuses it).

  Raises:
    LambdaMartUnavailable: `example_spec` has no tf.io.FixedLenFeature.
  """
  list_feature = next(
      (name for name, f in example_spec.items() if isinstance(f, tf.io.FixedLenFeature)), None)
  if list_feature is None:
    raise LambdaMartUnavailable(f"no dense (FixedLenFeature) example feature, the example "
                                f"spec has {sorted(example_spec)}")
  columns, skipped = [], []
  for is_context, spec in ((True, context_spec), (False, example_spec)):
    for name, feature in spec.items():
      width = math.prod(feature.shape) if isinstance(feature, tf.io.FixedLenFeature) else 0
      is_string = getattr(feature, "dtype", None) == tf.string
      if width == 1 and (is_string or name in id_features):
        columns.append(Column(name, CATEGORICAL, 1, is_context))
      elif width >= 1 and not is_string and name not in id_features:
        columns.append(Column(name, NUMERIC, width, is_context))
      else:
        skipped.append(name)
  return FeatureLayout(tuple(columns), tuple(skipped), list_feature)


class Encoder:
  """Raw feature batches -> LambdaMART matrices; holds the categorical codes.

  Args:
    layout: The columns.
  """

  def __init__(self, layout: FeatureLayout):
    self.layout = layout
    self._codes: dict[str, dict] = {c.name: {} for c in layout.columns if c.kind == CATEGORICAL}

  def encode(self, features: Mapping[str, tf.Tensor], list_size: int,
             add_codes: bool) -> np.ndarray:
    """The matrix of one batch.

    Args:
      features: Raw features of a batch as tfr's ELWC parsing gives them:
        context `[batch_size, width]`, example `[batch_size, list_size, width]`.
      list_size: The batch's list size (of its labels).
      add_codes: Give new categorical values new codes (training); else
        they are NaN (LightGBM's missing value).

    Returns:
      `[batch_size, list_size, num_columns] float32`.
    """
    parts = []
    for column in self.layout.columns:
      value = features[column.name].numpy()
      batch_size = value.shape[0]
      value = value.reshape(batch_size, 1 if column.is_context else list_size, column.width)
      if column.kind == CATEGORICAL:
        value = self._codes_of(column.name, value, add_codes)
      parts.append(np.broadcast_to(value.astype(np.float32), (batch_size, list_size, column.width)))
    return np.concatenate(parts, axis=-1)

  def _codes_of(self, name: str, values: np.ndarray, add_codes: bool) -> np.ndarray:
    codes = self._codes[name]
    if add_codes:
      for value in np.unique(values).tolist():  # Python ints or bytes, sorted.
        codes.setdefault(value, len(codes))
    return np.vectorize(lambda v: codes.get(v, np.nan), otypes=[np.float32])(values)


@dataclasses.dataclass
class TrainedLambdaMart:
  """A fitted LambdaMART with the encoder of its features.

  Attributes:
    model: The `lightgbm.Booster`.
    encoder: Encodes raw features as in training.
    info: What was trained (params, columns, lists and documents), for metrics.json.
  """

  model: object
  encoder: Encoder
  info: dict

  def score(self, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
    """Scores of a raw batch: `[batch_size, list_size] float32` (padding scored too).

    The list size is that of the batch's example features.
    """
    batch_size, list_size = features[self.encoder.layout.list_feature].shape[:2]
    matrix = self.encoder.encode(features, list_size, add_codes=False)
    flat = matrix.reshape(batch_size * list_size, -1)
    return tf.constant(self.model.predict(flat).reshape(batch_size, list_size), tf.float32)


def lgbm_params(config: LambdaMartConfig, seed: int | None) -> dict:
  """LightGBM parameters (`lightgbm.train`'s `params`) of a config.

  `LGBMRanker(objective="lambdarank", n_estimators=.., learning_rate=..,
  num_leaves=.., min_child_samples=.., random_state=seed)` passes these
  (`n_estimators` is `lightgbm.train`'s `num_boost_round`, `LambdaMartConfig`),
  plus `deterministic` and `force_row_wise` (the same trees in every run of
  the same data and seed, LightGBM's advice for reproducible results) and no
  log output.
  """
  params = dict(objective="lambdarank", learning_rate=config.learning_rate,
                num_leaves=config.num_leaves, min_child_samples=config.min_child_samples,
                num_threads=config.num_threads, deterministic=True, force_row_wise=True, verbose=-1)
  if seed is not None:
    params["seed"] = seed
  return params


def import_lightgbm():
  """The lightgbm module.

  Raises:
    LambdaMartUnavailable: it is not installed (LIGHTGBM_MISSING).
  """
  try:
    return importlib.import_module("lightgbm")
  except ImportError:
    raise LambdaMartUnavailable(LIGHTGBM_MISSING) from None


def collect(batches: Iterable, encoder: Encoder,
            list_ids: list | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The documents of every list of a dataset, as LightGBM's ranking input.

  Args:
    batches: (features, labels) batches; labels `[batch_size, list_size]`
      float32, padding < 0.
    encoder: Encodes the features; new categorical values get codes.
    list_ids: None, or a list to which each kept list's id is appended, in
      order: its context feature LIST_ID_FEATURE ("qid", as LETOR's).

  Returns:
    (matrix `[num_documents, num_columns] float32`, labels `[num_documents]
    int32`, group `[num_lists] int64`: documents per list, in order). Lists
    without a document are left out.

  Raises:
    LambdaMartUnavailable: no document, or a label that is not an integer
      (LightGBM's lambdarank takes integer grades) or above MAX_LABEL.
  """
  rows, grades, group = [], [], []
  for features, labels in batches:
    labels = labels.numpy()
    matrix = encoder.encode(features, labels.shape[1], add_codes=True)
    valid = labels >= 0
    ids = None if list_ids is None else features[LIST_ID_FEATURE].numpy().reshape(-1)
    for b in range(labels.shape[0]):
      if valid[b].any():
        rows.append(matrix[b][valid[b]])
        grades.append(labels[b][valid[b]])
        group.append(int(valid[b].sum()))
        if ids is not None:
          list_ids.append(ids[b].item())
  if not group:
    raise LambdaMartUnavailable("the training file has no labeled document")
  labels = np.concatenate(grades)
  if np.any(labels != np.round(labels)):
    bad = labels[labels != np.round(labels)][0]
    raise LambdaMartUnavailable(f"a training label is not an integer ({bad:g}); LightGBM's "
                                "lambdarank needs integer relevance grades")
  if labels.max() > MAX_LABEL:
    raise LambdaMartUnavailable(f"a training label is above {MAX_LABEL} ({labels.max():g}), "
                                "the highest grade of LightGBM's default label_gain")
  return np.concatenate(rows), labels.astype(np.int32), np.asarray(group, np.int64)


def train(train_batches: Iterable, layout: FeatureLayout, config: LambdaMartConfig,
          seed: int | None, holdout_batches: Iterable | None = None,
          refit_batches: Iterable | None = None) -> TrainedLambdaMart:
  """Fits LightGBM's LambdaMART (objective "lambdarank") on every training list.

  Args:
    train_batches: (features, labels) batches of the training file (raw
      features, whole lists).
    layout: The feature columns.
    config: Tree parameters.
    seed: LightGBM's `seed` (None: its default seeds).
    holdout_batches: With `config.early_stopping_rounds`: held-out training
      lists (as `train_batches`) whose NDCG@10 stops the boosting
      (`lightgbm.early_stopping`); the model keeps the best round's trees.
    refit_batches: With `holdout_batches`: then fit the best round count of
      trees on these lists (every training list) as the model.

  Raises:
    LambdaMartUnavailable: lightgbm missing, no feature column, no labeled
      document, labels that are not integers in [0, MAX_LABEL], or
      LightGBM's own error (its message).
  """
  lightgbm = import_lightgbm()
  if not layout.columns:
    raise LambdaMartUnavailable(f"no feature it can use (skipped: {list(layout.skipped)})")
  encoder = Encoder(layout)

  def ranking_data(batches):
    """(lightgbm.Dataset of every list of `batches`, their labels, their group sizes)."""
    matrix, labels, group = collect(batches, encoder)
    return lightgbm.Dataset(matrix, labels, group=group,
                            categorical_feature=layout.categorical_indices or "auto",
                            params={"verbose": -1}), labels, group

  data, labels, group = ranking_data(train_batches)
  params = lgbm_params(config, seed)
  stops = holdout_batches is not None and config.early_stopping_rounds is not None
  stopping = {}
  try:
    if not stops:
      model = lightgbm.train(params, data, num_boost_round=config.n_estimators)
    else:
      held, held_labels, held_group = collect(holdout_batches, encoder)
      valid = lightgbm.Dataset(held, held_labels, group=held_group, reference=data)
      model = lightgbm.train(
          params | {"metric": "ndcg", "eval_at": [10]}, data, num_boost_round=config.n_estimators,
          valid_sets=[valid],
          callbacks=[lightgbm.early_stopping(config.early_stopping_rounds, verbose=False)])
      stopping = {"best_round": int(model.best_iteration), "holdout_lists": int(held_group.size)}
      if refit_batches is not None:
        data, labels, group = ranking_data(refit_batches)
        model = lightgbm.train(params, data, num_boost_round=max(model.best_iteration, 1))
        stopping["refit"] = True
  except lightgbm.basic.LightGBMError as e:
    raise LambdaMartUnavailable(f"LightGBM failed: {e}") from e
  info = {
      "params": {
          "n_estimators": config.n_estimators,
          **{k: v for k, v in params.items() if k != "verbose"}
      },
      **({"early_stopping": stopping} if stopping else {}),
      "lightgbm_version": lightgbm.__version__,
      "columns": len(layout.column_names),
      "categorical_features": [c.name for c in layout.columns if c.kind == CATEGORICAL],
      "skipped_features": list(layout.skipped),
      "train_lists": int(group.size),
      "train_documents": int(labels.size),
  }
  return TrainedLambdaMart(model, encoder, info)


def evaluate(train_batches: Iterable, valid_dataset: tf.data.Dataset, context_spec: Mapping[str,
                                                                                            object],
             example_spec: Mapping[str, object], id_features: Collection[str],
             config: LambdaMartConfig, seed: int | None, holdout_batches: Iterable | None = None,
             refit_batches: Iterable | None = None) -> tuple[dict[str, float] | None, dict]:
  """LambdaMART's validation metrics, or None and the reason it is absent.

  Args:
    train_batches: As `train`.
    valid_dataset: The validation batches the model and baseline are scored
      on (raw features), finite.
    context_spec, example_spec, id_features: As `feature_layout`.
    config, seed, holdout_batches, refit_batches: As `train`.

  Returns:
    (metrics keyed as RANKING_METRICS, info): info is `train`'s, or
    {"reason": one line} with metrics None (lightgbm missing, no usable
    feature, non-integer labels, ...).

  Example:

    metrics, info = evaluate(train_batches, valid_batches, context_spec, example_spec,
                             ["item_id"], LambdaMartConfig(), seed=1)
  """
  try:
    layout = feature_layout(context_spec, example_spec, id_features)
    trained = train(train_batches, layout, config, seed, holdout_batches, refit_batches)
  except LambdaMartUnavailable as e:
    return None, {"reason": str(e)}
  return evaluation.evaluate_scores(valid_dataset, trained.score), trained.info
