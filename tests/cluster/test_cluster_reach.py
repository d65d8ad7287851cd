"""cluster/reach.wait_for_tasks: returns when every task listens, else names the silent ones."""

import socket

import pytest

from mxrec_pipeline.cluster import reach
from mxrec_pipeline.cluster import tf_config


def _config(ps_addresses):
  return tf_config.TFConfig(cluster={"chief": ("localhost:1",), "ps": tuple(ps_addresses)},
                            task_type="chief", task_index=0)


def test_returns_when_every_task_listens():
  with socket.create_server(("localhost", 0)) as a, socket.create_server(("localhost", 0)) as b:
    reach.wait_for_tasks(_config([f"localhost:{s.getsockname()[1]}" for s in (a, b)]), timeout_s=5)


def test_names_the_unreachable_task_and_its_address():
  with socket.create_server(("localhost", 0)) as up:
    with socket.create_server(("localhost", 0)) as gone:
      dead = f"localhost:{gone.getsockname()[1]}"
    alive = f"localhost:{up.getsockname()[1]}"
    with pytest.raises(tf_config.PeerError) as error:
      reach.wait_for_tasks(_config([alive, dead]), timeout_s=0.5)
  assert f"chief 0: unreachable after 0.5 s: ps 1 ({dead})" in str(error.value)
  assert "ps 0" not in str(error.value)


def test_lost_ps_error_names_the_ps_tasks_of_the_text():
  config = _config(["localhost:2", "localhost:3"])
  text = (
      "Graph execution error: UNAVAILABLE ... remote target /job:ps/replica:0/task:1/device:CPU:0"
      " ... remote target /job:worker/replica:0/task:1 ...")
  error = reach.lost_ps_error(config, RuntimeError(text))
  assert str(error).startswith("chief 0: lost ps 1 (RuntimeError); the job cannot go on")
  assert "worker" not in str(error)
  assert reach.lost_ps_error(config, RuntimeError("/job:worker/replica:0/task:0 gone")) is None
