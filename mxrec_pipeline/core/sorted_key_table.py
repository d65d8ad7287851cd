"""A stock-TF key -> value table whose keys live in variables, for SavedModels of any size.

`SortedKeyTable` holds its keys in increasing order in an int64 tf.Variable
(and its values, unless they are the positions 0..n-1, in another) and looks
keys up by binary search (`tf.searchsorted`, TF's LowerBound op). Saved in a
SavedModel, its contents go to the variables' checkpoint, not to the graph:
`saved_model.pb` stays the same size whatever the number of keys, where a
`tf.lookup.StaticHashTable` built from a `KeyValueTensorInitializer` stores
every key and value as graph constants (the 2 GB protobuf limit then caps an
export near 10^8 keys). Loading needs plain TensorFlow only (no custom op),
as TF Serving does; memory is 8 bytes per key (16 with explicit values).
Its variables belong to the process that builds it, even inside a
tf.distribute scope (util/local_variable.py).
Lookup costs O(log n) per id against the hash table's O(1).

Mirrors the lookup interface of `tf.lookup.StaticHashTable`
(`lookup(keys)`, `size()`, `default_value`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from mxrec_pipeline.util import local_variable


class SortedKeyTable(tf.Module):
  """int64 key -> int64 value by binary search over sorted keys held in a variable.

  Args:
    keys: [n] int64 keys in strictly increasing order (NumPy or eager tensor).
    values: None (a key's value is its position in `keys`, 0..n-1), or [n]
      int64 values.
    default_value: Value of absent keys, int.
    name: Name of the table, used for its variables and in errors.

  Raises:
    ValueError: `keys` not 1-D, not strictly increasing (a duplicate or an
      unsorted key, naming the first), or `values` of another length.
  """

  def __init__(self, keys, values=None, default_value: int = -1, name: str = "sorted_keys"):
    super().__init__(name=name)
    keys = np.asarray(keys, np.int64)
    if keys.ndim != 1:
      raise ValueError(f"SortedKeyTable '{name}': keys must be 1-D, got shape {keys.shape}")
    bad = np.flatnonzero(keys[1:] <= keys[:-1])
    if bad.size:
      i = int(bad[0])
      raise ValueError(f"SortedKeyTable '{name}': keys must be strictly increasing; key {i + 1} "
                       f"({keys[i + 1]}) follows {keys[i]}")
    self.num_keys = int(keys.size)
    self.default_value = int(default_value)
    self.keys = local_variable.local_variable(keys, f"{name}_keys")
    self.values = None
    if values is not None:
      values = np.asarray(values, np.int64)
      if values.shape != keys.shape:
        raise ValueError(f"SortedKeyTable '{name}': {values.shape[0] if values.ndim else 0} "
                         f"values for {keys.size} keys")
      self.values = local_variable.local_variable(values, f"{name}_values")

  def size(self) -> tf.Tensor:
    """Number of keys, int64 scalar."""
    return tf.constant(self.num_keys, tf.int64)

  def lookup(self, keys: tf.Tensor) -> tf.Tensor:
    """Values of int64 `keys` (any shape; same shape out, int64); absent: default_value."""
    keys = tf.convert_to_tensor(keys, tf.int64)
    if self.num_keys == 0:
      return tf.fill(tf.shape(keys), tf.constant(self.default_value, tf.int64))
    flat = tf.reshape(keys, [-1])
    position = tf.searchsorted(self.keys, flat, side="left", out_type=tf.int64)
    clipped = tf.minimum(position, self.num_keys - 1)
    found = tf.equal(tf.gather(self.keys, clipped), flat)
    value = clipped if self.values is None else tf.gather(self.values, clipped)
    return tf.reshape(tf.where(found, value, self.default_value), tf.shape(keys))
