"""Benchmark of restoring and exporting a table sharded over parameter servers: peak memory.

The ParameterServerStrategy half of benchmarks/bench_restore.py. Each trial
runs on a fresh local cluster: this process starts 2 ps tasks and 1 worker
task (`python -m mxrec_pipeline.cluster.ps_server`; ParameterServerStrategy
needs a worker, which stays idle: restore and export run on the coordinator
and the ps tasks) on free ports, and the coordinator, a child running this
file as the "chief" task. The coordinator builds a PSShardedTable of `--keys`
keys x dim 64 with lazy Adam slots, shard i on ps i (each shard's rows as
many as the larger shard's keys), and:

- save: fills each shard on its ps (inserts the keys it owns, rows and slots
  drawn there: stateless_normal), exports it today's way (measured, below),
  then saves it as a PS job does (ps_checkpoint.save: each ps writes its
  bundle `shard-<i>-of-2` itself);
- restore, owned: today's ps_checkpoint.restore onto an empty table of a
  fresh cluster (checkpoint.restore_table: per shard, under its ps device,
  the coordinator reads the bundle's keys and state, then streams its rows
  and slots 65,536 keys at a time (RestoreV2 slices run on the ps, handed
  through the coordinator) into the shard's variables);
- restore, whole: the restore before issue #30 (bench_restore._restore_whole
  per shard under its ps device, as checkpoint.restore_shard did then): the
  coordinator reads every bundle whole into NumPy (read_all_shards), keeps
  the shard's keys and sends its rows and slots to a tensor_scatter_nd_update
  of the initial rows on the ps;
- export, read: today's ps_checkpoint.snapshot_tables (export.table_snapshot):
  the coordinator reads each shard's keys, then its rows (not slots) 65,536
  keys at a time, into one preallocated snapshot variable, keys in a
  SortedKeyTable; TableSnapshot.save writes the SavedModel;
- export, gathered: the export before issue #30, written out here on a fresh
  cluster filled the same way: PSShardedTable.gather_rows (every shard's
  keys, rows and slots read whole into the coordinator's NumPy, the rows
  concatenated and sorted), a variable of the rows plus the default row and a
  SortedKeyTable of the keys (the TableSnapshot of then).

Measured by the coordinator for itself and each ps process (same user, so it
may reset and read their /proc files): peak RSS over the step (VmHWM after
writing "5" to /proc/<pid>/clear_refs; before each step the coordinator
returns its freed heap with glibc's malloc_trim) against what the process
holds. Restore: each ps's peak against its RSS once restored (goal <= 1.3x);
the coordinator's growth against a shard's variables (rows, m, v; goal: it
holds no shard). Export: each ps's peak against its RSS holding its shard
(goal <= 1.3x); the coordinator's growth against the serving rows
(keys x 64 x 4 B), which it must hold once; seconds; saved_model.pb bytes.

TensorFlow's default CPU allocator on x86 (oneDNN's, TF_ENABLE_ONEDNN_OPTS
unset or 1) keeps the memory of freed tensors for reuse: a process's RSS stays
at its peak, so "peak / RSS once restored" is about 1.0x whatever the restore
allocated, and memory freed before a step (the fill's temporaries on a ps) is
reused by it. `TF_ENABLE_ONEDNN_OPTS=0` in the environment (every task
inherits it) gives an allocator that returns freed memory: then RSS is what
a process holds. The header line says which.

Usage:
  python benchmarks/bench_distributed.py --only restore_export      # both placements, 4M keys
  python benchmarks/bench_restore_ps.py --keys 400000               # quicker, PS only
  python benchmarks/bench_restore_ps.py --part export --no-before   # today's export only
  TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/bench_restore_ps.py     # freed memory returned
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from mxrec_pipeline.cluster import local

import bench_restore  # benchmarks/: DIM, TABLE, the keys and the pre-#30 restore.

DIM, TABLE = bench_restore.DIM, bench_restore.TABLE
NUM_PS = 2
CLUSTER = local.LocalClusterSpec(workers=1, ps=NUM_PS)
DEADLINE_S = 1800  # Of one coordinator run.


def _status_kib(pid: int, field: str) -> int:
  for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
    if line.startswith(field + ":"):
      return int(line.split()[1])
  raise KeyError(field)


def _sync() -> None:
  """Waits for every op this process has sent (to the ps tasks too)."""
  # pylint: disable=import-outside-toplevel,g-direct-tensorflow-import
  from tensorflow.python.eager import context
  context.async_wait()


class _Watch:
  """Peak RSS of processes over a step: VmHWM after resetting it through clear_refs."""

  def __init__(self, pids: dict[str, int]):
    self.pids = pids
    self.before: dict[str, int] = {}

  def start(self) -> None:
    _sync()  # Nothing of the step before still runs on a ps.
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # This process's freed heap back to the OS.
    for name, pid in self.pids.items():
      self.before[name] = _status_kib(pid, "VmRSS")
      pathlib.Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS.
    self.started = time.perf_counter()

  def stop(self) -> dict:
    _sync()
    seconds = time.perf_counter() - self.started
    out = {"seconds": seconds}
    for name, pid in self.pids.items():
      peak, after = _status_kib(pid, "VmHWM"), _status_kib(pid, "VmRSS")
      out[name] = {
          "before_mb": self.before[name] / 1024, "peak_mb": peak / 1024, "after_mb": after / 1024
      }
    return out


def _owned_counts(keys: int) -> list[int]:
  import numpy as np  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import sharding  # pylint: disable=import-outside-toplevel
  owners = sharding.owner_numpy(bench_restore._keys(keys), NUM_PS)  # pylint: disable=protected-access
  return [int(c) for c in np.bincount(owners, minlength=NUM_PS)]


def _connect():
  """The ParameterServerStrategy of this coordinator's cluster (TF_CONFIG), its tasks up."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline import ops  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.cluster import reach  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.cluster import tf_config  # pylint: disable=import-outside-toplevel
  ops.load()
  reach.wait_for_tasks(tf_config.parse(os.environ[tf_config.ENV_VAR]))
  return tf.distribute.experimental.ParameterServerStrategy(
      tf.distribute.cluster_resolver.TFConfigClusterResolver())


