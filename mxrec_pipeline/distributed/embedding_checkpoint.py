"""By-key and delta checkpoints of a TPUEmbedding-style Embedding's tables.

`tf.train.Checkpoint(embedding=...)` saves every table whole, at its
capacity. For long runs, save the tables here instead, by key (the shard
bundles of distributed/checkpoint.py: keys, rows, slots, step counts): a
full save starts a chain, and `save_delta` writes only what changed since the
chain's previous save (distributed/delta.py); `restore_tables` restores a
full save and its deltas, in order, bit for bit. Checkpoint the model, the
dense optimizer and the step with tf.train.Checkpoint, without the embedding.

  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
  embedding_checkpoint.save_tables(embedding, "ckpt/tables-1000")       # full
  embedding_checkpoint.save_delta(embedding, "ckpt/tables-1100")        # ~1 % of the bytes
  embedding_checkpoint.restore_tables(embedding, "ckpt/tables-1000", ["ckpt/tables-1100"])

One process, no strategy or one replica (a MirroredStrategy of several
replicas is refused: its mirrored rows are checkpointed with tf.train.Checkpoint).
"""

from __future__ import annotations

from typing import Sequence

from mxrec_pipeline.distributed import checkpoint
from mxrec_pipeline.distributed import delta


def _tables(embedding) -> dict[str, tuple[object, list]]:
  if embedding.num_replicas > 1:
    raise ValueError(f"embedding checkpoints by key: the Embedding runs {embedding.num_replicas} "
                     "replicas; checkpoint mirrored tables with tf.train.Checkpoint(embedding=...)")
  return embedding.sparse_tables()


def save_tables(embedding, directory: str) -> list[str]:
  """Saves every table in full, by key, as `<directory>/<table>/shard-0-of-1`; starts a chain.

  Returns:
    The bundles' prefixes, in table order.

  Raises:
    ValueError: an Embedding of several replicas.
  """
  return [
      prefix for table, optimizers in _tables(embedding).values()
      for prefix in checkpoint.save_table(directory, table, optimizers, start_chain=True)
  ]


def save_delta(embedding, directory: str) -> list[str]:
  """Saves, per table, what changed since the chain's previous save or restore (delta.save_delta).

  Before any full save or restore a delta holds every key: still correct.

  Returns:
    The bundles' prefixes, in table order.
  """
  return [
      prefix for table, optimizers in _tables(embedding).values()
      for prefix in delta.save_delta(directory, table, optimizers)
  ]


def restore_tables(embedding, directory: str, deltas: Sequence[str] = ()) -> None:
  """Restores every table from a full save and its `deltas`, oldest first.

  Keys keep their saved rows; later deltas build on what is restored.

  Raises:
    FileNotFoundError, ValueError: as checkpoint.restore_table (a missing
      table or shard, another dim or optimizer), naming table and file; a
      delta missing a table's shard.
  """
  for table, optimizers in _tables(embedding).values():
    if deltas:
      delta.restore_chain(directory, list(deltas), table, optimizers, keep_rows=True)
    else:
      checkpoint.restore_table(directory, table, optimizers, keep_rows=True)
    table.key_index.export_changes(clear=True)  # Deltas from here build on this state.
