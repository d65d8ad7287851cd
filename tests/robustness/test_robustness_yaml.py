"""UniqueKeyLoader, the config file reader and storage URLs, in process (no TensorFlow)."""

import pytest
import yaml

from mxrec_pipeline.sweep import storage as storage_lib
from mxrec_pipeline.util import yaml_io


@pytest.mark.parametrize("text, message", [
    ("a: 1\nb: 2\na: 3\n", "duplicate key 'a' (lines 1 and 3)"),
    ("s:\n  k: 1\n  k: 2\n", "duplicate key 'k' (lines 2 and 3)"),
    ("{a: 1, a: 2}", "duplicate key 'a' (twice on line 1)"),
    ("- {x: 1}\n- x: 1\n  x: 2\n", "duplicate key 'x' (lines 2 and 3)"),
    ("1: a\n1: b\n", "duplicate key 1 (lines 1 and 2)"),
])
def test_repeated_keys_are_refused(text, message):
  with pytest.raises(yaml_io.DuplicateKeyError) as raised:
    yaml_io.safe_load(text)
  assert yaml_io.one_line(raised.value) == message + ": remove one of them"


def test_merge_keys_may_be_overridden():
  assert yaml_io.safe_load("base: &b {a: 1, c: 3}\nx:\n  <<: *b\n  a: 2\n")["x"] == {"a": 2, "c": 3}


def test_same_values_as_safe_load_otherwise():
  text = "a: [1, 2.5, .inf]\nb: {c: null, d: 'x'}\ne: 2024-01-01\n"
  assert yaml_io.safe_load(text) == yaml.safe_load(text)


@pytest.mark.parametrize("data, message", [
    (b"a: 1\nb: caf\xe9\n", r"config .*bad.yaml is not UTF-8 text: byte 0xe9 on line 2"),
    (b"a: [1\n", r"config .*bad.yaml is not valid YAML: while parsing a flow sequence: "
     r"expected ',' or '\]', but got '<stream end>' at line 2, column 1$"),
    (b"a: 1\na: 2\n", r"config .*bad.yaml is not valid YAML: duplicate key 'a' \(lines 1 and 2\)"),
    (b"- 1\n", r"config .*bad.yaml must be a mapping$"),
])
def test_load_yaml_mapping_names_the_file(tmp_path, data, message):
  path = tmp_path / "bad.yaml"
  path.write_bytes(data)
  with pytest.raises(ValueError, match=message):
    yaml_io.load_yaml_mapping(str(path), ValueError, "config", "a mapping")


@pytest.mark.parametrize("url, resolved", [
    ("postgresql://u:p@h:5/d", "postgresql+psycopg2://u:p@h:5/d"),
    ("postgresql+psycopg2://u@h/d", "postgresql+psycopg2://u@h/d"),
    ("mysql+pymysql://u@h/d", "mysql+pymysql://u@h/d"),
    ("sqlite:////tmp/s.db", "sqlite:////tmp/s.db"),
])
def test_bare_postgresql_urls_use_psycopg2(url, resolved):
  assert storage_lib.resolve_url(url) == resolved


def test_printable_urls_mask_the_password():
  assert storage_lib.printable("postgresql://u:secret@h/d") == "postgresql://u:***@h/d"
