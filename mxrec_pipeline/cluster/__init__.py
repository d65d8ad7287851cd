"""Multi-worker clusters: TF_CONFIG (tf_config) and a cluster of local processes (local)."""
