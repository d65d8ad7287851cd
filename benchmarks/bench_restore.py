"""Benchmark of restoring and exporting a sharded table: peak memory per process, and export size.

A table of `--keys` keys x dim 64 with lazy Adam slots is saved as a 2-shard
job saves it (one child process per shard: a core table marked shard i of 2,
holding the keys it owns, random rows and slots, distributed/checkpoint.
save_shard). Then fresh child processes restore shard 0 of 2 (same count) and
shard 0 of 3 (re-sharded), each two ways in the same run:

- owned: today's distributed/checkpoint.restore_shard (reads only what the
  shard owns, rows streamed in chunks into the variables);
- whole: the restore before issue #30, written out here: read_all_shards
  (every shard's keys, rows and slots into NumPy), filter by owner, then
  tensor_scatter_nd_update of the table's initial rows and slots.

Export (`--part export`): each of the 2 workers is a child holding its shard
(the saved shard's keys, random rows and slots), exporting two ways:

- staged: today's distributed/export.table_snapshot: worker 1 stages its
  shard's keys and rows, the chief reads its own shard in place and the
  staged file one chunk at a time into the snapshot (keys in a
  SortedKeyTable variable) and writes the SavedModel;
- gathered: the export before issue #30, written out here: every worker ends
  up with every shard's keys and rows (what export.gather_shards' all-gather
  gave each worker; read from the shard files here, as the collective's
  transfer is not the point), sorted; the chief builds a StaticHashTable of
  constant keys and a variable of the rows, and writes the SavedModel.

Reported per child: the process's peak RSS during the step (VmHWM after
resetting it through /proc/self/clear_refs; before an export, glibc's
malloc_trim returns freed heap first) against what it holds (restore:
its RSS once restored, goal <= 1.3x; export: its RSS before, holding its
shard, goal <= 1.3x for a worker; the exporter's growth over the serving
rows, which it must hold once), seconds, and the export's saved_model.pb
bytes.

Usage:
  python benchmarks/bench_distributed.py --only restore_export      # 4M keys, both parts
  python benchmarks/bench_restore.py --keys 400000 --part export    # quicker

The ParameterServerStrategy half (a table sharded over ps tasks) is
benchmarks/bench_restore_ps.py.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

DIM = 64
TABLE = "item"
SAVED_SHARDS = 2


def _status_kib(field: str) -> int:
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    if line.startswith(field + ":"):
      return int(line.split()[1])
  raise KeyError(field)


def _keys(count: int):
  import numpy as np  # pylint: disable=import-outside-toplevel
  return np.random.default_rng(0).choice(1 << 40, size=count, replace=False).astype(np.int64)


def _table(capacity: int, shard_id: int, num_shards: int):
  """(table as shard i of n, its lazy Adam optimizer with slots), in a fresh init()."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.core import embedding  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.optimizers import lazy_adam  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.util import initialize  # pylint: disable=import-outside-toplevel
  initialize.init()
  table = embedding.create_table(tf.int64, DIM, TABLE, tf.keras.initializers.Zeros(),
                                 device_vocabulary_size=capacity).as_shard(shard_id, num_shards)
  optimizer = lazy_adam.create_hash_optimizer(0.001)
  optimizer.build([table.variable])
  return table, optimizer


def _filled_shard(keys: int, shard_id: int):
  """(table, optimizer): shard `shard_id` of SAVED_SHARDS holding its owned keys, random rows
  and slots (seeded by shard_id)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import sharding  # pylint: disable=import-outside-toplevel
  all_keys = _keys(keys)
  owned = all_keys[sharding.owner_numpy(all_keys, SAVED_SHARDS) == shard_id]
  del all_keys
  table, optimizer = _table(owned.size, shard_id, SAVED_SHARDS)
  table.key_index.insert(tf.constant(owned), training=True)
  rng = np.random.default_rng(shard_id)
  for variable in [table.variable, *table.slot_variables(optimizer).values()]:
    variable.assign(rng.standard_normal(variable.shape, np.float32))
  return table, optimizer


def child_save(directory: str, keys: int, shard_id: int) -> dict:
  """Saves shard `shard_id` of SAVED_SHARDS: its owned keys, random rows and slots."""
  from mxrec_pipeline.distributed import checkpoint  # pylint: disable=import-outside-toplevel
  table, optimizer = _filled_shard(keys, shard_id)
  owned = table.key_index.size().numpy()
  start = time.perf_counter()
  checkpoint.save_shard(directory, table, [optimizer])
  return {"keys": int(owned), "save_s": time.perf_counter() - start}


def _restore_whole(directory: str, table, optimizer) -> int:
  """The restore before issue #30: every shard read whole into NumPy, then filtered."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.core import key_index  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import checkpoint  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import sharding  # pylint: disable=import-outside-toplevel
  saved = checkpoint.read_all_shards(directory, TABLE, [optimizer])
  keep = sharding.owner_numpy(saved["keys"], table.num_shards) == table.shard_id
  order = np.argsort(saved["keys"][keep], kind="stable")
  keys = saved["keys"][keep][order]
  rows = np.arange(keys.size, dtype=np.int64)
  pending = sharding.owner_numpy(saved["pending_keys"], table.num_shards) == table.shard_id
  state = {
      "keys": keys, "rows": rows, "last_seen": saved["last_seen"][keep][order],
      "counters": saved["counters"]
  }
  state.update(
      {n: saved[n][pending] for n in ("pending_keys", "pending_counts", "pending_last_seen")})
  table.key_index.import_state({n: tf.constant(state[n], tf.int64) for n in key_index.STATE_NAMES})
  indices = tf.constant(rows[:, None])
  table.variable.assign(
      tf.tensor_scatter_nd_update(table.initial_rows(), indices, saved["values"][keep][order]))
  for slot_name, slot in table.slot_variables(optimizer).items():
    values = saved[f"slot/{optimizer.optimizer_name}/{slot_name}"][keep][order]
    slot.assign(tf.tensor_scatter_nd_update(tf.zeros_like(slot), indices, values))
  return int(keys.size)


