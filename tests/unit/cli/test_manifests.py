"""Reading -f inputs, and mapping the server's stream indexes back to files."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from joch.api import errors
from joch.cli import manifests
from joch.cli.manifests import Bundle, Source

A = "# leading comment\n---\nkind: A\nmetadata: {name: x}\n---\n---\nkind: B\nmetadata:\n  name: y\n"
LIST = '{"kind": "List", "items": [{"kind": "C", "metadata": {"name": "z"}}, {"kind": "C", "metadata": {}}]}'
C = "---\nkind: D\nmetadata: {generateName: w-}\n"


def test_the_joined_stream_maps_every_index_back_to_its_file_document_and_line() -> None:
    bundle = Bundle([Source("a.yaml", A), Source("b.json", LIST), Source("c.yaml", C)])
    assert bundle.count == 4
    labels = {i: (d.label if d else None) for i in range(7) for d in [bundle.document(i)]}
    assert labels[0] == "documents[0] (A/x in a.yaml:3)"
    assert labels[2] == "documents[2] (B/y in a.yaml:7)"
    assert labels[3] == "documents[0] (List/? in b.json:1)"
    assert labels[5] == "documents[0] (D/w- in c.yaml:2)"
    assert labels[6] is None
    item = bundle.document(3, item=0)
    assert item is not None and item.label == "documents[0].items[0] (C/z in b.json:1)"


def test_text_is_sent_verbatim() -> None:
    text = "kind: A\nmetadata: {name: x}\nspec: {enabled: on, version: 1.10}\n"
    assert Bundle([Source("a.yaml", text)]).text == text


def test_documents_expand_lists_and_skip_empty_sections() -> None:
    docs = manifests.documents([Source("a.yaml", A), Source("b.json", LIST)])
    assert [(d.kind, d.name, d.index, d.item) for d in docs] == [
        ("A", "x", 0, None), ("B", "y", 2, None), ("C", "z", 0, 0), ("C", "", 0, 1),
    ]


def test_a_document_that_is_not_a_mapping_is_refused_with_its_place() -> None:
    with pytest.raises(errors.BadRequest, match=r"documents\[1\] \(\?/\? in x.yaml:3\)"):
        manifests.documents([Source("x.yaml", "kind: A\n---\n- just\n- a list\n")])


def test_yaml_syntax_errors_name_the_file_and_line() -> None:
    with pytest.raises(errors.BadRequest, match=r"broken.yaml: invalid YAML at line 4, column 1: did not find"):
        Bundle([Source("ok.yaml", "kind: A\n"), Source("broken.yaml", "kind: A\nmetadata:\n  name: [x\n")])


def test_a_json_array_is_a_list_of_objects() -> None:
    docs = manifests.documents([Source("a.json", '[{"kind": "A"}, {"kind": "B"}]')])
    assert [(d.kind, d.item) for d in docs] == [("A", 0), ("B", 1)]


def test_read_expands_directories_in_name_order_and_reads_stdin(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("kind: B\n")
    (tmp_path / "a.yml").write_text("kind: A\n")
    (tmp_path / "c.json").write_text('{"kind": "C"}')
    (tmp_path / "notes.txt").write_text("ignored")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.yaml").write_text("kind: D\n")
    sources = manifests.read([str(tmp_path), "-"], io.StringIO("kind: S\n"))
    assert [Path(s.name).name for s in sources] == ["a.yml", "b.yaml", "c.json", "stdin"]
    assert sources[-1].text == "kind: S\n"


def test_a_missing_path_is_a_bad_request(tmp_path: Path) -> None:
    with pytest.raises(errors.BadRequest, match="does not exist"):
        manifests.read([str(tmp_path / "nope.yaml")], io.StringIO())


