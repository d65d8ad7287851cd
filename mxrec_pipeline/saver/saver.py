"""Saver, as mx_rec.saver.saver.Saver: dense checkpoint plus a per-key sparse part.

`Saver` is a tf.compat.v1.train.Saver for TF1 graphs and sessions (also in an
Estimator's Scaffold). `save(sess, "./saved-model/model-0", global_step=i)`
writes the dense checkpoint of every variable but the tables' rows and
optimizer slots and, beside it, `./saved-model/sparse-model-0-<i>/` with each
table's keys, rows, embeddings and slots (`.npy` files and `meta.json`), so
mxRec's quick start and its restore-if-present test work as they are. The
sparse part is written first and renamed into place, so a crash at any point
leaves the previous checkpoint whole. Files go through tf.io.gfile, so any
TF filesystem works (`gs://`, `ram://`). `restore` imports each table's keys at
their saved rows, so later keys get the rows the saving run would have given.

Plain, tiered (core/tiers.py: rows read wherever they live) and
dynamic-expansion (core/expansion.py) tables are saved; plain and tiered
checkpoints restore into each other. Main names: `Saver`, `sparse_dir`.
See docs/migrating-from-mxrec.md#sparse-checkpoint-files for the files and
the restore rules.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import expansion
from mxrec_pipeline.util import atomic_dir
from mxrec_pipeline.util import initialize
from mxrec_pipeline.util import model_files

SPARSE_PREFIX = "sparse-"
META_FILE = "meta.json"
FORMAT_VERSION = 1
# Kinds whose sparse parts restore into each other: plain and tiered tables
# both save keys, rows, embeddings and slots by name.
_KIND_FAMILY = {"table": "rows", "tiered": "rows", "expansion": "expansion"}


def sparse_dir(checkpoint_path: str) -> str:
  """The sparse part of a dense checkpoint path: `<dir>/sparse-<basename>`."""
  head, tail = os.path.split(checkpoint_path)
  return os.path.join(head, SPARSE_PREFIX + tail)


def _table_dir(table_name: str) -> str:
  # Table names may hold '/' and be '.': quoted, behind a prefix.
  return "table-" + urllib.parse.quote(table_name, safe="")


class _TableIO:
  """Base of the tables' export and restore ops: `restore_op` restores, fed by `feed`."""

  restore_op: tf.Operation

  def select_restore_op(self, sess) -> tf.Operation:
    """The op that restores this table in `sess` (its state decides for plain tables)."""
    del sess
    return self.restore_op


class _PlainTableIO(_TableIO):
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


