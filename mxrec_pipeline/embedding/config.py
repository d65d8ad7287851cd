"""TableConfig and FeatureConfig, as in tf.tpu.experimental.embedding.

Same arguments and defaults as TensorFlow's classes (tensorflow/python/tpu/
tpu_embedding_v2_utils.py), with one change of meaning: `vocabulary_size` is
not a fixed id range but the table's device capacity (`device_vocabulary_size`
of the sparse core): any int32/int64 (or string) id may be looked up, and the
table holds at most that many distinct ids.

Several FeatureConfigs may share one TableConfig object (the features are then
looked up in one table). Configs compare and hash by identity, as TensorFlow's
do, so they can key `Embedding.embedding_tables`. The Embedding never writes
into them (TPUEmbedding sets `table.optimizer` and `table.name` on yours).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Callable

import tensorflow as tf

from mxrec_pipeline.core import combiner as combiner_lib
from mxrec_pipeline.embedding import optimizers


@dataclasses.dataclass(frozen=True, eq=False)
class TableConfig:
  """One embedding table (tf.tpu.experimental.embedding.TableConfig).

  Attributes:
    vocabulary_size: Rows of the table on the device: the most distinct ids it
      holds (the sparse core's device_vocabulary_size), a positive int. A
      training batch that would exceed it fails with an error naming the table.
    dim: Embedding dimension, a positive int.
    initializer: Called as `initializer(shape=[vocabulary_size, dim],
      dtype=tf.float32)` once, when the table is created. Default: truncated
      normal, mean 0, stddev 1/sqrt(dim) (TPUEmbedding's default).
    optimizer: SGD, Adagrad or Adam of this module; overrides the Embedding's
      optimizer for this table. None uses the Embedding's.
    combiner: How the ids of one position of a multi-valued (sparse or ragged)
      feature are reduced: "mean" (default), "sum" or "sqrtn", weighted as in
      tf.nn.embedding_lookup_sparse.
    name: Table name, unique among the run's tables (letters, digits, '_', '.',
      '-', '/'); default `table_<i>`, i its position of first use in the
      Embedding's feature config.
    quantization_config: TPU simulated quantization; not available here
      (NotImplementedError unless None).

  Raises:
    ValueError: vocabulary_size or dim not a positive int, initializer not
      callable, an unknown combiner (each named with the bad value).
    NotImplementedError: a quantization_config.
  """

  vocabulary_size: int
  dim: int
  initializer: Callable | None = None
  optimizer: optimizers.Optimizer | None = None
  combiner: str = "mean"
  name: str | None = None
  quantization_config: object = None

  def __post_init__(self):
    for field in ("vocabulary_size", "dim"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"TableConfig {self.name or ''}: `{field}` must be an int >= 1, "
                         f"got {value!r}")
      object.__setattr__(self, field, int(value))
    if self.initializer is not None and not callable(self.initializer):
      raise ValueError(f"TableConfig {self.name or ''}: `initializer` must be callable or None, "
                       f"got {self.initializer!r}")
    if self.initializer is None:
      object.__setattr__(self, "initializer",
                         tf.initializers.TruncatedNormal(mean=0.0, stddev=1 / math.sqrt(self.dim)))
    combiner_lib.check_combiner(self.combiner, f"TableConfig {self.name or ''}")
    if self.name is not None and (not isinstance(self.name, str) or not self.name):
      raise ValueError(f"TableConfig: `name` must be a non-empty string or None, "
                       f"got {self.name!r}")
    if self.quantization_config is not None:
      raise NotImplementedError(
          f"TableConfig {self.name or ''}: `quantization_config` (TPU simulated quantization) "
          "is not available; leave it None")

  def __repr__(self):
    return (f"TableConfig(vocabulary_size={self.vocabulary_size}, dim={self.dim}, "
            f"optimizer={self.optimizer!r}, combiner={self.combiner!r}, name={self.name!r})")


@dataclasses.dataclass(frozen=True, eq=False)
class FeatureConfig:
  """One id feature and its table (tf.tpu.experimental.embedding.FeatureConfig).

  Attributes:
    table: The TableConfig it is looked up in; several features may share one.
    max_sequence_length: 0 (default): the feature's ids at one position are
      combined to one embedding. > 0: a rank-2 sparse or ragged feature is a
      sequence, embedded id by id and padded (zeros) or truncated to this
      length: `[batch_size, max_sequence_length, dim]`. Ignored when
      `output_shape` is set or the input is dense or of rank > 2 (as in
      TPUEmbedding).
    validate_weights_and_indices: Accepted for TPUEmbedding code; no effect
      (TPUEmbedding uses it on its CPU serving path to drop negative ids; here
      every int64 is a valid key).
    output_shape: Activation shape without the embedding dimension, e.g.
      `[batch_size]` or `[batch_size, list_size]`; per replica under a
      strategy. Highest priority of TPUEmbedding's output-shape rules (see
      `Embedding`). None dims match any size. Default: unset.
    name: Informational name (TPUEmbedding uses it on SparseCore).

  Raises:
    ValueError: `table` not a TableConfig of this module, max_sequence_length
      not an int >= 0, validate_weights_and_indices not a bool.
  """

  table: TableConfig
  max_sequence_length: int = 0
  validate_weights_and_indices: bool = True
  output_shape: tf.TensorShape | list | None = None
  name: str | None = None

  def __post_init__(self):
    if not isinstance(self.table, TableConfig):
      raise ValueError(f"FeatureConfig {self.name or ''}: `table` must be a "
                       f"mxrec_pipeline.embedding.TableConfig, got {type(self.table).__name__}")
    value = self.max_sequence_length
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
      raise ValueError(f"FeatureConfig {self.name or ''}: `max_sequence_length` must be an "
                       f"int >= 0, got {value!r}")
    object.__setattr__(self, "max_sequence_length", int(value))
    if not isinstance(self.validate_weights_and_indices, bool):
      raise ValueError(f"FeatureConfig {self.name or ''}: `validate_weights_and_indices` must "
                       f"be a bool, got {self.validate_weights_and_indices!r}")
    object.__setattr__(self, "output_shape", tf.TensorShape(self.output_shape))

  def __repr__(self):
    return (f"FeatureConfig(table={self.table!r}, max_sequence_length="
            f"{self.max_sequence_length}, output_shape={self.output_shape}, name={self.name!r})")
