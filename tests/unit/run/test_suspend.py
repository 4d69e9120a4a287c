"""suspend.py: entering, staying in and leaving suspension (table-driven, pure)."""

from __future__ import annotations

import pytest

from solar.run.suspend import suspended


@pytest.mark.parametrize("flag, previous, mode", [
    (True, None, "suspend"), (True, "Running", "suspend"), (True, "Suspended", "suspend"),
    (False, "Suspended", "resume"), (False, "Running", None), (False, None, None),
])
def test_modes(flag, previous, mode):
    assert suspended(flag, previous) == mode
