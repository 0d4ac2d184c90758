"""kubectl's JSONPath templates, ``wait --for`` and ``--timeout`` parsing, and ``logs --tail``'s line
keeping: pure functions, no server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from joch.api import errors
from joch.cli import jsonpaths, shaping, waiting
from joch.runtime import logtail

LIST: dict[str, Any] = {
    "kind": "List",
    "items": [
        {"metadata": {"name": "a", "labels": {"app.kubernetes.io/name": "web"}},
         "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "attempt": 2}},
        {"metadata": {"name": "b"}, "spec": {"n": 3, "on": True}},
    ],
}


@pytest.mark.parametrize(("template", "printed"), [
    ("{.items[*].metadata.name}", "a b"),
    ('{range .items[*]}{.metadata.name}{"\\t"}{.status.phase}{"\\n"}{end}', "a\tRunning\nb\t\n"),
    ("kind={.kind}.", "kind=List."),
    ("{$.kind}", "List"),
    ("{.items[0].metadata.labels.app\\.kubernetes\\.io/name}", "web"),
    ('{.items[0].status.conditions[?(@.type=="Ready")].status}', "True"),
    ('{.items[?(@.metadata.name=="b")].spec}', '{"n":3,"on":true}'),
    ("{.items[1].spec.on} {.items[0].status.attempt}", "true 2"),
    ("{.items[-1:].metadata.name}", "b"),
    ("{range .items}[{@.metadata.name}]{end}", "[a][b]"),
    ("{range .items[*]}{range .status.conditions[*]}{.type}{end};{end}", "Ready;;"),
    ("{.missing}", ""),
])
def test_templates_print_as_kubectl(template: str, printed: str) -> None:
    assert jsonpaths.template(template).render(LIST) == printed


@pytest.mark.parametrize(("template", "problem"), [
    ("{.items[*]", "every { needs its }"),
    ("{range .items[*]}x", "{range} has no {end}"),
    ("{end}", "{end} without a {range}"),
    ("{range}{end}", "{range} needs an expression"),
    ("{.items[?(@.x==]}", "error parsing JSONPath template"),
])
def test_bad_templates_are_bad_requests(template: str, problem: str) -> None:
    with pytest.raises(errors.BadRequest) as raised:
        jsonpaths.template(template)
    assert problem in raised.value.message


def test_relaxed_expressions_and_sorting() -> None:
    for spelled in (".metadata.name", "{.metadata.name}", "metadata.name"):
        assert jsonpaths.first(jsonpaths.relaxed(spelled, what="--sort-by"), LIST["items"][0]) == "a"
    finder = shaping.sorter(".spec.n")
    objects = [{"spec": {"n": 10}}, {"spec": {"n": 9}}, {"spec": {}}, {"spec": {"n": 9.5}}]
    assert [o["spec"].get("n") for o in shaping.sort_objects(objects, finder)] == [None, 9, 9.5, 10]


def test_custom_columns() -> None:
    shape = shaping.shape("custom-columns=NAME:.metadata.name,READY:.status.conditions[?(@.type==\"Ready\")].status")
    assert shape is not None
    assert shape.render(LIST["items"], single=False).splitlines() == [
        "NAME   READY", "a      True", "b      <none>"]
    with pytest.raises(errors.BadRequest, match="HEADER:JSONPATH"):
        shaping.shape("custom-columns=NAME")
    with pytest.raises(errors.BadRequest, match="needs a template"):
        shaping.shape("jsonpath=")


@pytest.mark.parametrize(("spec", "met"), [
    ("condition=Ready", True),
    ("condition=ready=true", True),
    ("condition=Ready=False", False),
    ("jsonpath={.status.phase}=Running", True),
    ("jsonpath=.status.phase=Failed", False),
    ("jsonpath={.status.phase}", True),
    ("jsonpath={.status.reason}", False),
    ("create", True),
    ("delete", False),
])
def test_wait_conditions(spec: str, met: bool) -> None:
    assert waiting.parse(spec).met(LIST["items"][0]) is met


@pytest.mark.parametrize("bad", ["ready", "condition=", "jsonpath=", "jsonpath={.a}x", "deleted"])
def test_bad_wait_conditions(bad: str) -> None:
    with pytest.raises(errors.BadRequest):
        waiting.parse(bad)


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("1m30s", 90), ("2h", 7200), ("500ms", 0.5),
                                               ("0", 0), ("12", 12), ("-1s", 7 * 24 * 3600)])
def test_durations(text: str, seconds: float) -> None:
    assert waiting.duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "5x", "1m30", "", "nan", "inf", "-inf", "1e400"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(errors.BadRequest, match="invalid --timeout"):
        waiting.duration(bad)


def test_last_lines_across_chunks() -> None:
    chunks = [b"one\ntw", b"o\nthr", b"ee\nfour"]
    assert logtail.last_lines(chunks, 2) == ([b"three\n", b"four"], 18)
    assert logtail.last_lines(chunks, 0) == ([], 18)
    assert logtail.last_lines(chunks, 10)[0] == [b"one\n", b"two\n", b"three\n", b"four"]


def test_limited_ends_at_the_byte_limit_without_reading_further() -> None:
    read: list[bytes] = []

    def chunks() -> Iterator[bytes]:
        for chunk in (b"abc", b"", b"def", b"gh", b"never"):
            read.append(chunk)
            yield chunk

    assert list(logtail.limited(chunks(), 5)) == [b"abc", b"", b"de"]
    assert read == [b"abc", b"", b"def"]
    assert list(logtail.limited([b"abc"], 3)) == [b"abc"]


def test_template_files(tmp_path: Path) -> None:
    (tmp_path / "cc").write_text("NAME   PHASE\n.metadata.name  {.status.phase}\n")
    (tmp_path / "jp").write_text('{range .items[*]}{.metadata.name}{"\\n"}{end}')
    columns = shaping.shape(f"custom-columns-file={tmp_path / 'cc'}")
    assert columns is not None
    rendered = columns.render(LIST["items"], single=False).splitlines()
    assert rendered == ["NAME   PHASE", "a      Running", "b      <none>"]
    template = shaping.shape(f"jsonpath-file={tmp_path / 'jp'}")
    assert template is not None and template.render(LIST["items"], single=False) == "a\nb\n"
    (tmp_path / "bad").write_text("NAME\n")
    with pytest.raises(errors.BadRequest, match="two lines"):
        shaping.shape(f"custom-columns-file={tmp_path / 'bad'}")
    with pytest.raises(errors.BadRequest, match="cannot read"):
        shaping.shape(f"jsonpath-file={tmp_path / 'missing'}")


def test_a_very_deep_path_is_a_bad_request_not_a_recursion_error() -> None:
    deep = "{.items[*].a" + ".b" * 3000 + "}"
    with pytest.raises(errors.BadRequest, match="too deeply nested"):
        jsonpaths.template(deep).render({"items": [{"a": 1}]})


def test_sort_by_takes_an_integer_too_large_for_a_float() -> None:
    objects = [{"a": 10**400}, {"a": 1}, {"a": -(10**400)}]
    ordered = shaping.sort_objects(objects, shaping.sorter(".a"))
    assert [o["a"] for o in ordered] == [-(10**400), 1, 10**400]


def test_tail_of_a_long_line_without_newlines_is_linear() -> None:
    import time

    chunks = [b"x" * 1024] * 8192  # 8 MB, one line: rebuilding it per chunk copies gigabytes
    started = time.monotonic()
    lines, size = logtail.last_lines([*chunks, b"\nend"], 2)
    assert time.monotonic() - started < 2
    assert size == 8 * 1024 * 1024 + 4
    assert lines == [b"x" * (8 * 1024 * 1024) + b"\n", b"end"]
