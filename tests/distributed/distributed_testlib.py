"""Helpers of the multi-worker tests: a localhost cluster, the toy model, its one-process run.

`run_cluster` starts one Python process per worker with its TF_CONFIG on free
localhost ports (as TF's multi_process_runner does), waits for all with a
deadline and kills every process it started in a `finally`.

The toy model: GLOBAL_BATCH examples of IDS_PER_EXAMPLE ids of one table
(skewed ints, repeated within and across workers), score = sum(emb * w) + b,
loss = sum of squared errors / GLOBAL_BATCH. Worker w of W trains examples
[w * B/W, (w + 1) * B/W) of each global batch, so W workers and one process
see the same global batches.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

from mxrec_pipeline.cluster import local

REPO = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).resolve().parent / "sharded_worker.py"

GLOBAL_BATCH = 16
IDS_PER_EXAMPLE = 3
DIM = 4
ROWS = 256  # Rows of one process's table and of each shard.
TABLE = "item"
SECOND_TABLE = "user"
# Hyperparameters of each hash optimizer (optimizers/factory.py keys).
OPTIMIZERS = {
    "lazy_adam": {"learning_rate": 0.05},
    "adagrad": {"learning_rate": 0.1},
    "sgd": {"learning_rate": 0.1},
    "ftrl": {"learning_rate": 0.1},
}


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
  """Global batch `step`: ids [GLOBAL_BATCH, IDS_PER_EXAMPLE] int64, labels [GLOBAL_BATCH] float32.

  Zipf-like ids among ~200 values (many repeats), spread over the int64 range.
  """
  rng = np.random.default_rng(1000 + step)
  ranks = np.minimum(rng.zipf(1.3, size=(GLOBAL_BATCH, IDS_PER_EXAMPLE)), 200)
  ids = ranks.astype(np.int64) * 1_000_003 - 2**40
  labels = rng.normal(size=GLOBAL_BATCH).astype(np.float32)
  return ids, labels


EVAL_DEFAULT = -1.0  # Row read by ids never trained in evaluation lookups.


def eval_ids(shard: int) -> np.ndarray:
  """[2, 4] int64 ids worker `shard` evaluates: ids of batch 0, then 2 never seen."""
  seen = batch(0)[0].ravel()[shard * 6:shard * 6 + 6]
  return np.concatenate([seen, [7 + shard, -7]]).reshape(2, 4).astype(np.int64)


def second_table_ids(ids):
  """Ids of the second table: other keys, with the first table's repeats."""
  return ids * 7 + 3


# The second table's rows are twice as wide (a grouped exchange carries rows of several widths),
# folded onto the first's dim (`fold_second`) before the two are added.
SECOND_DIM = 2 * DIM


def fold_second(emb: tf.Tensor) -> tf.Tensor:
  """[..., SECOND_DIM] second-table rows -> [..., DIM]: the two halves added."""
  return emb[..., :DIM] + emb[..., DIM:]


def step_time(step: int) -> int:
  """Timestamp (seconds) of global batch `step`, for eviction."""
  return 100 + 6 * step


def worker_slice(step: int, shard: int, num_shards: int):
  ids, labels = batch(step)
  per = GLOBAL_BATCH // num_shards
  return ids[shard * per:(shard + 1) * per], labels[shard * per:(shard + 1) * per]


def initializer():
  # Constant: a shard draws the same rows as one process (see ShardedTable).
  return tf.keras.initializers.Constant(0.1)


def make_dense():
  """(w [IDS_PER_EXAMPLE, DIM], b [1]) variables with fixed initial values."""
  w0 = np.linspace(-0.5, 0.5, IDS_PER_EXAMPLE * DIM).reshape(IDS_PER_EXAMPLE, DIM)
  return (tf.Variable(w0.astype(np.float32), name="w"), tf.Variable([0.2], name="b"))


def loss_of(emb, labels, dense):
  """Sum over the examples given of squared errors, / GLOBAL_BATCH."""
  w, b = dense
  scores = tf.reduce_sum(emb * w, axis=[1, 2]) + b
  return tf.reduce_sum(tf.square(scores - labels)) / GLOBAL_BATCH


def dense_optimizer():
  return tf.keras.optimizers.Adam(0.01)


