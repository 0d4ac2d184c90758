"""Server references to documents of the joined stream are rewritten to files and lines."""

from __future__ import annotations

from joch.api import errors
from joch.cli import applying
from joch.cli.manifests import Bundle, Source

GOOD = "kind: Agent\nmetadata: {name: a}\n---\nkind: Agent\nmetadata: {name: b}\n"
BAD = "# two documents\nkind: AgentProvider\nmetadata: {name: p}\n---\nkind: Agent\nmetadata:\n  name: broken\n"


def test_causes_and_messages_name_the_file_document_and_line() -> None:
    bundle = Bundle([Source("good.yaml", GOOD), Source("bad.yaml", BAD)])
    exc = errors.Invalid(
        "documents[3] (Agent/broken in request body:10) is invalid; nothing was applied",
        causes=[errors.Cause("documents[3].spec.providerRef", "required field is missing"),
                errors.Cause("documents[9].spec", "out of range stays as it is"),
                errors.Cause("", "documents[2] (AgentProvider/p in request body:7) conflicts")],
    )
    located = applying._locate(exc, bundle)
    assert isinstance(located, errors.Invalid)
    assert located.message == "documents[1] (Agent/broken in bad.yaml:5) is invalid; nothing was applied"
    assert [(c.field, c.message) for c in located.causes] == [
        ("documents[1] (Agent/broken in bad.yaml:5).spec.providerRef", "required field is missing"),
        ("documents[9].spec", "out of range stays as it is"),
        ("", "documents[0] (AgentProvider/p in bad.yaml:2) conflicts"),
    ]


def test_an_item_of_a_list_is_named_with_its_item_index() -> None:
    listing = '{"kind": "List", "items": [{"kind": "Agent", "metadata": {"name": "x"}}]}'
    bundle = Bundle([Source("one.yaml", GOOD), Source("list.json", listing)])
    located = applying._relabel("documents[2].items[0].spec: bad", bundle)
    assert located == "documents[0].items[0] (Agent/x in list.json:1).spec: bad"


def test_a_deletion_waiting_on_finalizers_says_so() -> None:
    marked = {"metadata": {"name": "ed", "deletionTimestamp": "2025-01-01T00:00:00Z", "finalizers": ["x", "y"]}}
    assert applying.deletion(marked) == "marked for deletion (waiting on finalizers: x, y)"
    assert applying.deletion({"metadata": {"name": "ed", "deletionTimestamp": "2025-01-01T00:00:00Z"}}) == "deleted"
    assert applying.deletion({"kind": "Status", "status": "Success"}) == "deleted"
    assert applying.deletion(None) == "deleted"


def test_the_servers_name_for_the_stream_gives_way_to_the_file() -> None:
    bundle = Bundle([Source("good.yaml", GOOD)])
    assert applying._relabel("request body: documents[1] (?/? in request body:4) is a list", bundle) == (
        "documents[1] (Agent/b in good.yaml:4) is a list")
