"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest

from ddpslurm.analyze.rules.loading import load_signatures


@pytest.fixture(scope="session")
def sigs():
    """The shipped signatures, without DDPSLURM_SIGNATURES."""
    return load_signatures(use_env=False)
