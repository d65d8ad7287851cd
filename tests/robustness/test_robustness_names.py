"""The dense optimizer and loss reduction names PipelineHparams accepts are Keras's."""

import pytest
import tensorflow as tf

from mxrec_pipeline import hparams


def test_loss_reductions_are_keras():
  assert set(hparams.LOSS_REDUCTIONS) == set(tf.keras.losses.Reduction.all())


@pytest.mark.parametrize("name", [*hparams.DENSE_OPTIMIZERS, "Adam", "RMSprop"])
def test_every_accepted_optimizer_name_resolves(name):
  optimizer = tf.keras.optimizers.get({"class_name": name, "config": {"learning_rate": 0.1}})
  assert callable(optimizer.apply_gradients)  # Resolved (Keras raises otherwise).


@pytest.mark.parametrize("name, message", [
    ("adamm", r"`optimizer` must be one of \['adadelta', .*'sgd'\].*got 'adamm'"),
    ("", r"`optimizer` must be one of"),
])
def test_unknown_optimizer_names_are_refused(name, message):
  with pytest.raises(ValueError, match=message):
    hparams.PipelineHparams(model_dir="/x", optimizer=name)


def test_registered_custom_optimizer_names_are_left_to_keras():
  assert hparams.PipelineHparams(model_dir="/x", optimizer="my_package>MyOptimizer")


@pytest.mark.parametrize("field", ["learning_rate", "sparse_learning_rate"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1.0, 0.0])
def test_learning_rates_must_be_finite_and_positive(field, value):
  with pytest.raises(ValueError, match=f"`{field}` must be a finite positive number"):
    hparams.PipelineHparams(model_dir="/x", **{field: value})
