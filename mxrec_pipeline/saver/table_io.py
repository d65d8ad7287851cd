"""The Saver's per-kind table I/O: export fetches, delta fetches, restore ops and feeds.

One class per table kind (saver/saver.py picks by the table): `_PlainTableIO`
(rows in a variable, slots found by name), `_TieredTableIO` (rows read and
written through core/tiers.py) and `_ExpansionTableIO` (rows and slots in a
native row store, core/expansion.py). Each builds every op and placeholder at
construction, so the graph can be finalized afterwards.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import expansion
from mxrec_pipeline.saver import sparse_files
from mxrec_pipeline.util import initialize

# Kinds whose sparse parts restore into each other: plain and tiered tables
# both save keys, rows, embeddings and slots by name.
KIND_FAMILY = {"table": "rows", "tiered": "rows", "expansion": "expansion"}


class TableIO:
  """Base of the tables' export and restore ops: `restore_op` restores, fed by `feed`.

  `start_chain_op` (run once a save or restore succeeded) starts the key
  index's change tracking anew; `delta_fetches` are what changed since: the
  export fetches of the changed keys plus the keys eviction removed.
  """

  restore_op: tf.Operation
  start_chain_op: tf.Operation
  delta_fetches: dict

  def select_restore_op(self, sess) -> tf.Operation:
    """The op that restores this table in `sess` (its state decides for plain tables)."""
    del sess
    return self.restore_op


class PlainTableIO(TableIO):
  """Export and restore ops of a table whose rows are a variable."""

  kind = "table"

  def __init__(self, table, slots: list[tuple[str, tf.Variable]]):
    self.table = table
    self.slots = slots  # (slot name "<optimizer>/<slot>", variable)
    keys, rows = table.key_index.export()
    self.export_fetches = {
        "keys": keys, "rows": rows, "embeddings": tf.gather(table.variable, rows),
        "slots": [tf.gather(v, rows) for _, v in slots]
    }
    self.start_chain_op, changes = _change_ops(table)
    self.delta_fetches = {
        "keys": changes["keys"], "rows": changes["rows"],
        "embeddings": tf.gather(table.variable, changes["rows"]),
        "slots": [tf.gather(v, changes["rows"]) for _, v in slots],
        sparse_files.DELETED: changes[sparse_files.DELETED]
    }
    dtype, dim = table.variable.dtype, table.dim
    self.keys = tf.compat.v1.placeholder(tf.int64, [None], name="keys")
    self.rows = tf.compat.v1.placeholder(tf.int64, [None], name="rows")
    self.embeddings = tf.compat.v1.placeholder(dtype, [None, dim], name="embeddings")
    self.slot_values = [tf.compat.v1.placeholder(dtype, [None, dim], name="slot") for _ in slots]
    slot_initializers = [v.initializer for _, v in slots]
    # Re-initializing the rows draws the initializer again: a seeded stateful
    # initializer (tf.compat.v1.truncated_normal_initializer(seed=...)) then
    # gives other values than the session's first draw, the one a fresh run
    # trains from. A table initialized in this session and never used keeps
    # its rows (restore_into_fresh_op), so rows of keys not in the checkpoint
    # hold what an uninterrupted run would give them.
    self.restore_op = self._restore_after([table.variable.initializer] + slot_initializers)
    self.restore_into_fresh_op = self._restore_after(slot_initializers)
    # (tf.identity marks is_variable_initialized's result used: no warning if never run.)
    self._initialized = tf.identity(tf.compat.v1.is_variable_initialized(table.variable))
    self._index_empty = tf.equal(table.key_index.size(), 0)  # Run only once initialized.

  def select_restore_op(self, sess) -> tf.Operation:
    if sess.run(self._initialized) and sess.run(self._index_empty):
      return self.restore_into_fresh_op
    return self.restore_op

  def _restore_after(self, initializers) -> tf.Operation:
    """Imports keys and scatters rows and slots after `initializers` (the index is replaced)."""
    with tf.control_dependencies(initializers):
      updates = [
          self.table.key_index.import_(self.keys, self.rows),
          self.table.variable.scatter_update(tf.IndexedSlices(self.embeddings, self.rows))
      ]
      updates += [
          v.scatter_update(tf.IndexedSlices(values, self.rows))
          for (_, v), values in zip(self.slots, self.slot_values)
      ]
    return tf.group(updates)

  def sparse_ids(self) -> set[int]:
    return {id(self.table.variable)} | {id(v) for _, v in self.slots}

  def handles(self) -> list[tf.Tensor]:
    return [self.table.key_index.resource_handle]

  def to_arrays(self, fetched) -> tuple[dict, dict]:
    order = np.argsort(fetched["keys"], kind="stable")
    arrays = {
        "keys": fetched["keys"][order], "rows": fetched["rows"][order],
        "embeddings": fetched["embeddings"][order]
    }
    for i, values in enumerate(fetched["slots"]):
      arrays[f"slot-{i}"] = values[order]
    _add_deletions(arrays, fetched)
    meta = {
        "kind": self.kind, "dim": self.table.dim, "capacity": self.table.device_vocabulary_size,
        "slots": [name for name, _ in self.slots], "slot_initial_values": None
    }
    return arrays, meta

  def feed(self, arrays: dict, meta: dict, where: str) -> dict:
    rows = arrays["rows"]
    capacity = self.table.device_vocabulary_size
    if len(rows) and rows.max() >= capacity:
      if len(rows) > capacity:
        raise ValueError(f"{where}: {len(rows)} keys of table '{self.table.table_name}', more "
                         f"than its device_vocabulary_size={capacity}")
      rows = np.arange(len(rows), dtype=np.int64)  # Compacted, in key order.
    feed = {self.keys: arrays["keys"], self.rows: rows, self.embeddings: arrays["embeddings"]}
    saved = {name: i for i, name in enumerate(meta["slots"])}
    for (name, _), placeholder in zip(self.slots, self.slot_values):
      if name not in saved:
        raise ValueError(f"{where}: table '{self.table.table_name}' has no saved slot '{name}' "
                         f"(saved: {meta['slots']})")
      feed[placeholder] = arrays[f"slot-{saved[name]}"]
    return feed


class TieredTableIO(TableIO):
  """Export and restore ops of a tiered table (device cache, host and SSD rows).

  Rows are read and written through `table.tiers` (core/tiers.py): `read_rows`
  gives [n, width] float32 rows, the embedding block then one dim-wide block
  per optimizer slot, in the order the slots were attached.
  """

  kind = "tiered"

  def __init__(self, table):
    self.table = table
    tiers = table.tiers
    self.slots = tiered_slots(table)  # (slot name "<optimizer>/<slot>", variable, initial)
    keys, rows = table.key_index.export()
    self.export_fetches = {
        "keys": keys, "rows": rows, "values": tiers.read_rows(table.variable, rows)
    }
    self.start_chain_op, changes = _change_ops(table)
    self.delta_fetches = {  # Global rows training changed, read from whichever tier holds them.
        "keys": changes["keys"], "rows": changes["rows"],
        "values": tiers.read_rows(table.variable, changes["rows"]),
        sparse_files.DELETED: changes[sparse_files.DELETED]
    }
    self.keys = tf.compat.v1.placeholder(tf.int64, [None], name="keys")
    self.rows = tf.compat.v1.placeholder(tf.int64, [None], name="rows")
    self.values = tf.compat.v1.placeholder(tf.float32, [None, tiers.width], name="values")
    # Initializing the rows also empties the key index, the cache and the store.
    initializers = [table.variable.initializer] + [v.initializer for _, v, _ in self.slots]
    with tf.control_dependencies(initializers):
      imported = table.key_index.import_(self.keys, self.rows)
      moved = tiers.import_rows(table.variable, self.rows, self.values)
    self.restore_op = tf.group(imported, moved)

  def sparse_ids(self) -> set[int]:
    return {id(self.table.variable)} | {id(v) for _, v, _ in self.slots}

  def handles(self) -> list[tf.Tensor]:
    # The `<table>/tiers` SaveableObject's op is the cache handle.
    return [self.table.key_index.resource_handle, self.table.tiers.cache_handle]

  def to_arrays(self, fetched) -> tuple[dict, dict]:
    dim = self.table.dim
    arrays = _key_ordered_blocks(fetched, dim)
    config = self.table.tiers.config
    meta = {
        "kind": self.kind, "dim": dim, "capacity": self.table.device_vocabulary_size,
        "host_vocabulary_size": config.host_vocabulary_size,
        "ssd_vocabulary_size": config.ssd_vocabulary_size,
        "slots": [name for name, _, _ in self.slots],
        "slot_initial_values": [initial for _, _, initial in self.slots]
    }
    return arrays, meta

  def feed(self, arrays: dict, meta: dict, where: str) -> dict:
    name = self.table.table_name
    config = self.table.tiers.config
    rows = arrays["rows"]
    total = config.total_rows
    if len(rows) > total:
      raise ValueError(
          f"{where}: {len(rows)} keys of table '{name}', more than its {total} rows "
          f"(device_vocabulary_size={config.device_vocabulary_size} + host_vocabulary_size="
          f"{config.host_vocabulary_size} + ssd_vocabulary_size={config.ssd_vocabulary_size})")
    if len(rows) and rows.max() >= total:
      rows = np.arange(len(rows), dtype=np.int64)  # Compacted, in key order.
    saved = {slot: i for i, slot in enumerate(meta["slots"])}
    blocks = [arrays["embeddings"]]
    for slot, _, _ in self.slots:
      if slot not in saved:
        raise ValueError(f"{where}: table '{name}' has no saved slot '{slot}' "
                         f"(saved: {meta['slots']})")
      blocks.append(arrays[f"slot-{saved[slot]}"])
    values = np.concatenate(blocks, axis=1).astype(np.float32, copy=False)
    return {self.keys: arrays["keys"], self.rows: rows, self.values: values}


class ExpansionTableIO(TableIO):
  """Export and restore ops of a dynamic-expansion table (rows in a row store)."""

  kind = "expansion"

  def __init__(self, table: expansion.ExpansionTable):
    self.table = table
    keys, rows = table.key_index.export()
    values, initial = table.store.read_rows(rows)
    self.export_fetches = {
        "keys": keys, "rows": rows, "values": values, "slot_initial_values": initial,
        "num_slots": table.store.size()[1]
    }
    self.start_chain_op, changes = _change_ops(table)
    changed_values, _ = table.store.read_rows(changes["rows"])
    self.delta_fetches = dict(self.export_fetches, keys=changes["keys"], rows=changes["rows"],
                              values=changed_values,
                              **{sparse_files.DELETED: changes[sparse_files.DELETED]})
    self.keys = tf.compat.v1.placeholder(tf.int64, [None], name="keys")
    self.rows = tf.compat.v1.placeholder(tf.int64, [None], name="rows")
    self.values = tf.compat.v1.placeholder(tf.float32, [None, None], name="values")
    self.initial = tf.compat.v1.placeholder(tf.float32, [None], name="slot_initial_values")
    self.has_slots = tf.compat.v1.placeholder(tf.bool, [], name="has_slots")
    with tf.control_dependencies([table.variable.initializer]):  # Empties index and store.
      imported = table.key_index.import_(self.keys, self.rows)
      laid_out = tf.cond(self.has_slots, lambda: _done_after(table.store.set_slots(self.initial)),
                         lambda: tf.constant(True))
    with tf.control_dependencies([imported, laid_out]):
      grown = table.grow_to_cover(self.rows)
    with tf.control_dependencies([grown]):
      self.restore_op = table.store.write_rows(self.rows, self.values)

  def sparse_ids(self) -> set[int]:
    return {id(self.table.variable)}

  def handles(self) -> list[tf.Tensor]:
    return [self.table.key_index.resource_handle, self.table.store.resource_handle]

  def to_arrays(self, fetched) -> tuple[dict, dict]:
    dim = self.table.dim
    arrays = _key_ordered_blocks(fetched, dim)
    num_slots = fetched["values"].shape[1] // dim - 1
    names = self.table.slot_names
    if names is None or len(names) != num_slots:
      names = [f"slot_{i}" for i in range(num_slots)]
    has_layout = int(fetched["num_slots"]) >= 0
    meta = {
        "kind": self.kind, "dim": dim, "capacity": self.table.device_vocabulary_size,
        "slots": list(names), "slot_initial_values":
            ([float(v) for v in fetched["slot_initial_values"]] if has_layout else None)
    }
    return arrays, meta

  def feed(self, arrays: dict, meta: dict, where: str) -> dict:
    initial = meta["slot_initial_values"]
    if initial is not None and len(initial) != len(meta["slots"]):
      raise ValueError(f"{where}: table '{self.table.table_name}' lists {len(meta['slots'])} "
                       f"slots but {len(initial)} initial values")
    values = np.concatenate([arrays["embeddings"]] +
                            [arrays[f"slot-{i}"] for i in range(len(meta["slots"]))],
                            axis=1).astype(np.float32)
    return {
        self.keys: arrays["keys"], self.rows: arrays["rows"], self.values: values,
        self.initial: np.asarray(initial or [], np.float32), self.has_slots: initial is not None
    }


def _key_ordered_blocks(fetched: dict, dim: int) -> dict:
  """Fetched keys, rows and [n, (1 + slots) * dim] values as key-ordered arrays.

  Returns keys, rows, embeddings ([n, dim]) and slot-<i> ([n, dim]) per slot
  block, all sorted by key (and a delta's deleted keys).
  """
  order = np.argsort(fetched["keys"], kind="stable")
  values = fetched["values"][order]
  arrays = {
      "keys": fetched["keys"][order], "rows": fetched["rows"][order], "embeddings": values[:, :dim]
  }
  for i in range(values.shape[1] // dim - 1):
    arrays[f"slot-{i}"] = values[:, dim * (i + 1):dim * (i + 2)]
  _add_deletions(arrays, fetched)
  return arrays


def _add_deletions(arrays: dict, fetched: dict) -> None:
  """A delta's (delta_fetches') keys eviction removed, sorted, into `arrays`."""
  if sparse_files.DELETED in fetched:
    arrays[sparse_files.DELETED] = np.sort(fetched[sparse_files.DELETED])


def _done_after(op) -> tf.Tensor:
  with tf.control_dependencies([op]):
    return tf.constant(True)


def plain_slots(table, variables, claimed: set[int]) -> list[tuple[str, tf.Variable]]:
  """Slot variables `<table>/<optimizer>/<slot>` shaped like the table's rows.

  Args:
    table: A plain table.
    variables: The graph's global variables.
    claimed: Ids of variables that are no plain table's slots: every table's
      rows and every tiered table's slots (the rows `a/b/embedding` of a table
      named 'a/b' match the pattern of a table named 'a').

  Returns:
    (slot name "<optimizer>/<slot>", variable) pairs.
  """
  prefix = table.table_name + "/"
  slots = []
  for variable in variables:
    name = variable.op.name
    if id(variable) in claimed or not name.startswith(prefix):
      continue
    parts = name[len(prefix):].split("/")
    if len(parts) == 2 and variable.shape == table.variable.shape:
      slots.append(("/".join(parts), variable))
  return slots


def tiered_slots(table) -> list[tuple[str, tf.Variable, float]]:
  """A tiered table's slots in its stored rows' order: ("<optimizer>/<slot>", variable, initial).

  The tiers attach each optimizer's slots (create_table's optimizer_list) in
  the order of its slot_initial_values (core/tiers.py `_add_slots`).
  """
  tiers = table.tiers
  names = [
      f"{optimizer.optimizer_name}/{slot}" for optimizer in tiers._optimizers  # pylint: disable=protected-access
      for slot in optimizer.slot_initial_values
  ]
  variables = tiers._slot_variables  # pylint: disable=protected-access
  if len(names) != len(variables):  # Only if core/tiers.py changed its bookkeeping.
    names = [v.op.name[len(table.table_name) + 1:] for v, _ in variables]
  return [(name, variable, float(initial)) for name, (variable, initial) in zip(names, variables)]


def _change_ops(table) -> tuple[tf.Operation, dict[str, tf.Tensor]]:
  """(the op that starts a delta chain, the table's changes since) for a Saver's graph.

  The changes are a peek: the Saver clears them (the start op again) once a
  delta save succeeded. `init(recent_key_count_threshold=N)` leaves the keys
  touched fewer than N times since the previous save out of the changes
  (core/key_index.KeyIndex.export_changes' min_count).
  """
  threshold = initialize.get_config_initializer().config.recent_key_count_threshold
  start = tf.group(*table.key_index.export_changes(clear=True, min_count=threshold).values())
  return start, table.key_index.export_changes(clear=False, min_count=threshold)
