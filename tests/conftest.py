"""Shared fixtures: where the real samples are, and skipping clearly when they are not."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared" / "samples"


@pytest.fixture(scope="session")
def samples() -> Path:
    """../shared/samples, or a skip saying where it was looked for."""
    if not SAMPLES.is_dir():
        pytest.skip(f"real sample traces not found at {SAMPLES} (the shared/ folder beside the checkout)")
    return SAMPLES


@pytest.fixture(autouse=True)
def dcgm_ledger(tmp_path, monkeypatch) -> Path:
    """A DCGM pause ledger of each test's own: the host's (/tmp/rankscope-dcgm) would join
    its agents with those of tests running beside it, as agents of one host."""
    folder = tmp_path / "dcgm-ledger"
    monkeypatch.setenv("RANKSCOPE_DCGM_STATE", str(folder))
    return folder
