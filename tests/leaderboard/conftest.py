"""Fixtures of the leaderboard's tests."""

import pytest

from dpbench.leaderboard.provenance import Provenance

CLEAN = Provenance("c" * 40, False)


@pytest.fixture
def clean_commit(monkeypatch: pytest.MonkeyPatch) -> Provenance:
    """Cells run by a test record one clean commit, whatever state the checkout running the tests is in: a test of
    the launchers or of private tuning then builds its report without --allow-mixed-commits."""
    monkeypatch.setattr("dpbench.leaderboard.cells.at_launch", lambda: CLEAN)
    return CLEAN
