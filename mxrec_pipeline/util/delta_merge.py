"""A full save's per-key arrays and its deltas merged in one pass (NumPy), any checkpoint.

Used by the shard bundles' chains (distributed/delta.py) and by the mx_rec
Saver's sparse parts (saver/sparse_files.py): a delta holds the changed keys'
arrays and `deleted` (the keys eviction removed since the previous save).
Each key's last event in the chain decides: held, with that delta's arrays,
or deleted; within a delta the deletions come before the changed keys, and
every event of a delta supersedes the full save's copy of the key.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def merge(full: dict[str, np.ndarray], deltas: Sequence[dict[str, np.ndarray]],
          per_key: Sequence[str], deleted: str) -> dict[str, np.ndarray]:
  """The per-key arrays of `full` after every delta of `deltas`, in order, sorted by key.

  Args:
    full: Name -> array; "keys" [n] and the other `per_key` names [n, ...].
    deltas: Oldest first, each with the `per_key` arrays of its changed keys
      and `deleted` [d] int64.
    per_key: The names of the per-key arrays ("keys" among them).
    deleted: The name of a delta's deleted keys.

  Returns:
    Name -> array for the `per_key` names: the keys held after the last
    delta, in ascending key order, with each key's latest arrays.
  """
  if not deltas:
    order = np.argsort(full["keys"], kind="stable")
    return {n: full[n][order] for n in per_key}
  event_keys = np.concatenate([a for d in deltas for a in (d[deleted], d["keys"])])
  chain_index = np.concatenate(
      [np.full(d[deleted].size + d["keys"].size, i, np.int64) for i, d in enumerate(deltas)])
  held = np.concatenate([
      np.concatenate([np.zeros(d[deleted].size, bool),
                      np.ones(d["keys"].size, bool)]) for d in deltas
  ])
  position = np.concatenate(
      [np.concatenate([np.full(d[deleted].size, -1),
                       np.arange(d["keys"].size)]) for d in deltas])
  # Sorted by key, then chain order, then held after deleted: the last of each key decides.
  last = np.lexsort((held, chain_index, event_keys))
  is_last = np.append(event_keys[last][1:] != event_keys[last][:-1], True)
  final = last[is_last & held[last]]
  keep = ~np.isin(full["keys"], event_keys)
  merged = {}
  for name in per_key:
    parts = [full[name][keep]]
    for i, delta in enumerate(deltas):
      parts.append(delta[name][position[final[chain_index[final] == i]]])
    merged[name] = np.concatenate(parts)
  order = np.argsort(merged["keys"], kind="stable")
  return {n: a[order] for n, a in merged.items()}
