"""No string in a ``Status`` runs longer than ``MAX_STATUS_TEXT``: errors echo what users sent."""

from __future__ import annotations

from joch.api import errors


def test_every_string_of_a_status_is_clipped() -> None:
    huge = "k" * 1_000_000
    status = errors.Invalid(f"bad {huge}", kind=huge, causes=[errors.Cause(huge, huge)],
                            extra={"documents": [{"name": huge}]}).to_status()
    assert len(str(status)) < 10 * errors.MAX_STATUS_TEXT
    assert status["message"].endswith(f"… ({1_000_004 - errors.MAX_STATUS_TEXT} more characters)")
    assert status["details"]["documents"][0]["name"].startswith("k" * errors.MAX_STATUS_TEXT)


def test_short_statuses_are_unchanged() -> None:
    error = errors.NotFound('agents "a" not found', kind="agents", name="a")
    assert error.to_status()["message"] == 'agents "a" not found'