def reference_run(optimizer_key: str, steps: int, first_step: int = 0, restore: str = "",
                  save: str = "", access_threshold: int | None = None,
                  eviction_threshold_s: int | None = None, second_table: bool = False) -> dict:
  """One process on the global batches: losses, final rows by key, dense weights.

  Trains global batches first_step..first_step + steps - 1; restores the table
  (distributed/checkpoint.py) and the dense model from `restore` first, saves
  them to `save` at the end, as sharded_worker.py does (shard 0 of 1). With
  access_threshold, the lookups admit keys as core/admission.py does; with
  eviction_threshold_s, global batch `step` has time step_time(step) and idle
  keys are evicted after every step. With second_table, a second table on
  second_table_ids(ids) adds its embeddings to the first's (keys2, rows2).
  """
  from mxrec_pipeline.core import admission
  from mxrec_pipeline.core import embedding
  from mxrec_pipeline.core import key_index
  from mxrec_pipeline.core import lookup
  from mxrec_pipeline.distributed import checkpoint
  from mxrec_pipeline.optimizers import factory
  from mxrec_pipeline.util import initialize

  initialize.init()
  try:
    table = embedding.create_table(key_dtype=tf.int64, dim=DIM, name=TABLE,
                                   emb_initializer=initializer(), device_vocabulary_size=ROWS)
    second = None
    if second_table:
      second = embedding.create_table(key_dtype=tf.int64, dim=SECOND_DIM, name=SECOND_TABLE,
                                      emb_initializer=initializer(), device_vocabulary_size=ROWS)
    optimizer = factory.get_optimizer(optimizer_key, **OPTIMIZERS[optimizer_key])
    dense = make_dense()
    dense_opt = dense_optimizer()
    dense_opt.build(list(dense))  # Its slots exist before a restore.
    dense_checkpoint = tf.train.Checkpoint(w=dense[0], b=dense[1], optimizer=dense_opt)
    if restore:
      checkpoint.restore_shard(restore, table, [optimizer])
      dense_checkpoint.read(os.path.join(restore, "dense-0")).assert_consumed()
    if access_threshold is not None or eviction_threshold_s is not None:
      admission.configure(TABLE, admission.AdmitEvictConfig(access_threshold, eviction_threshold_s),
                          "reference")
    admitting = (access_threshold or 0) > 1

    def lookup_batch(ids, step):
      # The core's training lookup of tensor ids, with the batch's timestamp.
      keys = key_index.to_keys(tf.constant(ids))
      rows, restore = admission.insert(initialize.get_config_initializer().container, TABLE,
                                       tf.reshape(keys, [-1]), True,
                                       timestamp=tf.constant(step_time(step), tf.int64))
      unique = lookup.unique_embeddings(table, rows, training=True, admitting=admitting)
      return lookup.per_id(unique, tf.reshape(restore, ids.shape))

    losses = []
    for step in range(first_step, first_step + steps):
      ids, labels = batch(step)
      with tf.GradientTape() as tape:
        emb = lookup_batch(ids, step)
        if second is not None:
          emb += fold_second(embedding.sparse_lookup(second, tf.constant(second_table_ids(ids))))
        loss = loss_of(emb, labels, dense)
      variables = [table.variable] + ([] if second is None else [second.variable])
      grads = tape.gradient(loss, [*dense, *variables])
      dense_opt.apply_gradients(zip(grads[:2], dense))
      optimizer.apply_gradients(zip(grads[2:], variables))
      if eviction_threshold_s is not None:
        admission.evict(table, eviction_threshold_s, [optimizer])
      losses.append(float(loss))
    if save:
      checkpoint.save_shard(save, table, [optimizer])
      dense_checkpoint.write(os.path.join(save, "dense-0"))
    keys, rows = table.key_index.export()
    extra = {}
    if second is not None:
      keys2, rows2 = second.key_index.export()
      extra = {"keys2": keys2.numpy(), "rows2": tf.gather(second.variable, rows2).numpy()}
    return {
        **extra,
        "losses": np.array(losses),
        "keys": keys.numpy(),
        "rows": tf.gather(table.variable, rows).numpy(),
        "w": dense[0].numpy(),
        "b": dense[1].numpy(),
    }
  finally:
    initialize.terminate_config_initializer()


def by_key(keys: np.ndarray, rows: np.ndarray) -> dict[int, np.ndarray]:
  return {int(k): r for k, r in zip(keys, rows)}


def assert_rows_equal(got: dict, want: dict) -> None:
  """Same keys, and rows equal to 1e-5, of two {key: row} dicts."""
  assert sorted(got) == sorted(want)
  for key, row in want.items():
    np.testing.assert_allclose(got[key], row, rtol=1e-5, atol=1e-6, err_msg=f"key {key}")


def tf_config(ports: list[int], index: int) -> str:
  """TF_CONFIG of worker `index` of a localhost cluster of len(ports) workers."""
  return json.dumps({
      "cluster": {"worker": [f"localhost:{p}" for p in ports]},
      "task": {"type": "worker", "index": index},
  })


def start_cluster(num_workers: int, args_of: list[list[str]], logs: pathlib.Path):
  """Starts the workers (sharded_worker.py with args_of[i]); returns the Popen list."""
  ports = local.free_ports(num_workers)
  processes = []
  for i in range(num_workers):
    env = dict(os.environ, TF_CONFIG=tf_config(ports, i), PYTHONPATH=str(REPO),
               TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    log = open(logs / f"worker{i}.log", "wb")  # pylint: disable=consider-using-with
    processes.append(
        subprocess.Popen([sys.executable, str(WORKER), *args_of[i]], env=env, stdout=log,
                         stderr=subprocess.STDOUT, cwd=str(REPO)))
    log.close()
  return processes


def wait_all(processes, deadline_s: float) -> list[int | None]:
  """Return codes, None for a process still running at the deadline."""
  end = time.monotonic() + deadline_s
  codes = []
  for p in processes:
    try:
      codes.append(p.wait(timeout=max(0.1, end - time.monotonic())))
    except subprocess.TimeoutExpired:
      codes.append(None)
  return codes


def kill_all(processes) -> None:
  for p in processes:
    if p.poll() is None:
      p.kill()
      p.wait(timeout=30)


def run_workers(num_workers: int, args_of: list[list[str]], logs: pathlib.Path,
                deadline_s: float = 50) -> tuple[list[int | None], list[str]]:
  """Runs the workers; (exit codes, None for a hung one killed at the deadline; their logs)."""
  processes = start_cluster(num_workers, args_of, logs)
  try:
    codes = wait_all(processes, deadline_s)
  finally:
    kill_all(processes)
  texts = [(logs / f"worker{i}.log").read_text(errors="replace") for i in range(num_workers)]
  return codes, texts


def run_cluster(num_workers: int, args_of: list[list[str]], logs: pathlib.Path,
                deadline_s: float = 50) -> None:
  """Runs the workers to the end; raises with their logs when one fails or hangs."""
  codes, texts = run_workers(num_workers, args_of, logs, deadline_s)
  if any(code != 0 for code in codes):
    tails = "\n".join(
        f"--- worker {i} (exit {code}):\n" + texts[i][-3000:] for i, code in enumerate(codes))
    raise AssertionError(f"a worker failed or hung (exit codes {codes}):\n{tails}")
