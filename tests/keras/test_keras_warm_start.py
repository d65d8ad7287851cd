"""Warm start: a new config starts from an earlier run's tables (keys, rows, slots)."""

import dataclasses

import numpy as np
import pytest

import keras_testlib as lib
from mxrec_pipeline import hparams as hparams_lib
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.util import initialize

pytestmark = pytest.mark.slow


def _table_state(optimizer=None) -> dict:
  """Table name -> {key: (row values, slots)} of the current run."""
  out = {}
  for name, table in initialize.get_config_initializer().tables.items():
    keys, rows = (t.numpy() for t in table.key_index.export())
    values = table.variable.numpy()
    slots = {}
    if optimizer is not None and name in optimizer._slots:  # pylint: disable=protected-access
      slots = {s: optimizer.get_slot(name, s).numpy() for s in optimizer.slot_initial_values}
    out[name] = {}
    for key, row in zip(keys, rows):
      out[name][int(key)] = (values[row], {slot: value[row] for slot, value in slots.items()})
  return out


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A finished 2-epoch run and its tables' state."""
  tmp = tmp_path_factory.mktemp("warm_source")
  train, valid = lib.write_task(tmp)
  hparams = pipeline_lib.PipelineHparams(model_dir=str(tmp / "model"), num_epochs=2,
                                         learning_rate=0.05, seed=7)
  pipe = pipeline_lib.SimplePipeline(lib.model_builder(), lib.dataset_builder(train, valid),
                                     hparams)
  pipe.train_and_validate()
  state = _table_state(pipe.model.sparse_optimizer)
  initialize.terminate_config_initializer()
  return {"dir": tmp / "model", "train": train, "valid": valid, "state": state}


def _run(source, tmp_path, warm_start, model_builder=None, steps=1):
  hparams = pipeline_lib.PipelineHparams(model_dir=str(tmp_path / "new"), num_epochs=1,
                                         num_train_steps=steps, learning_rate=0.05, seed=3,
                                         warm_start=warm_start)
  pipe = pipeline_lib.SimplePipeline(model_builder or lib.model_builder(hidden_layer_dims=[16]),
                                     lib.dataset_builder(source["train"], source["valid"]), hparams)
  pipe.train_and_validate()
  return pipe


def test_new_model_starts_from_the_chosen_tables_keys_rows_and_slots(source, tmp_path, capsys):
  pipe = _run(source, tmp_path,
              {"from": str(source["dir"]), "tables": ["user", "item"], "slots": True})
  log = capsys.readouterr().out
  assert "warm start: table 'user' takes" in log and "ckpt-2 with slots" in log
  assert "warm start: table 'word' initialized (not among warm_start.tables)" in log
  state = _table_state(pipe.model.sparse_optimizer)
  trained_once = 0
  for name in ("user", "item"):
    before, after = source["state"][name], state[name]
    assert set(before) <= set(after), name  # Every key came over (the one step adds its own).
    for key, (values, slots) in before.items():
      if np.array_equal(values, after[key][0]):  # Not in the new run's one step: as saved.
        for slot, value in slots.items():
          np.testing.assert_array_equal(after[key][1][slot], value, err_msg=f"{name}/{slot}")
      else:
        trained_once += 1
  assert trained_once > 0  # The step trained some of them; lazy Adam left the others.
  for key, (values, _) in state["word"].items():  # Initialized (then trained), not taken.
    assert not np.array_equal(values, source["state"]["word"][key][0])
  initialize.terminate_config_initializer()


def test_rename_and_every_table_by_default(source, tmp_path, capsys):
  tables = [dataclasses.replace(lib.TABLES[1], name="item_v2"), lib.TABLES[0], lib.TABLES[2]]
  features = [
      dataclasses.replace(f, table="item_v2") if f.table == "item" else f
      for f in lib.SPARSE_FEATURES
  ]
  builder = model_lib.ModelBuilder(
      input_creator=model_lib.FeatureSpecInputCreator(lib.CONTEXT_SPEC, lib.EXAMPLE_SPEC),
      preprocessor={}, scorer=model_lib.DNNScorer(hidden_layer_dims=[8], output_units=1),
      mask_feature_name=lib.MASK, sparse_features=features, tables=tables, seed=1)
  datasets = lib.dataset_builder(source["train"], source["valid"])
  datasets.sparse_features = features
  pipe = pipeline_lib.SimplePipeline(
      builder, datasets,
      pipeline_lib.PipelineHparams(
          model_dir=str(tmp_path / "new"), num_epochs=1, num_train_steps=1, seed=3,
          warm_start={"from": str(source["dir"] / "checkpoints"), "rename": {"item": "item_v2"}}))
  pipe.train_and_validate()
  log = capsys.readouterr().out
  assert "warm start: table 'item_v2' takes 20 keys from table 'item'" in log
  assert "warm start: table 'user' takes" in log and "warm start: table 'word' takes" in log
  initialize.terminate_config_initializer()


@pytest.mark.parametrize("warm_start, message", [
    ({"from": "{dir}", "tables": ["nope"]}, r"this model has no table \['nope'\]"),
    ({"from": "{dir}/absent"}, "warm_start.from: no checkpoint at"),
])
def test_bad_warm_start_is_refused_naming_it(source, tmp_path, warm_start, message):
  warm_start = {
      k: v.format(dir=source["dir"]) if isinstance(v, str) else v for k, v in warm_start.items()
  }
  with pytest.raises((ValueError, FileNotFoundError), match=message):
    _run(source, tmp_path, warm_start)
  initialize.terminate_config_initializer()


def test_a_table_of_another_dim_is_refused(source, tmp_path):
  tables = [dataclasses.replace(lib.TABLES[0], dim=8), *lib.TABLES[1:]]
  with pytest.raises(ValueError, match=r"table 'user' of .*ckpt-2 has dim 4, table 'user' of "
                     r"this model 8"):
    _run(source, tmp_path, {"from": str(source["dir"]), "tables": ["user"]},
         model_builder=lib.model_builder(tables=tables))
  initialize.terminate_config_initializer()


@pytest.mark.parametrize("raw, message", [
    ({"tables": ["a"]}, "warm_start.from` must be a checkpoint path"),
    ({"from": "x", "table": ["a"]}, r"unknown keys \['table'\]"),
    ({"from": "x", "rename": {"a": 1}}, "warm_start.rename` must map"),
    ({"from": "x", "slots": "yes"}, "warm_start.slots` must be true or false"),
])
def test_warm_start_config_is_checked(raw, message):
  with pytest.raises(ValueError, match=message):
    hparams_lib.PipelineHparams(model_dir="m", warm_start=raw)
