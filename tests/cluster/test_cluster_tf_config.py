"""TF_CONFIG parsing and validation (mxrec_pipeline/cluster/tf_config.py), without TensorFlow."""

import json

import pytest

from mxrec_pipeline.cluster import tf_config

CLUSTER = {"worker": ["host0:2222", "host1:2222", "host2:2222"]}


def _text(cluster=None, task=None, **extra) -> str:
  return json.dumps({
      "cluster": CLUSTER if cluster is None else cluster,
      "task": {"type": "worker", "index": 1} if task is None else task, **extra
  })


def test_parse_workers_only_chief_is_worker_0():
  config = tf_config.parse(_text())
  assert config.cluster == {"worker": ("host0:2222", "host1:2222", "host2:2222")}
  assert (config.task_type, config.task_index, config.task_name) == ("worker", 1, "worker 1")
  assert config.chief == ("worker", 0) and not config.is_chief
  assert config.num_workers == 3 and config.rpc_layer == "grpc"
  assert tf_config.parse(_text(task={"type": "worker", "index": 0})).is_chief


def test_chief_task_is_the_chief_and_counts_as_a_worker():
  cluster = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"]}
  assert tf_config.parse(_text(cluster, {"type": "chief", "index": 0})).is_chief
  worker0 = tf_config.parse(_text(cluster, {"type": "worker", "index": 0}))
  assert worker0.chief == ("chief", 0) and not worker0.is_chief
  assert worker0.num_workers == 3  # chief + 2 workers; ps tasks do not train in lockstep.


def test_to_json_round_trips():
  config = tf_config.parse(_text())
  assert tf_config.parse(config.to_json()) == config


def test_from_environment():
  assert tf_config.from_environment({}) is None
  assert tf_config.from_environment({"TF_CONFIG": "  "}) is None
  assert tf_config.from_environment({"TF_CONFIG": _text()}).task_index == 1


def test_peers_named_in_a_tf_error():
  config = tf_config.parse(_text())
  text = ("Collective ops is aborted by: Error reported from /job:worker/task:2: Task "
          "/job:worker/replica:0/task:2 heartbeat timeout; on /job:worker/replica:0/task:1 "
          "from /job:worker/replica:0/task:0")
  assert config.peers_named_in(text) == ["worker 2", "worker 0"]
  assert config.peers_named_in("Connection reset by peer") == []


@pytest.mark.parametrize("text, message", [
    ("{", "TF_CONFIG is not valid JSON"),
    ("[1]", "must be a JSON object with 'cluster' and 'task', got list"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), "TF_CONFIG has no 'cluster'"),
    (json.dumps({"cluster": CLUSTER}), "TF_CONFIG has no 'task'"),
    (_text(cluster={}), r"TF_CONFIG\['cluster'\] must be a non-empty object"),
    (_text(cluster={"workers": ["h:1"]}), "unknown job 'workers'; known:"),
    (_text(cluster={"worker": "h:1"}), r"\['worker'\] must be a non-empty list"),
    (_text(cluster={"worker": []}), r"\['worker'\] must be a non-empty list"),
    (_text(cluster={"worker": ["h:1", "h"]}), r"\['worker'\]\[1\] \(worker 1\): expected "
     "'host:port'"),
    (_text(cluster={"worker": ["h:1", "h:99999"]}), "port in 1..65535, got 'h:99999'"),
    (_text(cluster={"worker": ["h:1", 7]}), "got 7"),
    (_text(cluster={"worker": ["h:1", "h:1"]}), r"address h:1 is also worker 0"),
    (_text(cluster={"chief": ["a:1", "b:1"], "worker": ["c:1"]},
           task={"type": "worker", "index": 0}), "at most one chief"),
    (_text(cluster={"ps": ["p:1"]}, task={"type": "ps", "index": 0}), "no 'chief' or 'worker' job"),
    (_text(task=[1]), r"TF_CONFIG\['task'\] must be an object"),
    (_text(task={"index": 0}), r"TF_CONFIG\['task'\] has no 'type'"),
    (_text(task={"type": "worker"}), r"TF_CONFIG\['task'\] has no 'index'"),
    (_text(task={"type": "chief", "index": 0}), r"'chief', not a job of the cluster \['worker'\]"),
    (_text(task={"type": "worker", "index": "1"}), r"\['index'\] must be an int, got '1'"),
    (_text(task={"type": "worker", "index": True}), "must be an int, got True"),
    (_text(task={"type": "worker", "index": 3}), r"is worker 3, but the cluster has 3 'worker' "
     r"task\(s\) \(indexes 0..2\)"),
    (_text(task={"type": "worker", "index": -1}), "is worker -1, but the cluster has 3"),
    (_text(rpc_layer=""), r"TF_CONFIG\['rpc_layer'\] must be a non-empty string"),
])
def test_bad_tf_config_names_the_culprit(text, message):
  with pytest.raises(tf_config.TFConfigError, match=message):
    tf_config.parse(text)
