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
dynamic-expansion (core/expansion.py) tables are saved (per kind:
saver/table_io.py); plain and tiered checkpoints restore into each other.
With `init(is_incremental_checkpoint=True)`, `save(..., save_delta=True)`
writes a delta of every kind of table (saver/sparse_files.py: files and
chains).
Main names: `Saver`, `sparse_dir`, `delta_dir`. See
docs/migrating-from-mxrec.md#sparse-checkpoint-files for the files and the
restore rules.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import tensorflow as tf

from mxrec_pipeline.core import expansion
from mxrec_pipeline.saver import sparse_files
from mxrec_pipeline.saver import table_io
from mxrec_pipeline.saver.sparse_files import delta_dir, sparse_dir  # noqa: F401 (public names)
from mxrec_pipeline.util import atomic_dir
from mxrec_pipeline.util import initialize
from mxrec_pipeline.util import model_files


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
              } | {id(v) for t in tables if t.is_tiered for _, v, _ in table_io.tiered_slots(t)}
    with tf.name_scope("sparse_saver"):
      self._tables = []
      for table in tables:
        with tf.name_scope(table.table_name.replace("/", "_")):
          if isinstance(table, expansion.ExpansionTable):
            self._tables.append(table_io.ExpansionTableIO(table))
          elif table.is_tiered:
            self._tables.append(table_io.TieredTableIO(table))
          else:
            self._tables.append(
                table_io.PlainTableIO(table, table_io.plain_slots(table, variables, claimed)))
    self._warm_start_tables = self._checked_names(warm_start_tables)
    # The sparse parts (names) of the chain the last full or delta save or restore made, which a
    # delta builds on; [] before any.
    self._chain: list[str] = []
    # Sparse parts of pruned dense checkpoints that a kept delta still builds on.
    self._held: set[str] = set()
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
           save_debug_info=False, save_delta=False):
    """Writes the sparse part, then the dense checkpoint; see tf.compat.v1.train.Saver.

    Args:
      save_delta: mxRec's argument. False: a full sparse part,
        `sparse_dir(path)`, which with `init(is_incremental_checkpoint=True)`
        starts a chain of deltas. True: a delta, `delta_dir(path)`, holding
        per table only the keys whose rows or slots changed since the
        chain's previous save or restore (with their rows, embeddings and
        slots) and the keys eviction removed (saver/sparse_files.py). The
        dense checkpoint is always whole.
      Others: as tf.compat.v1.train.Saver.save's.

    Returns:
      The dense checkpoint's path (as tf.compat.v1.train.Saver.save).

    Raises:
      ValueError: `save_delta` without `init(is_incremental_checkpoint=True)`,
        or before any full save or restore of this Saver: nothing is written
        then.
    """
    if global_step is not None and not isinstance(global_step, (int, np.integer)):
      global_step = tf.compat.v1.train.global_step(sess, global_step)
    if save_delta:
      self._check_delta()
    checkpoint_file = save_path
    if global_step is not None:
      step = f"{int(global_step):08d}" if self._pad_step_number else str(int(global_step))
      checkpoint_file = f"{save_path}-{step}"
    directory = (delta_dir if save_delta else sparse_dir)(checkpoint_file)
    stale = (sparse_dir if save_delta else delta_dir)(checkpoint_file)  # A re-save of this step.
    if self._tables:
      if tf.io.gfile.isdir(stale):
        model_files.remove(stale)
      self._write_sparse(sess, directory, save_delta)
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
    if self._tables:
      name = os.path.basename(directory)
      self._start_chain(sess, self._chain + [name] if save_delta else [name])
    pruned = [
        part for old in before - set(self.last_checkpoints)
        if not tf.io.gfile.exists(old + ".index")  # Deleted, not kept by the hours rule.
        for part in (sparse_dir(old), delta_dir(old))
    ]
    needed = sparse_files.referenced_dirs(self.last_checkpoints)
    for part in pruned + sorted(self._held):
      if part in needed:  # A full part (or delta) a kept delta builds on stays while it does.
        self._held.add(part)
        continue
      self._held.discard(part)
      with contextlib.suppress(tf.errors.OpError):  # Best effort, as TF's own pruning.
        model_files.remove(part)
    return path

  def _check_delta(self) -> None:
    if not initialize.get_config_initializer().config.is_incremental_checkpoint:
      raise ValueError("save_delta=True needs init(is_incremental_checkpoint=True)")
    if self._tables and not self._chain:
      raise ValueError("save_delta=True needs a full save (save_delta=False) or a restore by "
                       "this Saver before it: a delta holds what changed since one")

  def restore(self, sess, save_path, warm_start_tables=None):
    """Restores the dense part, then every table's keys, rows and slots; or warm-starts.

    `save_path` is a checkpoint path (as `save` returned it) or a directory:
    then its newest checkpoint, or with `init(restore_model_version=STEP)`
    the one of that step (mxRec's argument). A delta checkpoint restores its
    chain: the full sparse part, then each delta in order.

    With `warm_start_tables` (here or in the constructor; mxRec's argument),
    only the named tables are restored: their keys, rows and optimizer slots
    (the checkpoint must hold this graph's slots of them: the same sparse
    optimizer). The dense part and the other tables keep their values:
    initialize the session first (a new model: a table or feature added, the
    dense model changed). Prints one line per table of this graph saying
    what it took or that it kept its initial values.

    Raises:
      FileNotFoundError: the sparse part, a part of its chain, or a file of
        it, is missing (named); a directory without the chosen checkpoint.
      ValueError: the sparse part is corrupt, lacks a table or slot of this
        graph (a warm start: of the named tables), holds a table of another
        dim or kind, or more keys than a table of this graph has rows (table
        and path named); nothing was restored then. A warm-start name that
        is not a table of this graph.
      Errors of tf.compat.v1.train.Saver.restore for the dense part.
    """
    save_path = self._version_path(save_path)
    names = (self._checked_names(warm_start_tables)
             if warm_start_tables is not None else self._warm_start_tables)
    if names is not None:
      self._warm_start(sess, save_path, names)
      return
    feeds, parts = {}, []
    if self._tables and tf.io.gfile.exists(f"{save_path}.index"):
      # Checked before anything changes; a missing dense part is the dense restore's error.
      parts = sparse_files.version(save_path)
      feeds = self._read_sparse(parts)
    super().restore(sess, save_path)
    if self._tables:
      sess.run([io.select_restore_op(sess) for io in self._tables], feeds)
      self._start_chain(sess, [os.path.basename(d) for d, _ in parts])

  def _version_path(self, save_path: str) -> str:
    """`save_path`, or for a directory its checkpoint of restore_model_version (or newest)."""
    if tf.io.gfile.exists(f"{save_path}.index") or not tf.io.gfile.isdir(save_path):
      return save_path
    state = tf.train.get_checkpoint_state(save_path)
    paths = list(state.all_model_checkpoint_paths) if state else []
    version = initialize.get_config_initializer().config.restore_model_version
    if version is None:
      if not paths:
        raise FileNotFoundError(f"no checkpoint in directory '{save_path}'")
      return state.model_checkpoint_path
    chosen = [p for p in paths if p.rsplit("-", 1)[-1].lstrip("0") == str(version).lstrip("0")]
    if not chosen:
      steps = [p.rsplit("-", 1)[-1] for p in paths]
      raise FileNotFoundError(f"restore_model_version={version}: directory '{save_path}' has no "
                              f"checkpoint of that step (it has steps {steps})")
    return chosen[-1]

  def _start_chain(self, sess, chain: list[str]) -> None:
    """After a save or restore: deltas build on `chain` (its sparse parts), if incremental.

    Change tracking starts anew only here, once the save succeeded: a failed
    save leaves the changes for the next one.
    """
    if not initialize.get_config_initializer().config.is_incremental_checkpoint:
      return
    sess.run([io.start_chain_op for io in self._tables])
    self._chain = chain

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
    parts = sparse_files.version(save_path)
    chosen = [io for io in self._tables if io.table.table_name in names]
    feeds = self._read_sparse(parts, chosen)  # Every check before anything changes.
    sess.run([io.select_restore_op(sess) for io in chosen], feeds)
    for io in self._tables:
      name = io.table.table_name
      if io in chosen:
        print(
            f"warm start: table '{name}' from {parts[-1][0]}: {len(feeds[io.keys])} keys with "
            "their rows and optimizer slots", flush=True)
      else:
        print(f"warm start: table '{name}' keeps its initial values (not in warm_start_tables)",
              flush=True)

  def _write_sparse(self, sess, directory: str, delta: bool) -> None:
    fetched = sess.run([io.delta_fetches if delta else io.export_fetches for io in self._tables])

    def write(temporary: str) -> None:
      meta = {"format": sparse_files.FORMAT_VERSION, "tables": {}}
      if delta:  # The version's index: the parts it is made of, oldest first.
        meta["chain"] = self._chain + [os.path.basename(directory)]
      for io, values in zip(self._tables, fetched):
        arrays, table_meta = io.to_arrays(values)
        table_dir = os.path.join(temporary, sparse_files.table_dir(io.table.table_name))
        tf.io.gfile.makedirs(table_dir)
        for name, array in arrays.items():
          with tf.io.gfile.GFile(os.path.join(table_dir, f"{name}.npy"), "wb") as f:
            np.save(f, array, allow_pickle=False)
        meta["tables"][io.table.table_name] = table_meta
      with tf.io.gfile.GFile(os.path.join(temporary, sparse_files.META_FILE), "w") as f:
        f.write(json.dumps(meta, indent=1))

    # A re-save of this step (or the orphan of a crash) is replaced whole; meta.json, written
    # last inside, and the rename mark it complete.
    atomic_dir.write_dir_atomically(directory, write)

  def _read_sparse(self, parts: list[tuple[str, dict]], ios=None) -> dict:
    """The restore feeds of `ios` (default every table) from a version's sparse parts."""
    feeds = {}
    where = f"sparse checkpoint '{parts[-1][0]}'"
    for io in self._tables if ios is None else ios:
      name = io.table.table_name
      arrays, table_meta = sparse_files.load_version(parts, name)
      if (table_io.KIND_FAMILY.get(table_meta.get("kind")) != table_io.KIND_FAMILY[io.kind] or
          table_meta.get("dim") != io.table.dim):
        raise ValueError(f"{where}: table '{name}' was saved as a {table_meta.get('kind')} "
                         f"of dim {table_meta.get('dim')}, this graph has a {io.kind} of dim "
                         f"{io.table.dim}")
      feeds.update(io.feed(arrays, table_meta, where))
    return feeds