def _table(strategy, rows: int):
  """A PSShardedTable of TABLE: `rows` rows per shard, zeros, lazy Adam."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import ps_table  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.optimizers import lazy_adam  # pylint: disable=import-outside-toplevel
  return ps_table.PSShardedTable(strategy, name=TABLE, dim=DIM, device_vocabulary_size=rows,
                                 optimizer=lazy_adam.create_hash_optimizer(0.001),
                                 emb_initializer=tf.keras.initializers.Zeros())


def _fill(table, keys: int) -> None:
  """Inserts each shard's owned keys on its ps; its rows and slots drawn there."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import sharding  # pylint: disable=import-outside-toplevel
  all_keys = bench_restore._keys(keys)  # pylint: disable=protected-access
  owners = sharding.owner_numpy(all_keys, table.num_shards)
  for shard in table.shards:
    with tf.device(shard.device):
      shard.key_index.insert(tf.constant(all_keys[owners == shard.shard_id]), training=True)
      for j, variable in enumerate([shard.variable, *shard.slots.values()]):
        variable.assign(tf.random.stateless_normal(variable.shape, [shard.shard_id, j]))


def _export_gathered(table, export_dir: str) -> None:
  """The PS export before issue #30: every shard's keys, rows and slots read whole, sorted."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.core.sorted_key_table import SortedKeyTable  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import export  # pylint: disable=import-outside-toplevel
  keys, rows = table.gather_rows()
  default = np.zeros([1, DIM], rows.dtype)
  snapshot = export.Snapshot(
      tf.Variable(np.concatenate([rows, default]), trainable=False, name=f"{TABLE}_serving_rows"),
      SortedKeyTable(keys, default_value=len(keys), name=f"{TABLE}_positions"))
  del keys, rows
  export.TableSnapshot({TABLE: (tf.int64, snapshot)}).save(export_dir)


def _check_export(table, export_dir: str, keys: int) -> None:
  """The SavedModel serves the table's rows of a few keys (and zeros for an absent key)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import export  # pylint: disable=import-outside-toplevel
  ids = tf.constant(np.append(bench_restore._keys(keys)[:6], -5))  # pylint: disable=protected-access
  served = tf.saved_model.load(export_dir).signatures[export.signature_name(TABLE)](ids=ids)
  want = table.lookup(ids, training=False).numpy()
  np.testing.assert_array_equal(served["embeddings"].numpy(), want)
  assert not want[-1].any() and want[:-1].any()


