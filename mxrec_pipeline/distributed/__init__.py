"""Tables sharded by key over the workers of a MultiWorkerMirroredStrategy.

The single-process modules (core, optimizers) know nothing of sharding; this
package wraps them, as TorchRec keeps `distributed/` apart from `modules/`:
`sharding` (the owner of a key), `exchange` and `all_to_all` (one step's
routing of ids, rows and gradients with TF's all-gather or all-to-all
collectives), `sharded_table` (a table whose rows are split row-wise over the
workers), `checkpoint` (per-shard checkpoints that restore onto any number of
shards) and `export` (every shard gathered into one serving snapshot).
See docs/distributed.md.
"""
