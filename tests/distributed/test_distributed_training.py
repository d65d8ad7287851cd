"""2 workers (MultiWorkerMirroredStrategy, real processes) == one process on the global batch.

Each worker trains its half of every global batch with a ShardedTable; the
workers' losses, their shards' rows (by key) and the mirrored dense weights
must equal one process training the whole batches with a plain table, for
every hash optimizer. Also checks the bytes each worker counted against the
batches' distinct ids.
"""

import numpy as np
import pytest

import distributed_testlib as lib
from mxrec_pipeline.distributed import sharding

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS = 4


def _train(tmp_path, optimizer_key, num_workers=2, extra=()):
  args = [[
      "--optimizer", optimizer_key, "--steps",
      str(STEPS), "--out",
      str(tmp_path / f"out{i}.npz"), *extra
  ] for i in range(num_workers)]
  lib.run_cluster(num_workers, args, tmp_path)
  return [np.load(tmp_path / f"out{i}.npz") for i in range(num_workers)]


@pytest.mark.parametrize("optimizer_key", sorted(lib.OPTIMIZERS))
def test_two_workers_equal_one_process(tmp_path, optimizer_key):
  outs = _train(tmp_path, optimizer_key)
  want = lib.reference_run(optimizer_key, STEPS)
  _check_equal(outs, want)
  if optimizer_key == "lazy_adam":
    _check_bytes(outs)


def test_two_workers_equal_one_process_with_admission(tmp_path):
  # Keys need 3 sightings over all workers' batches: some are seen by both
  # workers before either alone saw them 3 times.
  outs = _train(tmp_path, "lazy_adam", extra=["--access_threshold", "3"])
  want = lib.reference_run("lazy_adam", STEPS, access_threshold=3)
  assert 0 < len(want["keys"]) < len(
      np.unique(np.concatenate([lib.batch(s)[0] for s in range(STEPS)])))
  _check_equal(outs, want)


@pytest.mark.parametrize("access_threshold", [None, 3])
def test_all_to_all_routing_equals_one_process(tmp_path, access_threshold):
  extra = ["--routing", "all_to_all"]
  if access_threshold is not None:
    extra += ["--access_threshold", str(access_threshold)]
  outs = _train(tmp_path, "lazy_adam", extra=extra)
  _check_equal(outs, lib.reference_run("lazy_adam", STEPS, access_threshold=access_threshold))
  _check_all_to_all_bytes(outs, weighted=access_threshold is not None)


def test_four_workers_all_to_all_equal_one_process(tmp_path):
  # Four owners: chunks to and from every pair of workers; a new group key every
  # 3 lookups (as every ~11M lookups), so steps use two groups.
  outs = _train(tmp_path, "lazy_adam", num_workers=4,
                extra=["--routing", "all_to_all", "--lookups_per_group", "3"])
  _check_equal(outs, lib.reference_run("lazy_adam", STEPS))
  _check_all_to_all_bytes(outs, weighted=False)


def test_two_tables_with_both_routings(tmp_path):
  # Two tables in one step: their collectives (and all-to-all instance keys)
  # must not mix.
  outs = _train(tmp_path, "lazy_adam", extra=["--second_table_routing", "all_to_all"])
  want = lib.reference_run("lazy_adam", STEPS, second_table=True)
  _check_equal(outs, want)
  got = {}
  for shard, out in enumerate(outs):
    np.testing.assert_array_equal(sharding.owner_numpy(out["keys2"], 2), shard)
    got.update(lib.by_key(out["keys2"], out["rows2"]))
  lib.assert_rows_equal(got, lib.by_key(want["keys2"], want["rows2"]))


@pytest.mark.parametrize("num_workers", [2, 4])
def test_two_tables_in_one_all_to_all_exchange(tmp_path, num_workers):
  # Both tables' lookups in one lookup_tables call: one exchange of rows 4 and 8 wide, the first
  # table's keys with their admission counts, the second's without.
  outs = _train(
      tmp_path, "lazy_adam", num_workers=num_workers, extra=[
          "--routing", "all_to_all", "--second_table_routing", "all_to_all", "--grouped",
          "--access_threshold", "3"
      ])
  want = lib.reference_run("lazy_adam", STEPS, second_table=True, access_threshold=3)
  _check_equal(outs, want)
  got = {}
  for shard, out in enumerate(outs):
    np.testing.assert_array_equal(sharding.owner_numpy(out["keys2"], num_workers), shard)
    got.update(lib.by_key(out["keys2"], out["rows2"]))
  lib.assert_rows_equal(got, lib.by_key(want["keys2"], want["rows2"]))
  _check_grouped_bytes(outs)