class _TieredTableIO(_TableIO):
  """Export and restore ops of a tiered table (device cache, host and SSD rows).

  Rows are read and written through `table.tiers` (core/tiers.py): `read_rows`
  gives [n, width] float32 rows, the embedding block then one dim-wide block
  per optimizer slot, in the order the slots were attached.
  """

  kind = "tiered"

  def __init__(self, table):
    self.table = table
    tiers = table.tiers
    self.slots = _tiered_slots(table)  # (slot name "<optimizer>/<slot>", variable, initial)
    keys, rows = table.key_index.export()
    self.export_fetches = {
        "keys": keys, "rows": rows, "values": tiers.read_rows(table.variable, rows)
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


class _ExpansionTableIO(_TableIO):
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
  block, all sorted by key.
  """
  order = np.argsort(fetched["keys"], kind="stable")
  values = fetched["values"][order]
  arrays = {
      "keys": fetched["keys"][order], "rows": fetched["rows"][order], "embeddings": values[:, :dim]
  }
  for i in range(values.shape[1] // dim - 1):
    arrays[f"slot-{i}"] = values[:, dim * (i + 1):dim * (i + 2)]
  return arrays


def _done_after(op) -> tf.Tensor:
  with tf.control_dependencies([op]):
    return tf.constant(True)


def _plain_slots(table, variables, claimed: set[int]) -> list[tuple[str, tf.Variable]]:
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


def _tiered_slots(table) -> list[tuple[str, tf.Variable, float]]:
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


class Saver(tf.compat.v1.train.Saver):
  """tf.compat.v1.train.Saver that writes the tables' sparse part beside the dense one.

  Files, crash safety and restore: docs/migrating-from-mxrec.md#sparse-checkpoint-files.
  Build it in the graph of the tables, after the training op: plain tables'
  slots are found by their names, `<table>/<optimizer>/<slot>`. Every op and
  placeholder is built here, so the graph can be finalized afterwards (as
  Estimators and MonitoredSession do).

  Args:
    var_list: As tf.compat.v1.train.Saver's (None: all saveable objects); table
      rows, their slots and the tables' key indexes (and row stores, and tiered
      tables' `<table>/tiers`) are taken out of it and go to the sparse part.
    warm_start_tables: None, or names of this graph's tables (mxRec's
      argument): `restore` then warm-starts, taking only these tables' keys,
      rows and slots from the checkpoint (see `restore`).
    **kwargs: tf.compat.v1.train.Saver's other arguments (max_to_keep,
      sharded, ...). Old sparse parts are deleted with their dense checkpoints.

  Raises:
    RuntimeError: executing eagerly (use tf.train.Checkpoint), or init() was
      not called.
    ValueError: `warm_start_tables` is not a list of this graph's table names
      (the unknown ones and the graph's tables named).
  """

  def __init__(self, var_list=None, warm_start_tables=None, **kwargs):
    if tf.executing_eagerly():
      raise RuntimeError("mxrec_pipeline Saver works on tf.compat.v1 graphs; eagerly, "
                         "checkpoint tables with tf.train.Checkpoint")
    run = initialize.get_config_initializer()
    graph = tf.compat.v1.get_default_graph()
    variables = tf.compat.v1.global_variables()
    tables = [t for t in run.tables.values() if getattr(t.variable, "graph", None) is graph]
    claimed = {id(t.variable) for t in tables
              } | {id(v) for t in tables if t.is_tiered for _, v, _ in _tiered_slots(t)}
    with tf.name_scope("sparse_saver"):
      self._tables = []
      for table in tables:
        with tf.name_scope(table.table_name.replace("/", "_")):
          if isinstance(table, expansion.ExpansionTable):
            self._tables.append(_ExpansionTableIO(table))
          elif table.is_tiered:
            self._tables.append(_TieredTableIO(table))
          else:
            self._tables.append(_PlainTableIO(table, _plain_slots(table, variables, claimed)))
    self._warm_start_tables = self._checked_names(warm_start_tables)
    sparse_ids = set().union(*(io.sparse_ids() for io in self._tables))
    handles = {id(h) for io in self._tables for h in io.handles()}

    def is_dense(item) -> bool:
      if isinstance(item, tf.Variable):
        return id(item) not in sparse_ids
      return id(getattr(item, "op", None)) not in handles  # A SaveableObject.

    if var_list is None:
      var_list = variables + tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
    if isinstance(var_list, dict):
      var_list = {name: v for name, v in var_list.items() if is_dense(v)}
    else:
      var_list = [v for v in var_list if is_dense(v)]
    if not var_list:
      kwargs.setdefault("allow_empty", True)
    super().__init__(var_list, **kwargs)

  def save(self, sess, save_path, global_step=None, latest_filename=None, meta_graph_suffix="meta",
           write_meta_graph=True, write_state=True, strip_default_attrs=False,
           save_debug_info=False):
    """Writes the sparse part, then the dense checkpoint; see tf.compat.v1.train.Saver.

    Returns:
      The dense checkpoint's path (as tf.compat.v1.train.Saver.save); its
      sparse part is `sparse_dir(path)`.
    """
    if global_step is not None and not isinstance(global_step, (int, np.integer)):
      global_step = tf.compat.v1.train.global_step(sess, global_step)
    checkpoint_file = save_path
    if global_step is not None:
      step = f"{int(global_step):08d}" if self._pad_step_number else str(int(global_step))
      checkpoint_file = f"{save_path}-{step}"
    directory = sparse_dir(checkpoint_file)
    if self._tables:
      self._write_sparse(sess, directory)
    before = set(self.last_checkpoints)
    try:
      path = super().save(sess, save_path, global_step=global_step, latest_filename=latest_filename,
                          meta_graph_suffix=meta_graph_suffix, write_meta_graph=write_meta_graph,
                          write_state=write_state, strip_default_attrs=strip_default_attrs,
                          save_debug_info=save_debug_info)
    except BaseException:
      with contextlib.suppress(tf.errors.OpError):
        model_files.remove(directory)
      raise
    for old in before - set(self.last_checkpoints):
      if not tf.io.gfile.exists(old + ".index"):  # Deleted, not kept by the hours rule.
        with contextlib.suppress(tf.errors.OpError):  # Best effort, as TF's own pruning.
          model_files.remove(sparse_dir(old))
    return path

  def restore(self, sess, save_path, warm_start_tables=None):
    """Restores the dense part, then every table's keys, rows and slots; or warm-starts.

    With `warm_start_tables` (here or in the constructor; mxRec's argument),
    only the named tables are restored: their keys, rows and optimizer slots
    (the checkpoint must hold this graph's slots of them: the same sparse
    optimizer). The dense part and the other tables keep their values:
    initialize the session first (a new model: a table or feature added, the
    dense model changed). Prints one line per table of this graph saying
    what it took or that it kept its initial values.

    Raises:
      FileNotFoundError: the sparse part, or a file of it, is missing (named).
      ValueError: the sparse part is corrupt, lacks a table or slot of this
        graph (a warm start: of the named tables), holds a table of another
        dim or kind, or more keys than a table of this graph has rows (table
        and path named); nothing was restored then. A warm-start name that
        is not a table of this graph.
      Errors of tf.compat.v1.train.Saver.restore for the dense part.
    """
    names = (self._checked_names(warm_start_tables)
             if warm_start_tables is not None else self._warm_start_tables)
    if names is not None:
      self._warm_start(sess, save_path, names)
      return
    feeds = {}
    if self._tables and tf.io.gfile.exists(f"{save_path}.index"):
      # Checked before anything changes; a missing dense part is the dense restore's error.
      feeds = self._read_sparse(sparse_dir(save_path))
    super().restore(sess, save_path)
    if self._tables:
      sess.run([io.select_restore_op(sess) for io in self._tables], feeds)

  def _checked_names(self, names) -> tuple[str, ...] | None:
    if names is None:
      return None
    known = [io.table.table_name for io in self._tables]
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
      raise ValueError(f"warm_start_tables must be a list of table names, got {names!r}")
    unknown = [n for n in names if n not in known]
    if unknown:
      raise ValueError(f"warm_start_tables {unknown} are not tables of this graph "
                       f"(its tables: {known})")
    return tuple(dict.fromkeys(names))

  def _warm_start(self, sess, save_path: str, names: tuple[str, ...]) -> None:
    """Restores the tables `names` from `save_path`'s sparse part; nothing else."""
    directory = sparse_dir(save_path)
    chosen = [io for io in self._tables if io.table.table_name in names]
    feeds = self._read_sparse(directory, chosen)  # Every check before anything changes.
    sess.run([io.select_restore_op(sess) for io in chosen], feeds)
    for io in self._tables:
      name = io.table.table_name
      if io in chosen:
        print(
            f"warm start: table '{name}' from {directory}: {len(feeds[io.keys])} keys with "
            "their rows and optimizer slots", flush=True)
      else:
        print(f"warm start: table '{name}' keeps its initial values (not in warm_start_tables)",
              flush=True)

  def _write_sparse(self, sess, directory: str) -> None:
    fetched = sess.run([io.export_fetches for io in self._tables])

    def write(temporary: str) -> None:
      meta = {"format": FORMAT_VERSION, "tables": {}}
      for io, values in zip(self._tables, fetched):
        arrays, table_meta = io.to_arrays(values)
        table_dir = os.path.join(temporary, _table_dir(io.table.table_name))
        tf.io.gfile.makedirs(table_dir)
        for name, array in arrays.items():
          with tf.io.gfile.GFile(os.path.join(table_dir, f"{name}.npy"), "wb") as f:
            np.save(f, array, allow_pickle=False)
        meta["tables"][io.table.table_name] = table_meta
      with tf.io.gfile.GFile(os.path.join(temporary, META_FILE), "w") as f:
        f.write(json.dumps(meta, indent=1))

    # A re-save of this step (or the orphan of a crash) is replaced whole.
    atomic_dir.write_dir_atomically(directory, write)

  def _read_sparse(self, directory: str, ios=None) -> dict:
    meta_path = os.path.join(directory, META_FILE)
    if not tf.io.gfile.isdir(directory):
      raise FileNotFoundError(f"sparse checkpoint '{directory}' does not exist; it is written "
                              "beside the dense checkpoint by mxrec_pipeline Saver.save()")
    if not tf.io.gfile.exists(meta_path):
      raise FileNotFoundError(f"sparse checkpoint '{directory}' has no {META_FILE}")
    try:
      meta = json.loads(model_files.read_text(meta_path))
      tables = meta["tables"]
      if meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT_VERSION}")
    except (ValueError, KeyError, TypeError, tf.errors.OpError) as e:
      raise ValueError(f"sparse checkpoint '{meta_path}' is corrupt: {e}") from e
    feeds = {}
    for io in self._tables if ios is None else ios:
      name = io.table.table_name
      where = f"sparse checkpoint '{directory}'"
      if name not in tables:
        raise ValueError(f"{where} has no table '{name}' (it has {sorted(tables)})")
      table_meta = tables[name]
      if (_KIND_FAMILY.get(table_meta.get("kind")) != _KIND_FAMILY[io.kind] or
          table_meta.get("dim") != io.table.dim):
        raise ValueError(f"{where}: table '{name}' was saved as a {table_meta.get('kind')} "
                         f"of dim {table_meta.get('dim')}, this graph has a {io.kind} of dim "
                         f"{io.table.dim}")
      arrays = _load_table(os.path.join(directory, _table_dir(name)), table_meta, name)
      feeds.update(io.feed(arrays, table_meta, where))
    return feeds


def _load_table(table_dir: str, meta: dict, name: str) -> dict:
  """The arrays of one table, checked for dtype and shape consistency."""
  files = ["keys", "rows", "embeddings"] + [f"slot-{i}" for i in range(len(meta["slots"]))]
  arrays = {}
  for file in files:
    path = os.path.join(table_dir, f"{file}.npy")
    if not tf.io.gfile.exists(path):
      raise FileNotFoundError(f"sparse checkpoint file '{path}' of table '{name}' is missing")
    try:
      with tf.io.gfile.GFile(path, "rb") as f:
        arrays[file] = np.load(f, allow_pickle=False)
    except (ValueError, OSError, EOFError, tf.errors.OpError) as e:
      raise ValueError(f"sparse checkpoint file '{path}' of table '{name}' is corrupt: "
                       f"{e}") from e
  n = arrays["keys"].shape[0] if arrays["keys"].ndim == 1 else -1
  for file, array in arrays.items():
    integer = file in ("keys", "rows")
    shape_ok = array.shape == ((n,) if integer else (n, meta["dim"]))
    dtype_ok = array.dtype == np.int64 if integer else array.dtype.kind == "f"
    if n < 0 or not shape_ok or not dtype_ok:
      raise ValueError(
          f"sparse checkpoint file '{os.path.join(table_dir, file + '.npy')}' of table '{name}' "
          f"is corrupt: {array.dtype} array of shape {array.shape}, expected "
          f"{'int64 [n]' if integer else 'float [n, ' + str(meta['dim']) + ']'} with n = "
          f"{n} keys")
  return arrays