def coordinator_save(keys: int, directory: str, export_dir: str, how: str, pids: dict,
                     export_too: bool = True) -> dict:
  """Fills the table, exports it the `how` way (measured) and, for how="read", saves it.

  Args:
    keys, directory, export_dir: The table's keys, the checkpoint's and the export's directories.
    how: "read" (today's export) or "gathered" (the one before issue #30).
    pids: Task name -> pid of each ps.
    export_too: False: no export (a run of the restores only).
  """
  from mxrec_pipeline.distributed import ps_checkpoint  # pylint: disable=import-outside-toplevel
  strategy = _connect()
  counts = _owned_counts(keys)
  table = _table(strategy, max(counts))
  start = time.perf_counter()
  _fill(table, keys)
  fill_s = time.perf_counter() - start
  out = {"how": how, "counts": counts, "fill_s": fill_s}
  if export_too:
    watch = _Watch(dict(pids, coordinator=os.getpid()))
    watch.start()
    if how == "read":
      ps_checkpoint.snapshot_tables([table]).save(export_dir)
    else:
      _export_gathered(table, export_dir)
    out["export"] = watch.stop()
    out["saved_model_pb_bytes"] = os.path.getsize(os.path.join(export_dir, "saved_model.pb"))
    _check_export(table, export_dir, keys)
  if how == "read":
    start = time.perf_counter()
    ps_checkpoint.save(directory, table)
    out["save_s"] = time.perf_counter() - start
  return out


