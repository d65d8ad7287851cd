"""get_asc_insert_func, as in mx_rec.core.asc.helper.

mxRec's ASC ("key process") deduplicates each batch's ids per table and maps
them to rows while the previous step trains. Here the same work runs as a
`dataset.map` function on tf.data's threads: prefetch overlaps it with the step,
and the model graph holds no hashtable op, only gathers.
"""

from __future__ import annotations

import collections
import os
from typing import Sequence

import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core import key_index
from mxrec_pipeline.core import tiers
from mxrec_pipeline.core.asc import feature_spec as fs
from mxrec_pipeline.util import initialize

DUMP_DIR = "export_graph"


def get_asc_insert_func(tgt_key_specs: Sequence[fs.FeatureSpec], is_training: bool,
                        dump_graph: bool = False):
  """Returns a `dataset.map` function that inserts each batch's ids.

  The function takes a batch dict (or a tuple whose first element is the
  feature dict, as Keras datasets give `(features, labels)`) and returns it with,
  per table, `unique_rows_key(table)`: [num_unique] int64 rows of the batch's
  distinct ids (all features of the table together, first-occurrence order;
  for a tiered table in training, device slots of its device-cache plan, whose
  token goes to `plan_key(table)`, [1] int64) and, per feature,
  `restore_key(feature)`: int32 positions in those unique rows, shaped like the
  ids (a dense tensor of any rank, or a tf.RaggedTensor with the ids' row
  partitions, for multi-valued features).
  sparse_lookup(table, spec, batch=batch) reads them.

  Args:
    tgt_key_specs: FeatureSpecs of the id features (names unique).
    is_training: True inserts unseen ids (a full table fails the batch with an
      error naming it); False maps them to -1, read as the table's
      serving_default_value, without taking rows.
    dump_graph: Write the traced insertion graph to
      `export_graph/asc_insert_{train|eval}.pbtxt` for inspection.

  Returns:
    A function for `tf.data.Dataset.map`. Map it without num_parallel_calls
    to keep row assignment reproducible; follow it with `prefetch`.

  Raises:
    RuntimeError: init() was not called.
    ValueError: no specs, duplicate feature names; when mapping, a missing
      batch key (named) or ids of a dtype other than int32/int64/string.
  """
  run = initialize.get_config_initializer()
  container = run.container
  specs = list(tgt_key_specs or [])
  if not specs:
    raise ValueError("get_asc_insert_func: `tgt_key_specs` must hold at least one FeatureSpec")
  names = [s.name for s in specs]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"get_asc_insert_func: duplicate FeatureSpec names {duplicates}")
  timestamp_specs = [s for s in specs if s.is_timestamp]
  if len(timestamp_specs) > 1:
    raise ValueError(f"get_asc_insert_func: at most one FeatureSpec with is_timestamp=True, "
                     f"got {[s.name for s in timestamp_specs]}")
  by_table = group_by_table([s for s in specs if not s.is_timestamp])
  _configure_admission(by_table, bool(timestamp_specs))
  run.insert_tables.update(by_table)

  def insert(features, *rest):
    check_id_dtypes(features, by_table, run.tables)
    timestamp = None
    if timestamp_specs:
      key = timestamp_specs[0].index_key
      if key not in features:
        raise ValueError(f"FeatureSpec '{timestamp_specs[0].name}': batch has no key '{key}'; "
                         f"keys are {sorted(features)}")
      timestamp = admission.batch_timestamp(features[key])

    tokens = {}

    def native_insert(table_name, keys, counts):
      rows, restore = admission.insert(container, table_name, keys, is_training, counts, timestamp)
      table = run.tables.get(table_name)
      if table is not None and table.is_tiered:
        # Tiered table: the key process plans the device cache (core/tiers.py).
        if is_training:
          rows, tokens[table_name] = tiers.plan(container, table_name, rows)
        else:
          tokens[table_name] = tf.zeros([1], tf.int64)
      return rows, restore

    out = insert_ids(features, by_table, native_insert, with_counts=True)
    for table_name, token in tokens.items():
      out[fs.plan_key(table_name)] = token
    if dump_graph:
      _dump(tf.compat.v1.get_default_graph(), is_training)
    return (out, *rest) if rest else out

  return insert


def check_id_dtypes(features, by_table: dict[str, list[fs.FeatureSpec]], tables) -> None:
  """Ids must have their table's key_dtype, as sparse_lookup requires.

  Without this check, string ids of an int64 table would be hashed and
  inserted (and int ids of a string table widened) without a word.

  Args:
    features: The batch dict (anything else is left to insert_ids).
    by_table: Table name -> FeatureSpecs (see group_by_table).
    tables: Table name -> created table (with `key_dtype`); tables not
      created yet are not checked.

  Raises:
    ValueError: naming the FeatureSpec, its ids' dtype, the table and its key_dtype.
  """
  if not isinstance(features, dict):
    return
  for table_name, table_specs in by_table.items():
    table = tables.get(table_name)
    for spec in table_specs if table is not None else ():
      ids = features.get(spec.index_key)
      if ids is not None and ids.dtype != table.key_dtype:
        raise ValueError(
            f"FeatureSpec '{spec.name}': ids are {ids.dtype.name}, but table '{table_name}' has "
            f"key_dtype {table.key_dtype.name}; give {table.key_dtype.name} ids (or create the "
            f"table with key_dtype={ids.dtype.name})")


