"""Two worker processes share one study on a real PostgreSQL server.

The test makes its own cluster (initdb, pg_ctl; as the `postgres` user when
run as root, since both refuse root) in a temporary directory, listening on a
loopback port, and removes it after. Locally the test is skipped when
PostgreSQL's binaries are missing; under CI (CI=true) it fails instead
(`make test` installs Debian's postgresql package).
"""

import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile

import optuna
import pytest

import sweep_testlib as lib
from mxrec_pipeline.sweep import storage as storage_lib
from mxrec_pipeline.sweep import worker as worker_lib

# Starts a PostgreSQL server; two worker processes train trials of one study.
pytestmark = [pytest.mark.postgres, pytest.mark.cluster, pytest.mark.slow]

N_TRIALS = 3


def _postgres_bin() -> str | None:
  found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
  return os.path.dirname(found[-1]) if found else None


def _free_loopback_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture
def postgres_url():
  """URL of a fresh PostgreSQL cluster on 127.0.0.1, removed after the test."""
  bin_dir = _postgres_bin()
  if bin_dir is None:
    message = ("PostgreSQL binaries not found (/usr/lib/postgresql/*/bin/initdb): "
               "apt-get install postgresql, or run `make test`")
    if os.environ.get("CI") == "true":
      pytest.fail(message)
    pytest.skip(message)
  as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
  # Under /tmp (world-traversable), not $TMPDIR, which the server user may not reach.
  base = tempfile.mkdtemp(prefix="mxrec-pg-", dir="/tmp" if os.path.isdir("/tmp") else None)
  os.chmod(base, 0o755)  # The server's user must reach its data dir and socket dir.
  if as_postgres:
    shutil.chown(base, "postgres", "postgres")
  data = os.path.join(base, "data")
  port = _free_loopback_port()
  pg_ctl = [*as_postgres, os.path.join(bin_dir, "pg_ctl"), "-D", data]
  try:
    subprocess.run([
        *as_postgres,
        os.path.join(bin_dir, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
        "--encoding=UTF8", "--no-sync"
    ], check=True, capture_output=True)
    subprocess.run([
        *pg_ctl, "-l",
        os.path.join(base, "server.log"), "-w", "-t", "120", "-o",
        f"-p {port} -k {base} -c listen_addresses=127.0.0.1", "start"
    ], check=True, capture_output=True)
    yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
  finally:
    subprocess.run([*pg_ctl, "-m", "immediate", "-w", "stop"], capture_output=True, check=False)
    shutil.rmtree(base, ignore_errors=True)


def test_two_workers_share_a_postgres_study(tmp_path, postgres_url):
  path = lib.write_config(tmp_path, "shared", pruner={"name": "none"})
  result = lib.run_sweep(path, "--n-trials", N_TRIALS, "--n-jobs", 2, "--storage", postgres_url)
  assert result.returncode == 0, result.stderr[-3000:]
  study = lib.load_study(postgres_url, "shared")
  trials = study.get_trials()
  # All complete, none ran twice: N trials, each in its own dir, run by one process once.
  assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * N_TRIALS
  assert [t.number for t in trials] == list(range(N_TRIALS))
  dirs = [t.user_attrs[worker_lib.MODEL_DIR_ATTR] for t in trials]
  assert sorted(os.listdir(tmp_path / "shared" / worker_lib.TRIALS_DIR)) == sorted(
      os.path.basename(d) for d in dirs)
  for trial, model_dir in zip(trials, dirs):
    with open(os.path.join(model_dir, "trial.json"), encoding="utf-8") as f:
      assert json.load(f)["number"] == trial.number
    with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
      assert json.load(f)["model"]["ndcg@10"] == pytest.approx(trial.value)
  assert len({t.user_attrs[worker_lib.PID_ATTR] for t in trials}) == N_TRIALS
  # Both workers ran trials of the one study.
  assert {t.user_attrs[storage_lib.WORKER_ATTR]["index"] for t in trials} == {0, 1}
  assert "best: trial" in result.stdout
