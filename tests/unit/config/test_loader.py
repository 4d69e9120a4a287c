"""Strict YAML/JSON loading, --set edits and ${VAR} expansion."""

from __future__ import annotations

import pytest

from solar.config.loader import apply_sets, expand_env, parse_json, parse_set, parse_yaml, read_document
from solar.errors import ConfigError


@pytest.mark.parametrize("text, fragment", [
    ("a: 1\na: 2\n", "2: duplicate key 'a'"),
    ("a:\n  b: 1\n  b: 2\n", "duplicate key 'b'"),
    ("1: x\n", "mapping key 1 is not a string (integer)"),
    ("true: x\n", "is not a string (boolean)"),
    ("null: x\n", "is not a string (null)"),
    ("a: .nan\n", "non-finite number '.nan'"),
    ("a: [1.0, -.inf]\n", "non-finite number '-.inf'"),
    ("a: [\n", "invalid YAML"),
])
def test_yaml_rejects(text, fragment):
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "cfg.yaml")
    assert fragment in str(info.value)
    assert str(info.value).startswith("cfg.yaml")


def test_yaml_12_floats_and_no_timestamps():
    tree = parse_yaml("lr: 1e-4\nb: -2.5E3\nc: .5\nd: 2024-01-01\ne: 10\nf: '1e-4'\n")
    assert tree == {"lr": 1e-4, "b": -2500.0, "c": 0.5, "d": "2024-01-01", "e": 10, "f": "1e-4"}
    assert isinstance(tree["e"], int)


def test_yaml_anchors_still_work():
    tree = parse_yaml("base: &b {x: 1}\nother: *b\n")
    assert tree["other"] == {"x": 1}


@pytest.mark.parametrize("text, fragment", [
    ('{"a": 1, "a": 2}', "duplicate key 'a'"),
    ('{"a": NaN}', "non-finite number NaN"),
    ('{"a": Infinity}', "non-finite number Infinity"),
    ('{"a": ', "invalid JSON"),
])
def test_json_rejects(text, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_json(text, "cfg.json")


def test_read_document_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        read_document(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        read_document(tmp_path)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="the document is a list"):
        read_document(tmp_path / "list.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ConfigError, match="the document is empty"):
        read_document(tmp_path / "empty.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"a: \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_document(tmp_path / "bin.yaml")
    raw, tree = read_document(_write(tmp_path / "ok.json", '{"a": [1, 2]}'))
    assert tree == {"a": [1, 2]} and raw == b'{"a": [1, 2]}'


def _write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("item, expected", [
    ("train.max_steps=8", (["train", "max_steps"], 8)),
    ("a.b=true", (["a", "b"], True)),
    ("a=[1,2]", (["a"], [1, 2])),
    ("a={x: 1}", (["a"], {"x": 1})),
    ("a=1e-4", (["a"], 1e-4)),
    ("a='8'", (["a"], "8")),
    ("a=x=y", (["a"], "x=y")),
    ("a=", (["a"], None)),
    ("a=/path/to/x", (["a"], "/path/to/x")),
])
def test_parse_set(item, expected):
    assert parse_set(item) == expected


@pytest.mark.parametrize("item, fragment", [
    ("novalue", "expected KEY=VALUE"),
    ("=3", "expected KEY=VALUE"),
    ("a..b=1", "empty segment"),
    ("a=.nan", "non-finite"),
    ("a={x: 1, x: 2}", "duplicate key 'x'"),
])
def test_parse_set_rejects(item, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_set(item)


def test_apply_sets_creates_mappings_and_keeps_input():
    tree = {"train": {"max_steps": 1}}
    out = apply_sets(tree, ["train.max_steps=5", "model.dims.num_heads=8", "train.max_steps=6"])
    assert out == {"train": {"max_steps": 6}, "model": {"dims": {"num_heads": 8}}}
    assert tree == {"train": {"max_steps": 1}}


def test_apply_sets_through_non_mapping():
    with pytest.raises(ConfigError, match=r"model.family is a string, not a mapping"):
        apply_sets({"model": {"family": "x"}}, ["model.family.sub=1"])
    with pytest.raises(ConfigError, match=r"validation.passes is a list"):
        apply_sets({"validation": {"passes": []}}, ["validation.passes.0=1"])


def test_expand_env():
    env = {"ROOT": "/data", "N": "3"}
    tree = {"a": "${ROOT}/x", "b": ["${N}", 5], "c": "cost $$5", "d": "$notavar"}
    assert expand_env(tree, env) == {"a": "/data/x", "b": ["3", 5], "c": "cost $5", "d": "$notavar"}
    with pytest.raises(ConfigError, match=r"data.root: environment variable \$\{MISSING\} is not set"):
        expand_env({"data": {"root": "${MISSING}"}}, env)
