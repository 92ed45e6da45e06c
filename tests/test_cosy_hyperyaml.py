from pathlib import Path

import pytest

from cosyvoice.hyperyaml import HyperYamlError, NodeReader, Tagged, load_hyperyaml, parse_hyperyaml


def test_tags_become_data_and_nothing_is_executed() -> None:
    data = parse_hyperyaml(
        """
seed: !apply:builtins.exit [3]
model: !new:pkg.mod.Model
    size: 4
    inner: !new:pkg.mod.Inner
fn: !name:pkg.mod.func
    alpha: 0.5
"""
    )
    assert data["seed"] == Tagged("apply", "builtins.exit", [3])
    assert data["model"] == Tagged(
        "new", "pkg.mod.Model", {"size": 4, "inner": Tagged("new", "pkg.mod.Inner", None)}
    )
    assert data["fn"] == Tagged("name", "pkg.mod.func", {"alpha": 0.5})


def test_refs_resolve_values_arithmetic_and_strings() -> None:
    data = parse_hyperyaml(
        """
chunk: 25
ratio: 2
path: /models
nested: {inner: [10, 20]}
size: !ref <chunk> * <ratio>
neg: !ref -<chunk> + 1
half: !ref <chunk> / <ratio>
same: !ref <chunk>
file: !ref <path>/vocab.json
deep: !ref <nested[inner][1]>
dotted: !ref <nested.inner>
chain: !ref <size> + 1
"""
    )
    assert data["size"] == 50
    assert data["neg"] == -24
    assert data["half"] == 12.5
    assert data["same"] == 25
    assert data["file"] == "/models/vocab.json"
    assert data["deep"] == 20
    assert data["dotted"] == [10, 20]
    assert data["chain"] == 51


def test_refs_into_tagged_nodes_and_copies() -> None:
    data = parse_hyperyaml(
        """
gen: !new:a.Gen
    rate: 8
other: !ref <gen>
rate: !ref <gen[rate]>
copy: !copy <gen>
"""
    )
    assert data["other"] == data["gen"]
    assert data["rate"] == 8
    assert data["copy"] == data["gen"]


def test_overrides_replace_keys_before_resolution() -> None:
    data = parse_hyperyaml("root: ''\nfile: !ref <root>/x.txt\n", overrides={"root": "/m"})
    assert data["file"] == "/m/x.txt"


def test_yaml12_style_floats_without_a_dot() -> None:
    data = parse_hyperyaml("a: 1e-06\nb: 2E+3\nc: -1.5e-2\nd: '1e-06'\n")
    assert data == {"a": 1e-06, "b": 2000.0, "c": -0.015, "d": "1e-06"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: !ref <missing>\n", "points at no node"),
        ("a: !ref <b>\nb: !ref <a>\n", "circular"),
        ("a: !ref plain\n", "names no <key>"),
        ("a: !unknown 3\n", "could not determine a constructor"),
        ("- 1\n- 2\n", "must be a mapping"),
        ("a: [1, 2\n", "expected"),
    ],
)
def test_bad_documents_raise_typed_errors(text: str, message: str) -> None:
    with pytest.raises(HyperYamlError, match=message):
        parse_hyperyaml(text, source="conf.yaml")


def test_load_names_missing_file(tmp_path: Path) -> None:
    with pytest.raises(HyperYamlError, match="nothere.yaml"):
        load_hyperyaml(tmp_path / "nothere.yaml")


def test_node_reader_types_and_errors() -> None:
    data = parse_hyperyaml(
        "m: !new:x.M\n  n: 3\n  f: 2\n  s: hi\n  l: [1, 2]\n  ll: [[1], [2, 3]]\n  b: true\n"
    )
    reader = NodeReader(data, "", "c.yaml").sub("m", "x.M")
    assert (reader.int("n"), reader.float("f"), reader.str("s"), reader.bool("b")) == (3, 2.0, "hi", True)
    assert reader.ints("l") == (1, 2)
    assert reader.int_lists("ll") == ((1,), (2, 3))
    with pytest.raises(HyperYamlError, match=r"c.yaml: 'm.s' must be an integer"):
        reader.int("s")
    with pytest.raises(HyperYamlError, match=r"missing key 'm.zz'"):
        reader.get("zz")
    with pytest.raises(HyperYamlError, match=r"'m' must be !new:x.Other"):
        NodeReader(data, "", "c.yaml").sub("m", "x.Other")
