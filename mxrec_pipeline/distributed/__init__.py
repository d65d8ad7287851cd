"""Tables sharded by key over tasks: MultiWorkerMirroredStrategy workers or ps tasks.

The single-process modules (core, optimizers) know nothing of sharding; this
package composes sharded tables of their shards, as TorchRec keeps
`distributed/` apart from `modules/`. Every table follows one protocol
(core/table_protocol.py), so `checkpoint` (per-shard bundles that restore onto
any number of shards) and `export` (the stock-TF serving snapshot) serve every
placement. Over workers: `sharding` (the owner of a key), `exchange` and
`all_to_all` (one step's routing of ids, rows and gradients with all-gather or
all-to-all collectives), `sharded_table` (a core table per worker plus the
routing). Over ps tasks: `ps_table` (a `PSShard` per ps task), `ps_tiers`
(their host/SSD tiers), `ps_mxrec` and `ps_embedding` (the mx_rec and
TPUEmbedding-style APIs on them), `ps_checkpoint` (save/restore/snapshot of
every shard from the coordinator). Which placement a run uses is decided once,
in core/placement.table_placement. See docs/distributed.md.
"""
