from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from joch.admission.documents import MAX_DEPTH, MAX_NODES, check_nesting, load_documents, load_paths
from joch.api import errors

AGENT = """\
apiVersion: joch.dev/v1alpha1
kind: Agent
metadata:
  name: coder
spec:
  providerRef: {name: codex}
"""


def test_multi_document_stream_keeps_positions_across_empty_documents() -> None:
    text = "---\n" + AGENT + "---\n---\n# only a comment\n---\n" + AGENT.replace("coder", "reviewer")
    docs = load_documents(text, "team.yaml")
    assert [d.obj["metadata"]["name"] for d in docs] == ["coder", "reviewer"]
    assert [d.index for d in docs] == [0, 3]
    assert [d.line for d in docs] == [2, 12]
    assert all(d.source == "team.yaml" for d in docs)
    assert docs[1].label() == "documents[3] (Agent/reviewer in team.yaml:12)"


def test_empty_text_has_no_documents() -> None:
    assert load_documents("", "empty.yaml") == []
    assert load_documents("---\n# nothing\n", "empty.yaml") == []


def test_json_object() -> None:
    docs = load_documents(json.dumps({"apiVersion": "v1", "kind": "Agent", "metadata": {"name": "a"}}), "a.json")
    assert len(docs) == 1
    assert docs[0].obj["metadata"] == {"name": "a"}
    assert docs[0].label() == "documents[0] (Agent/a in a.json)"


@pytest.mark.parametrize("kind", ["List", "AgentList"])
def test_a_list_expands_into_its_items(kind: str) -> None:
    body = {"apiVersion": "v1", "kind": kind, "items": [
        {"kind": "Agent", "metadata": {"name": "a"}}, {"kind": "Agent", "metadata": {"name": "b"}}]}
    docs = load_documents(json.dumps(body), "list.json")
    assert [(d.index, d.item, d.obj["metadata"]["name"]) for d in docs] == [(0, 0, "a"), (0, 1, "b")]
    assert docs[1].ref == "documents[0].items[1]"


def test_a_yaml_list_expands_and_keeps_the_source_text_of_its_items() -> None:
    text = "kind: List\nitems:\n- kind: A\n  spec: {mode: on}\n- kind: B\n"
    docs = load_documents(text, "l.yaml")
    assert [d.obj["kind"] for d in docs] == ["A", "B"]
    assert docs[0].raw.values == {("spec", "mode"): "on"}


def test_a_json_array_expands() -> None:
    docs = load_documents('[{"kind": "A"}, {"kind": "B"}]', "a.json")
    assert [d.obj["kind"] for d in docs] == ["A", "B"]


def test_yaml_flow_mapping_that_is_not_json_is_read_as_yaml() -> None:
    docs = load_documents("{kind: Agent, metadata: {name: a}}", "flow.yaml")
    assert docs[0].obj == {"kind": "Agent", "metadata": {"name": "a"}}


def test_syntax_error_names_the_source_and_line() -> None:
    text = AGENT + "---\nkind: Agent\nmetadata:\n  name: x\n  labels: [a\n"
    with pytest.raises(errors.BadRequest, match=r"^bad\.yaml: invalid YAML at line \d+, column \d+"):
        load_documents(text, "bad.yaml")


def test_colon_in_unquoted_value_gets_a_hint() -> None:
    with pytest.raises(errors.BadRequest, match=r'line 1, column 18: mapping values .*must be quoted'):
        load_documents("description: note: this breaks\n", "a.yaml")


def test_duplicate_keys_are_refused_with_their_line() -> None:
    with pytest.raises(errors.BadRequest, match=r"a\.yaml: invalid YAML at line 3.*duplicate key 'name'"):
        load_documents("metadata:\n  name: a\n  name: b\n", "a.yaml")


def test_merge_keys_may_override_without_being_duplicates() -> None:
    docs = load_documents("base: &b {x: 1, y: 2}\nuse: {<<: *b, y: 3}\n", "m.yaml")
    assert docs[0].obj["use"] == {"x": 1, "y": 3}


