"""faults.py — a failure the tests inject into the engine (tests/test_engine.py, test_server.py, test_batch.py)."""
from __future__ import annotations


def planner_failing_at(plan, n: int):
    """A stand-in for Engine._plan_for (an engine's bound method, or the class's function) that raises at its
    n-th call the OverflowError that `--itl-factor inf` once raised there, and plans as `plan` otherwise."""
    calls = [0]

    def broken(*args):
        calls[0] += 1
        if calls[0] == n:
            raise OverflowError("cannot convert float infinity to integer")
        return plan(*args)

    return broken
