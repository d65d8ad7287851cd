"""mslr_dnn's DNN with LambdaMART's tree leaves as sparse id features (GBDT + embeddings).

He et al., "Practical Lessons from Predicting Clicks on Ads at Facebook"
(ADKDD 2014): the leaf a document reaches in each boosted tree is a
categorical feature of a second model. Here the trees are LightGBM's
LambdaMART on the job's training lists (gbdt/leaf_trees.py), kept from the
lists whose leaves train the DNN either by cross-fitting in k folds or by a
disjoint split (`model.encoding`). `leaf_ids` is added to every batch before
insertion (gbdt/leaf_ids.LeafIds, the dataset builder's FeatureDeriver; the
export computes it too, with stock TF ops), each (fold, tree, leaf) a key of
the table `leaves` (folds x trees x leaves rows, so it never fills). A
document's leaves are combined (`model.leaf_combiner`) into one embedding,
joined to mslr_dnn's standardized log1p features, then tfr's DNNScorer. A list
the trees never saw (validation, serving) has each fold's leaves: it is scored
once per fold and the scores averaged (`FoldMean`).

The fitted trees are kept beside the ELWC conversions, named by the training
file and the tree settings, so a resumed run reads the trees its table was
keyed by. Main name: `LetorLeaves`; data and baseline as mslr_dnn's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import tensorflow as tf
import tensorflow_ranking as tfr

from builders.base import MASK_FEATURE, DataPaths, dataset_hparams
from builders.letor_leaves_config import CROSS_FIT, LeavesModelConfig
from builders.mslr import LABEL_SPEC, Log1pConcatPreprocessor, MslrDnn, cached_split, dnn_scorer
from builders.mslr_config import MslrDataConfig
from mxrec_pipeline.data import letor
from mxrec_pipeline.gbdt import leaf_trees
from mxrec_pipeline.gbdt.config import LambdaMartConfig
from mxrec_pipeline.gbdt.leaf_ids import LEAF_IDS, LeafIds
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.keras.layers import SparseFeature, TableSpec

FEATURES = "features"
LEAF_TABLE = "leaves"
QID_SPEC = {letor.QID_FEATURE: tf.io.FixedLenFeature([1], tf.int64, default_value=-1)}


class FoldSplit(tf.keras.layers.Layer):
  """[B, L, F] features and [B, L, k, D] leaf embeddings -> k lists per list, [B * k, L, F + D].

  List b's fold f is row b * k + f; the mask is repeated alike ([B * k, L]).
  """

  def call(self, features, leaves, mask):
    folds, list_size = tf.shape(leaves)[2], tf.shape(features)[1]
    tiled = tf.repeat(features[:, :, None, :], folds, axis=2)
    joined = tf.concat([tiled, leaves], axis=-1)
    width = features.shape[-1] + leaves.shape[-1]
    per_fold = tf.reshape(tf.transpose(joined, [0, 2, 1, 3]), [-1, list_size, width])
    return per_fold, tf.reshape(tf.repeat(mask[:, None, :], folds, axis=1), [-1, list_size])


class FoldMean(tf.keras.layers.Layer):
  """[B * k, L] scores (of FoldSplit's lists) -> [B, L]: the mean over each list's k folds."""

  def call(self, scores, leaves):
    folds, list_size = tf.shape(leaves)[2], tf.shape(scores)[1]
    return tf.reduce_mean(tf.reshape(scores, [-1, folds, list_size]), axis=1)


class FoldMeanScorer(tfr.keras.model.Scorer):
  """Scores each fold's leaves with one scorer and averages: [batch_size, list_size] float32.

  Args:
    scorer: The tfr Scorer of one encoding (e.g. DNNScorer), given
      {features_name: [B * k, L, F + D]}.
    features_name: The dense example feature, [B, L, F] float32.
    leaves_name: The leaves' embeddings, [B, L, k, D] float32 (k = 1 in
      training, the folds in validation and serving).
  """

  def __init__(self, scorer, features_name: str = FEATURES, leaves_name: str = LEAF_IDS):
    self._scorer = scorer
    self._features = features_name
    self._leaves = leaves_name

  def __call__(self, context_features, example_features, mask):
    """See tfr's `Scorer`."""
    leaves = example_features[self._leaves]
    per_fold, fold_mask = FoldSplit(name="fold_split")(example_features[self._features], leaves,
                                                       mask)
    scores = self._scorer(context_features, {self._features: per_fold}, fold_mask)
    return FoldMean(name="fold_mean")(scores, leaves)


