"""FeatureSpec, as in mx_rec.core.asc.feature_spec.

A FeatureSpec names an id feature of the input batches and the table its ids go
to. Several specs may share one table: their ids are deduplicated together.
"""

from __future__ import annotations

# Keys that the insert function adds to a batch dict. They are part of the
# contract between get_asc_insert_func (producer) and sparse_lookup (consumer).
_PREFIX = "mxrec__"


def unique_rows_key(table_name: str) -> str:
  """Batch key of a table's unique rows: [num_unique] int64."""
  return f"{_PREFIX}{table_name}__unique_rows"


def plan_key(table_name: str) -> str:
  """Batch key of a tiered table's plan token: [1] int64 (0 when not training)."""
  return f"{_PREFIX}{table_name}__plan"


def restore_key(feature_name: str) -> str:
  """Batch key of a feature's restore indices: ids' shape, int32."""
  return f"{_PREFIX}{feature_name}__restore"


def is_insertion_key(key: str) -> bool:
  """Whether a batch key was added by the insert function."""
  return key.startswith(_PREFIX)


class FeatureSpec:
  """An id feature of the batches and the table it is looked up in.

  Mirrors mx_rec.core.asc.feature_spec.FeatureSpec.

  Args:
    name: Feature name, unique among the specs of one insert function.
    table_name: The table the ids go to; defaults to `name`.
    index_key: Key of the ids in the batch dict; defaults to `name`.
    access_threshold: Feature admission: sightings a key of the table needs
      before it gets a row (None: admitted at once); see core/admission.py.
    eviction_threshold: Seconds, on the batches' timestamps, a key of the
      table may stay unseen before EvictHook removes it (None: never). Needs
      a FeatureSpec with `is_timestamp=True` in the same insert function.
    is_timestamp: This spec names the batch's timestamps (int, seconds; the
      batch's largest is its time), not ids of a table.
    faae_coefficient: What one occurrence of this feature's ids adds to their
      admission counts, an int >= 1.
    batch_size: Informational (mxRec uses it for static shapes); ignored here
      since batch shapes are dynamic.
    feat_count: Ids per sample (mxRec's static last dimension); when given,
      insertion checks the ids' last dimension against it.

  Raises:
    ValueError: empty `name`, or a bad threshold or coefficient (named).
  """

  def __init__(self, name: str, table_name: str | None = None, index_key: str | None = None,
               access_threshold: int | None = None, eviction_threshold: int | None = None,
               is_timestamp: bool | None = None, batch_size: int | None = None,
               faae_coefficient: int = 1, feat_count: int | None = None):
    if not isinstance(name, str) or not name:
      raise ValueError(f"FeatureSpec `name` must be a non-empty string, got {name!r}")
    for arg, value, low in (("access_threshold", access_threshold, 0),
                            ("eviction_threshold", eviction_threshold, 0), ("faae_coefficient",
                                                                            faae_coefficient, 1)):
      if value is not None and (isinstance(value, bool) or not isinstance(value, int) or
                                value < low):
        raise ValueError(f"FeatureSpec '{name}': `{arg}` must be None or an int >= {low}, "
                         f"got {value!r}")
    self.access_threshold = access_threshold
    self.eviction_threshold = eviction_threshold
    self.is_timestamp = bool(is_timestamp)
    self.faae_coefficient = 1 if faae_coefficient is None else faae_coefficient
    self.name = name
    self.table_name = table_name or name
    self.index_key = index_key or name
    self.batch_size = batch_size
    if feat_count is not None and (isinstance(feat_count, bool) or
                                   not isinstance(feat_count, int) or feat_count <= 0):
      raise ValueError(f"FeatureSpec '{name}': `feat_count` must be a positive int, "
                       f"got {feat_count!r}")
    self.feat_count = feat_count

  def __repr__(self):
    return (f"FeatureSpec(name={self.name!r}, table_name={self.table_name!r}, "
            f"index_key={self.index_key!r})")
