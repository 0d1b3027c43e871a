"""Fixtures several unit test modules share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_controller_api import Api, make_api


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    """The controller's app around a real controller, with tokens of every role.

    A module that means another API (a stub Kubernetes one) defines its own ``api``.
    """
    client, h = make_api(tmp_path)
    with client.client:
        yield client
    h.controller.close()
    h.store.close()