class LetorLeaves(MslrDnn):
  """See the module docstring. Needs LightGBM (`pip install 'mxrec-pipeline[lambdamart]'`)."""

  name = "letor_leaves"
  DataConfig = MslrDataConfig
  ModelConfig = LeavesModelConfig

  def partition_paths(self, pattern: str, data) -> DataPaths:
    """Refused: the trees are fitted once on a whole training file, not per partition.

    Raises:
      ValueError: always, naming the builder.
    """
    raise ValueError(f"{self.name} cannot train continuously (--continuous): its trees are "
                     "fitted once on a whole training file and key its leaf table; train on "
                     "a file with `mxrec-pipeline train`")

  def sparse_features(self, model: LeavesModelConfig):
    """`leaf_ids` in table `leaves`: folds x trees x leaves rows of `model.leaf_dim`."""
    rows = model.num_models * model.num_trees * model.num_leaves
    return ([SparseFeature(LEAF_IDS, LEAF_TABLE, combiner=model.leaf_combiner)],
            [TableSpec(LEAF_TABLE, model.leaf_dim, rows)])

  def build_model_builder(self, model: LeavesModelConfig, seed):
    _, example_spec, _ = self.feature_specs()
    specs = {name: tf.TensorSpec([None, None, 1], tf.float32) for name in example_spec}
    specs[LEAF_IDS] = tf.TensorSpec([None, None, None, None], tf.int64)
    features, tables = self.sparse_features(model)
    return model_lib.ModelBuilder(
        input_creator=model_lib.TypeSpecInputCreator(specs, [], list(specs)),
        preprocessor=Log1pConcatPreprocessor(list(example_spec), FEATURES, model.use_log1p,
                                             self.standardizing(model), passthrough=[LEAF_IDS]),
        scorer=FoldMeanScorer(dnn_scorer(model)), mask_feature_name=MASK_FEATURE,
        sparse_features=features, tables=tables, seed=seed, name=self.name)

  def build_dataset_builder(self, paths: DataPaths, dataset, model: LeavesModelConfig):
    """See `RankerBuilder`: batches gain `leaf_ids` (a LeafIds fitted on `paths.train`).

    With `model.encoding` "disjoint" the trees are fitted on
    `model.tree_fraction` of `paths.train`'s lists and the DNN trains on the
    others. The trees are fitted once and read back afterwards (`leaf_models`).

    Raises:
      ValueError: too few training lists to split (disjoint), fewer training
        lists than folds, or lists sharing a qid.
      LambdaMartUnavailable: lightgbm missing, or LightGBM failed.
    """
    context, example, label = self.feature_specs()
    trees_on = paths.train
    if model.encoding != CROSS_FIT:
      split = cached_split(paths.train, os.path.dirname(paths.train), model.tree_fraction, 1,
                           model.tree_seed, part="trees")
      if split is None:
        raise ValueError(f"{paths.train}: too few training lists to fit the trees on a "
                         "disjoint part (model.encoding: disjoint); use cross_fit")
      paths, trees_on = dataclasses.replace(paths, train=split[0]), split[1]

    fitted = self.leaf_models(trees_on, dataset, model)
    deriver = LeafIds(fitted.tree_arrays(), fitted.num_folds, model.num_trees, model.num_leaves,
                      list(example), fitted.fold_of_list)
    features, _ = self.sparse_features(model)
    hparams = dataset_hparams(paths, dataset)
    return pipeline_lib.SimpleDatasetBuilder(context, example, MASK_FEATURE, label, hparams,
                                             sparse_features=features,
                                             training_only_context_spec=QID_SPEC,
                                             feature_deriver=deriver)

  def leaf_models(self, train: str, dataset, model: LeavesModelConfig) -> leaf_trees.LeafModels:
    """The tree models of the lists of ELWC file `train`, fitted once and kept beside it.

    Kept in `<train stem>.<digest of its name and the tree settings>.leaves/`
    (leaf_trees.LeafModels.save; the folds file is written last).
    """
    settings = (model.encoding, model.num_models, model.num_trees, model.num_leaves,
                model.tree_learning_rate, model.min_child_samples, model.tree_seed)
    key = hashlib.sha256(f"{os.path.basename(train)}|{settings}".encode()).hexdigest()[:16]
    stem = os.path.splitext(train)[0]
    directory = f"{stem}.{key}.leaves"
    fitted = leaf_trees.LeafModels.load(directory)
    if fitted is None:
      config = LambdaMartConfig(n_estimators=model.num_trees,
                                learning_rate=model.tree_learning_rate, num_leaves=model.num_leaves,
                                min_child_samples=model.min_child_samples)
      _, example, _ = self.feature_specs()
      lists = pipeline_lib.SimpleDatasetBuilder(
          {}, example, MASK_FEATURE, LABEL_SPEC,
          dataset_hparams(DataPaths(train, train),
                          dataclasses.replace(dataset, valid_list_size=None)),
          training_only_context_spec=QID_SPEC).build_raw_valid_dataset()
      fitted = leaf_trees.fit(lists, example, config, model.num_models, model.tree_seed)
      fitted.save(directory)
    return fitted