def child_restore(directory: str, keys: int, num_shards: int, how: str) -> dict:
  """Restores shard 0 of `num_shards` the `how` way ("owned" or "whole"); its memory and time."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import checkpoint  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import sharding  # pylint: disable=import-outside-toplevel
  all_keys = _keys(keys)
  owned = int((sharding.owner_numpy(all_keys, num_shards) == 0).sum())
  del all_keys
  table, optimizer = _table(owned, 0, num_shards)
  own_bytes = 3 * owned * DIM * 4  # Rows, m and v of the shard.
  before = _status_kib("VmRSS")
  pathlib.Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS.
  start = time.perf_counter()
  if how == "owned":
    restored = checkpoint.restore_shard(directory, table, [optimizer])
  else:
    restored = _restore_whole(directory, table, optimizer)
  seconds = time.perf_counter() - start
  peak, after = _status_kib("VmHWM"), _status_kib("VmRSS")
  assert restored == owned, (restored, owned)
  assert np.isfinite(table.variable.numpy()[:8]).all()
  return {
      "how": how, "num_shards": num_shards, "keys": owned, "seconds": seconds,
      "own_mb": own_bytes / 2**20, "rss_before_mb": before / 1024, "peak_mb": peak / 1024,
      "rss_after_mb": after / 1024, "peak_over_after": peak / after, "growth_over_own":
          (peak - before) * 1024 / own_bytes
  }


def _run_child(kind: str, params: dict, tmp: str) -> dict:
  out = os.path.join(tmp, f"{kind}_{len(os.listdir(tmp))}.json")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  subprocess.run([sys.executable, __file__, "--child", out, kind,
                  json.dumps(params)], check=True, env=env)
  return json.loads(pathlib.Path(out).read_text())


def run(keys: int, tmp: str, part: str = "both") -> dict:
  """Saves the 2-shard checkpoint, then restores shard 0 of 2 and of 3 both ways, and exports."""
  directory = os.path.join(tmp, "ckpt")
  saved = [
      _run_child("save", {"directory": directory, "keys": keys, "shard_id": i}, tmp)
      for i in range(SAVED_SHARDS)
  ]
  print(
      f"saved {keys:,} keys x dim {DIM} (+ lazy Adam m, v) as {SAVED_SHARDS} shards in "
      f"{sum(s['save_s'] for s in saved):.1f} s", flush=True)
  results = []
  for num_shards in (2, 3) if part != "export" else ():
    for how in ("whole", "owned"):
      r = _run_child("restore",
                     {"directory": directory, "keys": keys, "num_shards": num_shards, "how": how},
                     tmp)
      results.append(r)
      print(
          f"restore shard 0 of {num_shards} ({r['keys']:,} keys, own variables "
          f"{r['own_mb']:.0f} MB), {how:5}: peak RSS {r['peak_mb']:.0f} MB = "
          f"{r['peak_over_after']:.2f}x the restored process ({r['rss_after_mb']:.0f} MB); "
          f"growth {r['growth_over_own']:.2f}x its own variables; {r['seconds']:.1f} s", flush=True)
  for num_shards in (2, 3) if part != "export" else ():
    whole, owned = (r for r in results if r["num_shards"] == num_shards)
    growth = [r["peak_mb"] - r["rss_before_mb"] for r in (owned, whole)]
    print(f"shard 0 of {num_shards}: owned / whole peak growth {growth[0] / growth[1]:.2f}x, "
          f"time {owned['seconds'] / whole['seconds']:.2f}x")
  exports = run_export(keys, tmp, directory) if part != "restore" else []
  return {"saved": saved, "restores": results, "exports": exports}


def _export_gathered(directory: str, export_dir: str | None) -> None:
  """The export before issue #30: every shard's keys and rows in this process, constant keys."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import shard_files  # pylint: disable=import-outside-toplevel
  parts = [
      shard_files.read_tensors(p, TABLE, ["keys", "values"])
      for p in shard_files.saved_shards(directory, TABLE)
  ]
  keys = np.concatenate([p["keys"] for p in parts])
  rows = np.concatenate([p["values"] for p in parts])
  del parts
  order = np.argsort(keys, kind="stable")
  keys, rows = keys[order], rows[order]
  if export_dir is None:  # A worker other than the chief: its export was thrown away.
    return
  module = tf.Module()
  module.rows = tf.Variable(np.concatenate([rows, np.zeros([1, DIM], rows.dtype)]), trainable=False)
  module.positions = tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(tf.constant(keys), tf.range(keys.size, dtype=tf.int64)),
      default_value=keys.size)
  lookup = tf.function(lambda ids: tf.gather(module.rows, module.positions.lookup(ids)),
                       input_signature=[tf.TensorSpec([None], tf.int64)])
  tf.saved_model.save(module, export_dir, signatures={"lookup_item": lookup})


