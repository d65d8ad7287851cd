"""A MovieLens job moved between placements through the CLI, ending as one process would.

The same command and model_dir, another placement each time: epoch 1 on one
host, epoch 2 on 2 MultiWorkerMirrored workers, epoch 3 on 2 ps tasks (one
worker, steps in schedule order), epoch 4 on one host again. Each start says
it moved the checkpoint; the run ends as an uninterrupted one-process run:
per-epoch losses, validation metrics, the export's rows of every key, and the
last checkpoint's keys, rows, lazy Adam slots and step counts by key
(docs/restarts.md "Moving between placements"). `make test-lifecycle` moves
between every pair, with Adagrad and FTRL too.
"""

import pytest

import cluster_testlib as lib

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_a_job_moved_one_host_workers_ps_one_host_ends_as_one_process(tmp_path):
  data_dir = lib.write_tiny_movielens(tmp_path / "ml")
  moved, run1 = tmp_path / "moved", tmp_path / "run1"
  chain = ["one", "workers=2", "workers=1,ps=2", "one"]
  first = lib.train_on(chain[0], tmp_path, data_dir, moved, 1)
  assert first.returncode == 0, first.stderr[-3000:]
  for epochs, (before, now) in enumerate(zip(chain, chain[1:]), start=2):
    lib.assert_moved(lib.train_on(now, tmp_path, data_dir, moved, epochs), moved, before, now,
                     epochs - 1)
  done = lib.train_on("one", tmp_path, data_dir, run1, 4)
  assert done.returncode == 0, done.stderr[-3000:]
  lib.assert_ends_as(moved, run1, epochs=4)
