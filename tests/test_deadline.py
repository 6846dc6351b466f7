"""The run's deadline that waits on actors check between slices (in-process, no Ray)."""

from __future__ import annotations

import time

import pytest

from shoal.runtime import deadline


def test_check_raises_only_inside_a_passed_limit_and_limits_nest():
    deadline.check()  # no limit: nothing to check
    with deadline.limit(None):
        deadline.check()
    with deadline.limit(3600):
        deadline.check()  # an hour away
        with deadline.limit(0):  # the inner limit applies...
            with pytest.raises(deadline.DeadlineReached):
                deadline.check()
        deadline.check()  # ...and the outer one again after it
    with deadline.limit(-5):  # time already spent past the criterion: due at once
        with pytest.raises(deadline.DeadlineReached):
            deadline.check()
    deadline.check()


def test_a_limit_passes_with_time():
    with deadline.limit(0.05):
        deadline.check()
        time.sleep(0.1)
        with pytest.raises(deadline.DeadlineReached, match="time criterion"):
            deadline.check()