def _configure_admission(by_table: dict[str, list[fs.FeatureSpec]], has_timestamp: bool) -> None:
  """Registers the admission/eviction thresholds of the specs' tables."""
  for table_name, table_specs in by_table.items():
    for spec in table_specs:
      if spec.access_threshold is None and spec.eviction_threshold is None:
        continue
      if spec.eviction_threshold is not None and not has_timestamp:
        raise ValueError(f"FeatureSpec '{spec.name}': eviction_threshold needs a FeatureSpec "
                         "with is_timestamp=True in the same get_asc_insert_func")
      admission.configure(
          table_name, admission.AdmitEvictConfig(spec.access_threshold, spec.eviction_threshold),
          f"FeatureSpec '{spec.name}'")


def group_by_table(specs: Sequence[fs.FeatureSpec]) -> dict[str, list[fs.FeatureSpec]]:
  """Table name -> its FeatureSpecs, in first-appearance order."""
  by_table = collections.defaultdict(list)
  for spec in specs:
    by_table[spec.table_name].append(spec)
  return dict(by_table)


def insert_ids(features: dict, by_table: dict[str, list[fs.FeatureSpec]], insert_fn,
               with_counts: bool = False) -> dict:
  """Adds every table's unique rows and every feature's restore indices.

  The one place that lays out the insertion results in a batch; the native
  insertion (training) and the stock-TF one of exported SavedModels share it.

  Args:
    features: Batch dict; ids are dense or ragged int32/int64/string tensors.
    by_table: Table name -> FeatureSpecs (see group_by_table).
    insert_fn: (table_name, keys [n] int64) -> (unique_rows [u] int64,
      restore [n] int32).
    with_counts: insert_fn also takes counts [n] int64: each key's feature's
      faae_coefficient (admission weights).

  Returns:
    A new dict: `features` plus `unique_rows_key(table)` per table and
    `restore_key(feature)` per feature (shaped like its ids).

  Raises:
    ValueError: a batch that is not a dict, a missing feature (named), ids of
      an unsupported type or dtype.
  """
  if not isinstance(features, dict):
    raise ValueError(
        f"get_asc_insert_func: batches must be dicts of features (or (dict, ...) tuples), "
        f"got {type(features).__name__}")
  out = dict(features)
  for table_name, table_specs in by_table.items():
    flat_keys = []
    for spec in table_specs:
      if spec.index_key not in features:
        raise ValueError(f"FeatureSpec '{spec.name}': batch has no key '{spec.index_key}'; "
                         f"keys are {sorted(features)}")
      ids = features[spec.index_key]
      if spec.feat_count is not None and not isinstance(ids, tf.RaggedTensor):
        last = ids.shape[-1] if ids.shape.rank else None
        if last is not None and last != spec.feat_count:
          raise ValueError(f"FeatureSpec '{spec.name}': ids' last dimension is {last}, "
                           f"feat_count says {spec.feat_count}")
      values = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
      if not isinstance(values, tf.Tensor):
        raise ValueError(f"FeatureSpec '{spec.name}': ids must be a dense or ragged tensor, got "
                         f"{type(ids).__name__}")
      keys = key_index.to_keys(values, what=f"FeatureSpec '{spec.name}'")
      flat_keys.append(tf.reshape(keys, [-1]))
    keys = flat_keys[0] if len(flat_keys) == 1 else tf.concat(flat_keys, axis=0)
    if with_counts:
      counts = [
          tf.fill(tf.shape(k, out_type=tf.int64), tf.constant(spec.faae_coefficient, tf.int64))
          for spec, k in zip(table_specs, flat_keys)
      ]
      counts = counts[0] if len(counts) == 1 else tf.concat(counts, axis=0)
      unique_rows, restore = insert_fn(table_name, keys, counts)
    else:
      unique_rows, restore = insert_fn(table_name, keys)
    out[fs.unique_rows_key(table_name)] = unique_rows
    sizes = [tf.size(k) for k in flat_keys]
    parts = [restore] if len(sizes) == 1 else tf.split(restore, sizes)
    for spec, part in zip(table_specs, parts):
      out[fs.restore_key(spec.name)] = like(features[spec.index_key], part)
  return out


def like(ids, flat_restore: tf.Tensor):
  """Restore indices shaped like `ids`: same dense shape, or same ragged rows.

  Args:
    ids: Dense [*ids_shape] or tf.RaggedTensor ids (any dtype; only the shape
      and row partitions are used).
    flat_restore: [num_ids] int32, the ids' positions in row-major order.

  Returns:
    [*ids_shape] int32, or a tf.RaggedTensor with the ids' row partitions.
  """
  if isinstance(ids, tf.RaggedTensor):
    return ids.with_flat_values(tf.reshape(flat_restore, tf.shape(ids.flat_values)))
  return tf.ensure_shape(tf.reshape(flat_restore, tf.shape(ids)), ids.shape)


def _dump(graph, is_training: bool) -> None:
  os.makedirs(DUMP_DIR, exist_ok=True)
  name = f"asc_insert_{'train' if is_training else 'eval'}.pbtxt"
  tf.io.write_graph(graph.as_graph_def(), DUMP_DIR, name, as_text=True)
