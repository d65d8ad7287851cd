"""Tests of init() / terminate_config_initializer() and what needs a run."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.core import key_index
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec
from mxrec_pipeline.core.asc.helper import get_asc_insert_func
from mxrec_pipeline.util import initialize
from mxrec_pipeline.util.initialize import init, terminate_config_initializer

STEP_KWARGS = ["train_steps", "eval_steps", "save_steps", "max_steps"]
BOOL_KWARGS = ["use_dynamic", "use_dynamic_expansion", "if_load", "use_mpi"]
MAX = 2**31 - 1


def test_defaults_are_mxrec_defaults():
  config = init().config
  assert [getattr(config, k) for k in STEP_KWARGS] == [-1, -1, -1, -1]
  assert config.use_dynamic is True
  assert config.use_dynamic_expansion is False
  assert config.if_load is False


@pytest.mark.parametrize("kwarg", STEP_KWARGS)
@pytest.mark.parametrize("value", [-1, 1, 100, MAX])
def test_step_kwargs_accept_range(kwarg, value):
  # eval_steps needs train_steps (the steps between two evaluations).
  extra = {"train_steps": 1} if kwarg == "eval_steps" and value != -1 else {}
  assert getattr(init(**{kwarg: value}, **extra).config, kwarg) == value


def test_mismatched_step_counts_raise():
  with pytest.raises(ValueError, match="`eval_steps`=10 needs `train_steps`"):
    init(eval_steps=10)
  with pytest.raises(ValueError, match="`train_steps`=200 exceeds `max_steps`=100"):
    init(train_steps=200, max_steps=100)
  with pytest.raises(ValueError, match="`save_steps`=200 exceeds `max_steps`=100"):
    init(save_steps=200, max_steps=100)


def test_numpy_integer_steps_are_kept_as_ints():
  config = init(train_steps=np.int64(100), max_steps=np.int32(-1)).config
  assert config.train_steps == 100 and type(config.train_steps) is int
  assert config.max_steps == -1 and type(config.max_steps) is int


@pytest.mark.parametrize("kwarg", STEP_KWARGS)
@pytest.mark.parametrize("value, error, message", [
    (0, ValueError, r"must be -1 \(no limit\) or positive, got 0"),
    (-2, ValueError, r"must be in \[-1, 2147483647\], got -2"),
    (MAX + 1, ValueError, r"must be in \[-1, 2147483647\], got 2147483648"),
    (True, TypeError, r"must be an int, got True"),
    (1.0, TypeError, r"must be an int, got 1.0"),
    ("10", TypeError, r"must be an int, got '10'"),
])
def test_step_kwargs_reject(kwarg, value, error, message):
  with pytest.raises(error, match=rf"`{kwarg}` {message}"):
    init(**{kwarg: value})
  assert not initialize.is_initialized()
  init()  # A rejected init() leaves no run behind.


@pytest.mark.parametrize("kwarg", BOOL_KWARGS)
def test_bool_kwargs_are_typed(kwarg):
  assert getattr(init(**{kwarg: kwarg != "use_dynamic_expansion"}).config,
                 kwarg) is (kwarg != "use_dynamic_expansion")
  terminate_config_initializer()
  with pytest.raises(TypeError, match=rf"`{kwarg}` must be a bool, got 1"):
    init(**{kwarg: 1})
  with pytest.raises(TypeError, match=rf"`{kwarg}` must be a bool, got 'yes'"):
    init(**{kwarg: "yes"})


def test_unknown_kwargs_are_named():
  with pytest.raises(TypeError, match=r"unknown arguments \['bogus', 'trian_steps'\]"):
    init(train_steps=1, trian_steps=2, bogus=3)
  assert not initialize.is_initialized()


def test_second_init_without_terminate_raises():
  first = init(train_steps=5)
  with pytest.raises(RuntimeError, match=r"already called; call terminate_config_initializer"):
    init(train_steps=6)
  assert initialize.get_config_initializer() is first


def test_terminate_is_idempotent_and_allows_a_new_run():
  terminate_config_initializer()  # Before any init().
  first = init()
  terminate_config_initializer()
  terminate_config_initializer()
  assert not initialize.is_initialized()
  second = init()
  assert second is not first
  assert second.container != first.container  # Tables of the first run cannot leak.
  assert second.tables == {}


def test_terminate_frees_the_eager_key_indexes():
  init()
  table = embedding.create_table(**_table_args())
  handle = table.key_index.resource_handle
  key_index.insert(handle, tf.constant([1, 2], tf.int64), training=True)
  terminate_config_initializer()
  with pytest.raises(tf.errors.FailedPreconditionError,
                     match=r"the key index of table 't' does not exist"):
    key_index.insert(handle, tf.constant([1], tf.int64), training=True)
  terminate_config_initializer()
  # A new run's table of the same name starts empty.
  init()
  assert embedding.create_table(**_table_args()).key_index.size().numpy() == 0


def test_terminate_leaves_graph_tables_to_their_session():
  with tf.Graph().as_default():
    init()
    table = embedding.create_table(**_table_args())
    size = table.key_index.size()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(table.key_index.insert(tf.constant([4, 5], tf.int64), training=True))
      terminate_config_initializer()
      assert sess.run(size) == 2


def _table_args():
  return dict(key_dtype=tf.int64, dim=2, name="t", device_vocabulary_size=4,
              emb_initializer=tf.zeros_initializer())


def test_create_table_before_init_raises():
  with pytest.raises(RuntimeError, match=r"not initialized: call .*init\(\)"):
    embedding.create_table(**_table_args())


def test_get_asc_insert_func_before_init_raises():
  with pytest.raises(RuntimeError, match=r"not initialized: call .*init\(\)"):
    get_asc_insert_func([FeatureSpec("t")], is_training=True)


def test_sparse_lookup_before_init_and_after_terminate_raises():
  with pytest.raises(RuntimeError, match=r"not initialized: call .*init\(\)"):
    embedding.sparse_lookup(None, tf.constant([1], tf.int64))
  init()
  table = embedding.create_table(**_table_args())
  terminate_config_initializer()
  with pytest.raises(RuntimeError, match=r"not initialized"):
    embedding.sparse_lookup(table, tf.constant([1], tf.int64))
  init()
  with pytest.raises(RuntimeError, match=r"table 't' belongs to an earlier init\(\)"):
    embedding.sparse_lookup(table, tf.constant([1], tf.int64))