def coordinator_restore(keys: int, directory: str, how: str, pids: dict) -> dict:
  """Restores the saved table onto a fresh one the `how` way ("owned" or "whole"), measured."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import ps_checkpoint  # pylint: disable=import-outside-toplevel
  from mxrec_pipeline.distributed import shard_files  # pylint: disable=import-outside-toplevel
  strategy = _connect()
  counts = _owned_counts(keys)
  table = _table(strategy, max(counts))
  watch = _Watch(dict(pids, coordinator=os.getpid()))
  watch.start()
  if how == "owned":
    restored = ps_checkpoint.restore(directory, table)
  else:
    restored = []
    for shard in table.shards:
      with tf.device(shard.device):
        restored.append(bench_restore._restore_whole(directory, shard, table.optimizer))  # pylint: disable=protected-access
  out = {"restore": watch.stop(), "how": how, "counts": counts}
  assert restored == counts, (restored, counts)
  # A few saved rows, read back through the restored table.
  prefix = shard_files.saved_shards(directory, TABLE)[0]
  saved_keys = shard_files.read_tensors(prefix, TABLE, ["keys"])["keys"][:6]
  layout = shard_files.layout(prefix, TABLE, ["values"])
  saved_rows = shard_files.read_rows(prefix, TABLE, layout, 0, 6)["values"]
  np.testing.assert_array_equal(table.lookup(tf.constant(saved_keys), training=False), saved_rows)
  return out


def _start_cluster(logs: pathlib.Path) -> tuple[str, dict[str, subprocess.Popen]]:
  """Starts the ps and worker servers of CLUSTER; (the chief's TF_CONFIG, task name -> Popen)."""
  configs = local.cluster_tf_configs(CLUSTER)
  servers = {}
  for (job, index), config in list(zip(CLUSTER.tasks(), configs))[1:]:
    env = dict(os.environ, TF_CONFIG=config, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    with open(logs / f"{job}{index}.log", "wb") as log:
      servers[f"{job} {index}"] = subprocess.Popen(local.server_command(), env=env, stdout=log,
                                                   stderr=subprocess.STDOUT)
  return configs[0], servers


def _stop(processes) -> None:
  for process in processes:
    if process.poll() is None:
      process.terminate()
  for process in processes:
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


def run_trial(kind: str, params: dict, tmp: str) -> dict:
  """Runs coordinator_<kind>(**params) as the chief of a fresh local cluster; its result."""
  logs = pathlib.Path(tempfile.mkdtemp(prefix=f"{kind}_", dir=tmp))
  out = logs / "out.json"
  chief_config, servers = _start_cluster(logs)
  params = dict(params, pids={n: p.pid for n, p in servers.items() if n.startswith("ps ")})
  env = dict(os.environ, TF_CONFIG=chief_config, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
  try:
    with open(logs / "chief.log", "wb") as log:
      chief = subprocess.Popen(
          [sys.executable, __file__, "--coordinator",
           str(out), kind,
           json.dumps(params)], env=env, stdout=log, stderr=subprocess.STDOUT)
      try:
        code = chief.wait(timeout=DEADLINE_S)
      finally:
        _stop([chief])
  finally:
    _stop(servers.values())
  if code != 0:
    tails = "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}"
                      for p in sorted(logs.glob("*.log")))
    raise RuntimeError(f"coordinator {kind} {params} failed (exit {code}):\n{tails}")
  return json.loads(out.read_text())


def _ps_text(step: dict, over: str, counts: list[int]) -> str:
  """`ps i peak N MB = r x M MB, growth g x its variables` of each ps; M is step[ps i][over]."""
  texts = []
  for i, count in enumerate(counts):
    ps, own_mb = step[f"ps {i}"], 3 * count * DIM * 4 / 2**20
    texts.append(f"ps {i} peak {ps['peak_mb']:,.0f} MB = {ps['peak_mb'] / ps[over]:.2f}x "
                 f"({ps[over]:,.0f} MB), growth {(ps['peak_mb'] - ps['before_mb']) / own_mb:.2f}x "
                 f"its variables ({own_mb:,.0f} MB)")
  return "; ".join(texts)


def run(keys: int, tmp: str, part: str = "both", before: bool = True) -> dict:
  """The save (+ today's export), then the other exports and restores, each on a fresh cluster."""
  directory, results = os.path.join(tmp, "ckpt"), {"exports": [], "restores": []}
  serving_mb = keys * DIM * 4 / 2**20
  for how in ("read", "gathered") if before and part != "restore" else ("read",):
    r = run_trial(
        "save", {
            "keys": keys, "directory": directory, "export_dir": os.path.join(tmp, f"export_{how}"),
            "how": how, "export_too": part != "restore"
        }, tmp)
    if how == "read":
      counts = r["counts"]
      shard_mb = 3 * max(counts) * DIM * 4 / 2**20  # Rows, m and v of the larger shard.
      print(
          f"ps: {keys:,} keys x dim {DIM} (+ lazy Adam m, v) over {NUM_PS} ps "
          f"({' / '.join(f'{c:,}' for c in counts)} keys, variables up to {shard_mb:,.0f} MB a "
          f"shard), filled in {r['fill_s']:.1f} s, saved (ps_checkpoint.save) in "
          f"{r['save_s']:.1f} s", flush=True)
    if part == "restore":
      continue
    results["exports"].append(r)
    e = r["export"]
    c = e["coordinator"]
    print(
        f"ps export {how:8}: coordinator (writes) holds {c['before_mb']:,.0f} MB, peak "
        f"{c['peak_mb']:,.0f} MB, growth {(c['peak_mb'] - c['before_mb']) / serving_mb:.2f}x the "
        f"serving rows ({serving_mb:,.0f} MB); {e['seconds']:.1f} s; saved_model.pb "
        f"{r['saved_model_pb_bytes']:,} B", flush=True)
    print(f"ps export {how:8}: {_ps_text(e, 'before_mb', counts)} holding its shard", flush=True)
  for how in ("whole", "owned") if before else ("owned",):
    if part == "export":
      break
    r = run_trial("restore", {"keys": keys, "directory": directory, "how": how}, tmp)
    results["restores"].append(r)
    s = r["restore"]
    c = s["coordinator"]
    print(
        f"ps restore {how:5}: {_ps_text(s, 'after_mb', counts)} once restored; coordinator growth "
        f"{c['peak_mb'] - c['before_mb']:,.0f} MB = "
        f"{(c['peak_mb'] - c['before_mb']) / shard_mb:.2f}x a shard's variables "
        f"({shard_mb:,.0f} MB); {s['seconds']:.1f} s", flush=True)
  for what, ways in (("restore", ("owned", "whole")), ("export", ("read", "gathered"))):
    rows = {r["how"]: r[what] for r in results[what + "s"]}
    if len(rows) < 2:
      continue
    new, old = (rows[w] for w in ways)
    growth = {}
    for name in (n for n in new if n != "seconds"):
      grew = [r[name]["peak_mb"] - r[name]["before_mb"] for r in (new, old)]
      growth[name] = grew[0] / max(grew[1], 1e-9)
    print(
        f"ps {what}, {ways[0]} / {ways[1]}: peak growth " +
        ", ".join(f"{n} {g:.2f}x" for n, g in sorted(growth.items())) +
        f"; time {new['seconds'] / old['seconds']:.2f}x", flush=True)
  return results


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--keys", type=int, default=4_000_000, help="keys of the table")
  parser.add_argument("--part", choices=("restore", "export", "both"), default="both")
  parser.add_argument("--no-before", dest="before", action="store_false",
                      help="today's restore and export only, not the ones before issue #30")
  parser.add_argument("--json", help="also write the figures to this file")
  parser.add_argument("--coordinator", nargs=3, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.coordinator:
    out, kind, params = args.coordinator
    coordinator = {"save": coordinator_save, "restore": coordinator_restore}[kind]
    pathlib.Path(out).write_text(json.dumps(coordinator(**json.loads(params))))
    return 0
  onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset")
  print(
      f"bench_restore_ps: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start, "
      f"TF_ENABLE_ONEDNN_OPTS={onednn}", flush=True)
  with tempfile.TemporaryDirectory(prefix="bench_restore_ps_") as tmp:
    results = run(args.keys, tmp, args.part, args.before)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