def test_two_workers_equal_one_process_with_eviction(tmp_path):
  # Batches 6 s apart; keys unseen for 2 batches (12 s > 10 s) are evicted.
  outs = _train(tmp_path, "lazy_adam", extra=["--eviction_threshold_s", "10"])
  want = lib.reference_run("lazy_adam", STEPS, eviction_threshold_s=10)
  seen = np.unique(np.concatenate([lib.batch(s)[0].ravel() for s in range(STEPS)]))
  assert 0 < len(want["keys"]) < len(seen)
  _check_equal(outs, want)


def _check_equal(outs, want):
  got = {}
  for shard, out in enumerate(outs):
    assert int(out["shard"]) == shard
    np.testing.assert_allclose(out["losses"], want["losses"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["w"], want["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["b"], want["b"], rtol=1e-5, atol=1e-6)
    # Each shard holds exactly the keys it owns.
    np.testing.assert_array_equal(sharding.owner_numpy(out["keys"], len(outs)), shard)
    got.update(lib.by_key(out["keys"], out["rows"]))
  reference = lib.by_key(want["keys"], want["rows"])
  lib.assert_rows_equal(got, reference)
  # Evaluation lookups read every trained key from its owner, the default otherwise.
  for out in outs:
    ids = out["eval_ids"].ravel()
    emb = out["eval_emb"].reshape(ids.size, lib.DIM)
    want_emb = [reference.get(int(i), np.full(lib.DIM, lib.EVAL_DEFAULT)) for i in ids]
    assert sum(int(i) in reference for i in ids) >= 3
    np.testing.assert_allclose(emb, want_emb, rtol=1e-5, atol=1e-6)


def _check_bytes(outs):
  """Counted bytes == the collectives' payload computed from the batches' distinct ids."""
  ids_bytes = rows_bytes = grad_bytes = 0
  workers, row_bytes = 2, lib.DIM * 4
  for step in range(STEPS):
    counts = [np.unique(lib.worker_slice(step, w, workers)[0]).size for w in range(workers)]
    ids_bytes += workers * max(counts) * 8 + 2 * workers * 4
    rows_bytes += workers * max(counts) * row_bytes
    grad_bytes += sum(counts) * row_bytes + workers * 4
  for out in outs:
    np.testing.assert_array_equal(out["bytes"], [ids_bytes, rows_bytes, grad_bytes])


def _check_grouped_bytes(outs):
  """The group's bytes (on the first table): W chunks of the largest count M of both tables'
  keys (key and weight: 16 B each, after a count per table) and of the largest value count V."""
  ids_bytes = rows_bytes = 0
  workers = len(outs)
  for step in range(STEPS):
    chunk = width = 0
    for w in range(workers):
      ids = lib.worker_slice(step, w, workers)[0]
      first = sharding.owner_numpy(np.unique(ids), workers)
      second = sharding.owner_numpy(np.unique(lib.second_table_ids(ids)), workers)
      counts = np.bincount(first, minlength=workers) + np.bincount(second, minlength=workers)
      values = (np.bincount(first, minlength=workers) * lib.DIM +
                np.bincount(second, minlength=workers) * lib.SECOND_DIM)
      chunk, width = max(chunk, counts.max()), max(width, values.max())
    ids_bytes += workers * (chunk + 2) * 8 * 2 + 2 * 4
    rows_bytes += workers * width * 4
  for out in outs:
    np.testing.assert_array_equal(out["bytes"], [ids_bytes, rows_bytes, rows_bytes])


def _check_all_to_all_bytes(outs, weighted):
  """Counted bytes == W chunks of the largest worker-to-owner count M (+ its count), per step."""
  ids_bytes = rows_bytes = 0
  workers, row_bytes = len(outs), lib.DIM * 4
  for step in range(STEPS):
    chunk = 0
    for w in range(workers):
      owners = sharding.owner_numpy(np.unique(lib.worker_slice(step, w, workers)[0]), workers)
      chunk = max(chunk, np.bincount(owners, minlength=workers).max())
    ids_bytes += workers * (chunk + 1) * 8 * (2 if weighted else 1) + 4
    rows_bytes += workers * chunk * row_bytes
  for out in outs:
    np.testing.assert_array_equal(out["bytes"], [ids_bytes, rows_bytes, rows_bytes])
