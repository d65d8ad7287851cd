"""Tables sharded by key over tasks: MultiWorkerMirroredStrategy workers or ps tasks.

The single-process modules (core, optimizers) know nothing of sharding; this
package wraps them, as TorchRec keeps `distributed/` apart from `modules/`.
Over workers (MultiWorkerMirroredStrategy): `sharding` (the owner of a key),
`exchange` and `all_to_all` (one step's routing of ids, rows and gradients with
all-gather or all-to-all collectives), `sharded_table` (a table split row-wise
over the workers), `checkpoint` (per-shard checkpoints that restore onto any
number of shards), `export` (every shard gathered into one serving snapshot).
Over ps tasks (ParameterServerStrategy): `ps_table` (a table's shards, each on
its ps task), `ps_tiers` (their host/SSD tiers), `ps_mxrec` and `ps_embedding`
(the mx_rec and TPUEmbedding-style APIs on them), `ps_checkpoint` (their shards
saved and restored). Which placement a Keras run
uses is decided once, in keras/strategies.py. See docs/distributed.md.
"""
