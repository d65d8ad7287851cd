"""How a cluster gets a sidecar evaluator (mxrec_pipeline/sidecar.py), and its config checks.

The TF_CONFIG of an evaluator outside the cluster, `--local-cluster
...,evaluator=1`, the config checks: no TensorFlow server. The evaluator
itself, in one process and in a whole local cluster, is tested in
test_cluster_ps_training.py (on its one-process run).
"""

import pytest

import cluster_testlib as lib
from mxrec_pipeline import cli
from mxrec_pipeline import config as config_lib
from mxrec_pipeline import hparams as hparams_lib
from mxrec_pipeline import jobs
from mxrec_pipeline.cluster import local
from mxrec_pipeline.cluster import tf_config


def test_evaluator_task_outside_the_cluster_is_parsed():
  cluster = {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]}
  parsed = tf_config.parse(tf_config.dumps(cluster, "evaluator", 0))
  assert parsed.is_evaluator and not parsed.is_chief and parsed.task_name == "evaluator 0"
  with pytest.raises(tf_config.TFConfigError, match="an evaluator outside the cluster is "
                     "evaluator 0"):
    tf_config.parse(tf_config.dumps(cluster, "evaluator", 1))


def test_local_cluster_evaluator_runs_outside_the_training_cluster():
  spec = local.parse_spec("workers=1,ps=1,evaluator=1")
  assert spec.tasks() == [("chief", 0), ("worker", 0), ("ps", 0), ("evaluator", 0)]
  configs = [tf_config.parse(text) for text in local.cluster_tf_configs(spec)]
  assert all("evaluator" not in c.cluster for c in configs)
  assert configs[-1].is_evaluator and configs[-1].cluster == configs[0].cluster
  with pytest.raises(local.LocalClusterError, match="`evaluator` goes with "
                     "ParameterServerStrategy: give ps=M too"):
    local.parse_spec("workers=2,evaluator=1")
  with pytest.raises(local.LocalClusterError, match="`evaluator` must be 0 or 1, got 2"):
    local.parse_spec("workers=1,ps=1,evaluator=2")


def test_sidecar_evaluator_config_checks_name_the_keys(tmp_path, monkeypatch, capsys):
  with pytest.raises(ValueError, match="`sidecar_evaluator` needs strategy "
                     "'ParameterServerStrategy'"):
    hparams_lib.PipelineHparams(model_dir="m", sidecar_evaluator=True)
  with pytest.raises(ValueError, match="scores ranking metrics, not the loss"):
    hparams_lib.PipelineHparams(model_dir="m", strategy=hparams_lib.PARAMETER_SERVER,
                                sidecar_evaluator=True, export_best_model=True,
                                best_exporter_metric="loss")
  # An evaluator task of a config that leaves validation to the chief: refused, named.
  cluster = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}
  monkeypatch.setenv(tf_config.ENV_VAR, tf_config.dumps(cluster, "evaluator", 0))
  assert cli.main([
      "train", lib.MOVIELENS_CONFIG, "--set", f"pipeline.model_dir={tmp_path}", "--set",
      "pipeline.strategy=ParameterServerStrategy"
  ]) == 2
  assert "pipeline.sidecar_evaluator: must be true in every task" in capsys.readouterr().err
  config = config_lib.load(lib.MOVIELENS_CONFIG, [
      f"pipeline.model_dir={tmp_path}", "pipeline.strategy=ParameterServerStrategy",
      "pipeline.sidecar_evaluator=true"
  ])
  with pytest.raises(ValueError, match="this process is the cluster's evaluator task"):
    jobs.train(config)
