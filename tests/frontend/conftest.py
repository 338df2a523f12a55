import pytest

import ember as em


@pytest.fixture(autouse=True)
def _unseeded():
    """Tests that seed must not make later tests' ids reproducible by accident."""
    yield
    em.seed(None)
