"""Which repository addresses the run controller leaves to git and which it makes absolute."""

from __future__ import annotations

import os

import pytest

from joch.controllers.invocations import local_url as _local_url


@pytest.mark.parametrize("url", ["github.invalid:org/repo.git", "git@h:o/r.git", "https://h/o/r.git", "/srv/r.git",
                                 "ext::sh -c x"])
def test_remote_addresses_are_left_alone(url: str) -> None:
    assert _local_url(url) == url  # an scp-style URL without a user is not a local directory


def test_a_relative_path_is_relative_to_the_controllers_directory() -> None:
    assert _local_url(".") == os.getcwd() and _local_url("sub/repo") == os.path.join(os.getcwd(), "sub/repo")
