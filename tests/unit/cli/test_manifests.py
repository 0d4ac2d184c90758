"""Reading -f inputs, and mapping the server's stream indexes back to files."""

from __future__ import annotations

import io
import subprocess
import sys
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




def test_an_empty_filename_is_an_error_not_the_current_directory() -> None:
    with pytest.raises(errors.BadRequest, match="must specify -f with a file, directory or -"):
        manifests.read([""], io.StringIO())


def test_text_nested_deeper_than_admission_allows_is_refused_before_libyaml_composes_it() -> None:
    """libyaml's composer recurses in C: 100,000 ``[`` kill the process with SIGSEGV (exit -11)."""
    probe = ("from joch.api import errors\nfrom joch.cli import manifests\n"
             "for text in ('a: ' + '[' * 100000, '- ' * 100000 + 'x', '{\"a\": ' * 100000):\n"
             "    try:\n        manifests.documents([manifests.Source('deep.yaml', text)])\n"
             "    except errors.BadRequest as exc:\n        print(exc.message)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all("deep.yaml" in line and "nest more than" in line for line in lines), lines


def namespaced(api_version: str, kind: str) -> bool | None:
    return {"Agent": True, "Cluster": False}.get(kind)


def added(text: str, name: str = "a.yaml") -> Source:
    return manifests.with_namespace(Source(name, text), "team-a", namespaced, why="from JOCH_NAMESPACE")


def test_with_namespace_adds_the_key_to_documents_naming_none_and_leaves_every_other_byte() -> None:
    text = ("# agents\nkind: Agent\nmetadata:\n  name: a   # first\n  labels: {x: 'on'}\nspec: {tools: [a]}\n"
            "---\nkind: Agent\nmetadata: {name: b, namespace: team-b}\n"
            "---\nkind: Cluster\nmetadata: {name: c}\n"
            "---\nkind: Agent\nmetadata: {name: d}\n"
            "---\nkind: Agent\nmetadata: {}\n"
            "---\nkind: Unknown\nmetadata: {name: e}\n")
    source = added(text)
    assert source.text == text.replace("  name: a", '  namespace: "team-a"\n  name: a').replace(
        "metadata: {name: d}", 'metadata: {namespace: "team-a", name: d}').replace(
        "metadata: {}", 'metadata: {namespace: "team-a"}')
    docs = manifests.documents([source])
    assert [(d.name, (d.obj["metadata"] or {}).get("namespace")) for d in docs] == [
        ("a", "team-a"), ("b", "team-b"), ("c", None), ("d", "team-a"), ("", "team-a"), ("e", None)]
    assert docs[0].obj["metadata"]["labels"] == {"x": "on"}  # the rest is as written, quotes and all
    # labels still name the lines of the file as the user wrote it
    bundle = Bundle([source])
    assert [bundle.document(i).label for i in range(3)] == [  # type: ignore[union-attr]
        "documents[0] (Agent/a in a.yaml:2)", "documents[1] (Agent/b in a.yaml:8)",
        "documents[2] (Cluster/c in a.yaml:11)"]


def test_with_namespace_in_json_lists_and_crlf_files() -> None:
    listing = ('{"kind": "List", "items": [{"kind": "Agent", "metadata": {"name": "x"}},\n'
               ' {"kind": "Agent", "metadata": {"name": "y", "namespace": "b"}}]}')
    assert added(listing).text == listing.replace('{"name": "x"}', '{namespace: "team-a", "name": "x"}')
    array = '[{"kind": "Agent", "metadata": {"name": "x"}}]'
    assert manifests.documents([added(array)])[0].obj["metadata"] == {"namespace": "team-a", "name": "x"}
    crlf = "kind: Agent\r\nmetadata:\r\n  name: x\r\n"
    assert added(crlf).text == 'kind: Agent\r\nmetadata:\r\n  namespace: "team-a"\r\n  name: x\r\n'


def test_with_namespace_refuses_to_guess_where_the_text_is_not_plain() -> None:
    with pytest.raises(errors.BadRequest, match=r'documents\[0\] \(Agent/x in a.yaml:1\): cannot give this document '
                                                r'the namespace "team-a" \(from JOCH_NAMESPACE\)'):
        added("kind: Agent\nmetadata:\n  namespace: ''\n  name: x\n")


def test_stdin_that_is_not_utf8_is_a_clear_error() -> None:
    stdin = io.TextIOWrapper(io.BytesIO(b"kind: \xd0\x01\n"), encoding="utf-8", errors="surrogateescape")
    with pytest.raises(errors.BadRequest, match="cannot read stdin: it is not UTF-8 text"):
        manifests.read(["-"], stdin)
    bom = io.TextIOWrapper(io.BytesIO("\ufeffkind: A\n".encode()), encoding="utf-8")
    assert manifests.read(["-"], bom)[0].text == "kind: A\n"


RUN = """\
apiVersion: runtime.joch.dev/v1alpha1
kind: AgentRun
metadata: {name: r}   # a comment that stays
spec:
  agentRef: {name: a}
  execution:
    coordinates:
      git:
        url: {url}
        ref: main
"""


def test_relative_repository_paths_are_made_absolute_against_the_manifests_directory(tmp_path: Path) -> None:
    (tmp_path / "repo" / "examples").mkdir(parents=True)
    manifest = tmp_path / "repo" / "examples" / "run.yaml"
    manifest.write_text(RUN.replace("{url}", "../") + "---\n" + RUN.replace("{url}", "'sub dir'"))
    [source] = manifests.read([str(manifest)], io.StringIO())
    root, sub = tmp_path / "repo", tmp_path / "repo" / "examples" / "sub dir"
    assert source.text == (RUN.replace("{url}", f'"{root}"') + "---\n" + RUN.replace("{url}", f'"{sub}"'))
    assert [d.line for d in manifests.documents([source])] == [1, 12]


@pytest.mark.parametrize("url", ["/abs/repo", "https://example.com/r.git", "git@example.com:o/r.git",
                                 "file:///srv/r.git", "example.com:o/r"])
def test_absolute_paths_and_urls_are_sent_as_written(tmp_path: Path, url: str) -> None:
    text = RUN.replace("{url}", url)
    assert manifests.with_absolute_paths(Source("run.yaml", text), tmp_path).text == text


def test_stdin_json_and_lists_are_resolved_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    obj = ('{"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "r"}, '
           '"spec": {"execution": {"coordinates": {"git": {"url": "."}}}}}')
    [source] = manifests.read(["-"], io.StringIO(obj))
    assert source.text == obj.replace('"."', f'"{tmp_path}"')
    listed = f'[{obj}, {obj.replace(chr(34) + "." + chr(34), chr(34) + "x" + chr(34))}]'
    resolved = manifests.with_absolute_paths(Source("list.json", listed), tmp_path).text
    assert f'"url": "{tmp_path}"' in resolved and f'"url": "{tmp_path / "x"}"' in resolved
    other = "apiVersion: joch.dev/v1alpha1\nkind: Agent\nmetadata: {name: a}\nspec: {url: .}\n"
    assert manifests.with_absolute_paths(Source("a.yaml", other), tmp_path).text == other