def _export_staged(table, staging: str, export_dir: str | None) -> None:
  """Today's export: stage this shard; the chief (export_dir set) builds from the staged files."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import export  # pylint: disable=import-outside-toplevel
  if export_dir is None:
    export.table_snapshot(table, staging, barrier=lambda: None)
    return
  # The chief: shard 1 staged its files before (the cluster's barrier, run in order here).
  snapshot = export.table_snapshot(table, staging, barrier=lambda: None)
  export.TableSnapshot({TABLE: (tf.int64, snapshot)}).save(export_dir)


def child_export(directory: str, keys: int, shard_id: int, how: str, staging: str,
                 export_dir: str) -> dict:
  """Worker `shard_id` of 2 holding its shard exports the `how` way; its memory and time."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  table, _ = _filled_shard(keys, shard_id)  # The saved shard's keys, rows and slots.
  own_bytes = 3 * table.key_index.size().numpy() * DIM * 4
  exporter = export_dir if shard_id == 0 else None
  # Freed heap pages back to the OS: RSS is then what the process holds.
  ctypes.CDLL("libc.so.6").malloc_trim(0)
  before = _status_kib("VmRSS")
  pathlib.Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS.
  start = time.perf_counter()
  if how == "staged":
    _export_staged(table, staging, exporter)
  else:
    _export_gathered(directory, exporter)
  seconds = time.perf_counter() - start
  peak = _status_kib("VmHWM")
  serving_bytes = keys * DIM * 4
  pb = os.path.getsize(os.path.join(export_dir, "saved_model.pb")) if exporter else None
  del np
  return {
      "how": how, "shard_id": shard_id, "seconds": seconds, "own_mb": own_bytes / 2**20,
      "serving_mb": serving_bytes / 2**20, "rss_before_mb": before / 1024, "peak_mb": peak / 1024,
      "peak_over_before": peak / before, "growth_over_serving":
          (peak - before) * 1024 / serving_bytes, "saved_model_pb_bytes": pb
  }


def run_export(keys: int, tmp: str, directory: str) -> list[dict]:
  """Worker 1 then worker 0 (the chief) export each way, from the saved 2-shard checkpoint."""
  results = []
  for how in ("gathered", "staged"):
    staging = os.path.join(tmp, f"staging_{how}")
    export_dir = os.path.join(tmp, f"export_{how}")
    for shard_id in (1, 0):
      r = _run_child(
          "export", {
              "directory": directory, "keys": keys, "shard_id": shard_id, "how": how,
              "staging": staging, "export_dir": export_dir
          }, tmp)
      results.append(r)
      role = "chief (writes)" if shard_id == 0 else "worker 1"
      pb = (f"; saved_model.pb {r['saved_model_pb_bytes']:,} B"
            if r["saved_model_pb_bytes"] is not None else "")
      print(
          f"export {how:8} {role:14}: holds {r['rss_before_mb']:.0f} MB (own shard "
          f"{r['own_mb']:.0f} MB); peak {r['peak_mb']:.0f} MB = {r['peak_over_before']:.2f}x; "
          f"growth {r['growth_over_serving']:.2f}x the serving rows ({r['serving_mb']:.0f} MB); "
          f"{r['seconds']:.1f} s{pb}", flush=True)
  for shard_id in (0, 1):
    old, new = (r for r in results if r["shard_id"] == shard_id)
    growth = [r["peak_mb"] - r["rss_before_mb"] for r in (new, old)]
    print(f"export, worker {shard_id}: staged / gathered peak growth "
          f"{growth[0] / max(growth[1], 1e-9):.2f}x, time {new['seconds'] / old['seconds']:.2f}x")
  return results


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--keys", type=int, default=4_000_000, help="keys of the table")
  parser.add_argument("--part", choices=("restore", "export", "both"), default="both")
  parser.add_argument("--json", help="also write the figures to this file")
  parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    out, kind, params = args.child
    child = {"save": child_save, "restore": child_restore, "export": child_export}[kind]
    pathlib.Path(out).write_text(json.dumps(child(**json.loads(params))))
    return 0
  print(f"bench_restore: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start",
        flush=True)
  with tempfile.TemporaryDirectory(prefix="bench_restore_") as tmp:
    results = run(args.keys, tmp, args.part)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
