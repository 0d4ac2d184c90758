from __future__ import annotations

import pytest

from joch.api import errors


@pytest.mark.parametrize(("cls", "code", "reason"), [
    (errors.NotFound, 404, "NotFound"), (errors.Conflict, 409, "Conflict"),
    (errors.AlreadyExists, 409, "AlreadyExists"), (errors.Invalid, 422, "Invalid"),
    (errors.Gone, 410, "Expired"), (errors.BadRequest, 400, "BadRequest"),
])
def test_status_round_trip(cls: type[errors.JochError], code: int, reason: str) -> None:
    err = cls("boom", kind="agents", name="x", causes=[errors.Cause("spec.a", "bad")])
    status = err.to_status()
    assert status["kind"] == "Status" and status["code"] == code and status["reason"] == reason
    back = errors.from_status(status)
    assert type(back) is cls
    assert back.message == "boom" and back.name == "x" and back.causes == err.causes


def test_unknown_reason_falls_back_to_internal() -> None:
    assert isinstance(errors.from_status({"reason": "Weird", "code": 599}), errors.Internal)
