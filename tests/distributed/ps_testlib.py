"""A localhost ParameterServerStrategy cluster for the tests: ps + worker servers and a chief.

Each ps and worker task is `python -m mxrec_pipeline.cluster.ps_server` with its
TF_CONFIG on free localhost ports; the chief (the coordinator) runs
ps_coordinator.py. Every wait has a deadline and every process started is
killed in a `finally`.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

import distributed_testlib as lib
from mxrec_pipeline.cluster import local
from mxrec_pipeline.distributed import sharding

COORDINATOR = pathlib.Path(__file__).resolve().parent / "ps_coordinator.py"


def cluster_of(num_workers: int, num_ps: int) -> dict[str, list[str]]:
  ports = local.free_ports(1 + num_workers + num_ps)
  return {
      "chief": [f"localhost:{ports[0]}"],
      "worker": [f"localhost:{p}" for p in ports[1:1 + num_workers]],
      "ps": [f"localhost:{p}" for p in ports[1 + num_workers:]],
  }


def env_of(cluster: dict, task_type: str, index: int) -> dict:
  tf_config = json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})
  return dict(os.environ, TF_CONFIG=tf_config, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
              PYTHONPATH=os.pathsep.join([str(lib.REPO), str(COORDINATOR.parent)]))


def start(args: list[str], env: dict, log: pathlib.Path) -> subprocess.Popen:
  with open(log, "wb") as out:
    return subprocess.Popen([sys.executable, *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                            cwd=str(lib.REPO))


def start_servers(cluster: dict, logs: pathlib.Path) -> list[subprocess.Popen]:
  """Starts every ps and worker task of `cluster` (ps_server.py); returns the Popen list."""
  return [
      start(["-m", "mxrec_pipeline.cluster.ps_server"], env_of(cluster, job, i),
            logs / f"{job}{i}.log") for job in ("ps", "worker") for i in range(len(cluster[job]))
  ]


def run_chief(cluster: dict, args: list[str], logs: pathlib.Path, deadline_s: float,
              coordinator: pathlib.Path = COORDINATOR) -> tuple[int | None, str]:
  """Runs `coordinator` to its end (None: killed at the deadline); (exit code, its log)."""
  chief = start([str(coordinator), *args], env_of(cluster, "chief", 0), logs / "chief.log")
  try:
    code = lib.wait_all([chief], deadline_s)[0]
  finally:
    lib.kill_all([chief])
  return code, (logs / "chief.log").read_text(errors="replace")


def train(num_workers: int, num_ps: int, steps: int, tmp: pathlib.Path, extra=(),
          deadline_s: float = 50, coordinator: pathlib.Path = COORDINATOR) -> dict[str, np.ndarray]:
  """Trains the toy table on a local cluster (`coordinator` OUT STEPS *extra); what it wrote.

  Logs and out.npz go to `tmp` (created).
  """
  tmp.mkdir(parents=True, exist_ok=True)
  cluster = cluster_of(num_workers, num_ps)
  servers = start_servers(cluster, tmp)
  try:
    code, log = run_chief(cluster, [str(tmp / "out.npz"), str(steps), *extra], tmp, deadline_s,
                          coordinator)
  finally:
    lib.kill_all(servers)
  if code != 0:
    tails = "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-2000:]}"
                      for p in sorted(tmp.glob("*.log")) if p.name != "chief.log")
    raise AssertionError(f"the chief failed or hung (exit {code}):\n{log[-4000:]}\n{tails}")
  return dict(np.load(tmp / "out.npz"))


API_COORDINATOR = COORDINATOR.parent / "ps_api_coordinator.py"


def rows_by_key(out: dict, table: str, what: str = "values") -> dict[int, np.ndarray]:
  """{key: row} of `what` ("values" or a slot) over the shards of `table` in OUT.npz.

  OUT.npz of ps_api_coordinator.py; asserts every key sits on its owner ps.
  """
  num_shards = int(out[f"{table}/num_shards"])
  got = {}
  for i in range(num_shards):
    keys = out[f"{table}/shard{i}_keys"]
    np.testing.assert_array_equal(
        sharding.owner_numpy(keys, num_shards), i,
        err_msg=f"a key of table {table} on ps {i} is owned by another ps")
    got.update(lib.by_key(keys, out[f"{table}/shard{i}_{what}"]))
  return got
