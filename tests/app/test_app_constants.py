"""The TensorFlow-free constants and config classes agree with the modules they mirror."""

import tensorflow as tf
import tensorflow_ranking as tfr

import builders
from builders import movielens_config
from mxrec_pipeline import hparams
from mxrec_pipeline.keras import layers
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.optimizers import factory
from mxrec_pipeline.optimizers import keys


def test_loss_keys_are_tfrs():
  tfr_keys = {
      v for k, v in vars(tfr.keras.losses.RankingLossKey).items()
      if not k.startswith("_") and isinstance(v, str)
  }
  assert hparams.LOSS_KEYS == tfr_keys


def test_sparse_optimizer_keys_are_the_factorys():
  assert keys.SPARSE_OPTIMIZER_KEYS == set(factory._FACTORIES)  # pylint: disable=protected-access


def test_movielens_combiners_are_the_layers():
  assert movielens_config.COMBINERS == layers.COMBINERS


def test_pipeline_reexports_the_hparams():
  assert pipeline_lib.PipelineHparams is hparams.PipelineHparams
  assert pipeline_lib.RANKING_METRICS is hparams.RANKING_METRICS
  assert hparams.AUTO_REDUCTION == tf.keras.losses.Reduction.AUTO


def test_registry_entries_name_the_rankers_config_classes():
  for name in builders.REGISTRY:
    ranker = builders.REGISTRY[name]
    assert builders.get_config_classes(name) == (ranker.DataConfig, ranker.ModelConfig)