def test_duplicate_keys_in_json_are_refused() -> None:
    with pytest.raises(errors.BadRequest, match=r'a\.json: duplicate key "kind"'):
        load_documents('{"kind": "A", "kind": "B"}', "a.json")


@pytest.mark.parametrize(("text", "what"), [("- a\n- b\n", "a list"), ("just text\n", "the string 'just text'"),
                                            ("42\n", "a number")])
def test_non_mapping_document_names_its_index(text: str, what: str) -> None:
    with pytest.raises(errors.BadRequest, match=rf"x\.yaml: documents\[1\] \(line 3\) is {what}, not a mapping"):
        load_documents("kind: A\n---\n" + text, "x.yaml")


def test_non_mapping_item_of_a_list_names_it() -> None:
    with pytest.raises(errors.BadRequest, match=r"documents\[0\]\.items\[1\] is a number"):
        load_documents('{"kind": "List", "items": [{"kind": "A"}, 7]}', "x.json")


def test_source_text_of_typed_scalars_is_kept_by_path() -> None:
    text = 'spec:\n  mode: on\n  version: 1.10\n  quoted: "yes"\n  list: [no, "off"]\n  on: 1\n  d: 2024-01-01\n'
    raw = load_documents(text, "a.yaml")[0].raw
    assert raw.values == {("spec", "mode"): "on", ("spec", "version"): "1.10", ("spec", "list", 0): "no",
                          ("spec", True): "1", ("spec", "d"): "2024-01-01"}
    assert raw.keys == {("spec", True): "on"}


def test_alias_bombs_are_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 8)]
    with pytest.raises(errors.BadRequest, match=f"more than {MAX_NODES} nodes"):
        load_documents("\n".join(lines) + "\n", "bomb.yaml")


def test_self_referencing_documents_are_refused() -> None:
    with pytest.raises(errors.BadRequest, match="refers to itself"):
        load_documents("a: &a\n  b: *a\n", "loop.yaml")


def test_load_paths_reads_files_directories_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "b.yaml").write_text(AGENT.replace("coder", "b"))
    (tmp_path / "a.yml").write_text(AGENT.replace("coder", "a"))
    (tmp_path / "c.json").write_text(json.dumps({"kind": "Agent", "metadata": {"name": "c"}}))
    (tmp_path / "notes.txt").write_text("not a manifest: [")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "d.yaml").write_text(AGENT.replace("coder", "d"))
    single = tmp_path / "nested" / "d.yaml"
    monkeypatch.setattr(sys, "stdin", io.StringIO(AGENT.replace("coder", "stdin")))
    docs = load_paths([str(tmp_path), str(single), "-"])
    assert [d.obj["metadata"]["name"] for d in docs] == ["a", "b", "c", "d", "stdin"]
    assert docs[0].source == str(tmp_path / "a.yml")
    assert docs[-1].source == "-"
    assert docs[-1].label() == "documents[0] (Agent/stdin in stdin:1)"


def test_load_paths_missing_path(tmp_path: Path) -> None:
    with pytest.raises(errors.NotFound, match="does not exist"):
        load_paths([str(tmp_path / "nope.yaml")])


def test_load_paths_tolerates_a_byte_order_mark(tmp_path: Path) -> None:
    (tmp_path / "bom.yaml").write_bytes(b"\xef\xbb\xbf" + AGENT.encode())
    assert load_paths([str(tmp_path / "bom.yaml")])[0].obj["kind"] == "Agent"


def test_load_paths_refuses_binary(tmp_path: Path) -> None:
    (tmp_path / "bin.yaml").write_bytes(b"kind: \xff\xfe\n")
    with pytest.raises(errors.BadRequest, match="not UTF-8"):
        load_paths([str(tmp_path / "bin.yaml")])


# --- nesting and characters ----------------------------------------------------------------------

def _nested(kind: str, depth: int) -> str:
    """A document whose collections nest exactly ``depth`` levels deep, the document included."""
    if kind == "flow":
        return "a: " + "[" * (depth - 1) + "]" * (depth - 1) + "\n"
    if kind == "json":
        return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
    if kind == "compact":  # "- - - x": a list in a list per two columns, no brackets at all
        return "a:\n" + "- " * (depth - 1) + "x\n"
    return "".join(" " * i + f"k{i}:\n" for i in range(depth - 1)) + " " * (depth - 1) + "k: v\n"


@pytest.mark.parametrize("kind", ["flow", "json", "compact", "block"])
def test_nesting_is_limited_with_the_source_and_the_line(kind: str) -> None:
    assert load_documents("x: 1\n---\n" + _nested(kind, MAX_DEPTH), "deep.yaml")
    with pytest.raises(errors.BadRequest) as info:
        load_documents("x: 1\n---\n" + _nested(kind, MAX_DEPTH + 1), "deep.yaml")
    assert info.value.message.startswith("deep.yaml: documents[1] (line ")
    assert f"nest more than {MAX_DEPTH} levels deep" in info.value.message


def test_json_nesting_is_limited_on_the_json_path() -> None:
    with pytest.raises(errors.BadRequest, match=r"deep.json: documents\[0\] \(line 2\): mappings and lists"):
        load_documents('{"a":\n' + "[" * 200 + "]" * 200 + "}", "deep.json")


def test_nesting_through_aliases_is_limited() -> None:
    chain = "".join(f"a{i + 1}: &a{i + 1} [*a{i}]\n" for i in range(MAX_DEPTH))
    with pytest.raises(errors.BadRequest, match="through aliases"):
        load_documents("a0: &a0 [x]\n" + chain, "alias.yaml")


def test_check_nesting_is_what_the_cli_calls_before_composing() -> None:
    check_nesting("apiVersion: v1\nkind: List\nitems: [{a: [1, 2]}, {b: {c: d}}]\n", "ok.yaml")
    with pytest.raises(errors.BadRequest, match=r"^stdin: documents\[0\] \(line 1\)"):
        check_nesting("a: " + "[" * 100)
    check_nesting("a: [" * 10, "broken.yaml")  # a syntax error is the parser's to report, not this one's


@pytest.mark.parametrize("text", ["a: " + "[" * 100_000, "- " * 100_000 + "a", "? " * 100_000 + "a",
                                  "[" * 100_000])
def test_documents_that_crashed_libyaml_are_refused(text: str) -> None:
    # In a child process: before the limit, libyaml's recursive composer took the process down.
    code = ("import sys; from joch.admission.documents import load_documents; from joch.api import errors\n"
            "try:\n    load_documents(sys.stdin.read(), 'bomb.yaml')\n"
            "except errors.BadRequest as exc:\n    print(exc.message)\n")
    done = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("bomb.yaml: documents[0] (line 1): mappings and lists nest more than 64")


@pytest.mark.parametrize(("text", "where"), [
    ('{"kind": "A", "spec": {"text": "x\\ud800y"}}', "documents[0].spec.text"),
    ('[{"kind": "A"}, {"kind": "B", "spec": {"\\udc00": 1}}]', "documents[0].items[1].spec[\\udc00]"),
    ('{"kind": "List", "items": [{"kind": "A", "m": ["ok", "\\uDBFF"]}]}', "documents[0].items[0].m[1]"),
])
def test_lone_surrogates_are_refused_at_their_field(text: str, where: str) -> None:
    with pytest.raises(errors.BadRequest) as info:
        load_documents(text, "s.json")
    assert info.value.message.startswith(f"s.json: {where} holds a lone UTF-16 surrogate")
    assert [c.field for c in info.value.causes] == [where]


def test_surrogate_pairs_are_characters() -> None:
    (doc,) = load_documents('{"kind": "A", "spec": {"text": "\\ud83d\\ude00"}}', "s.json")
    assert doc.obj["spec"]["text"] == "\U0001f600"
