"""The deadline of a run in a test that does not test deadlines."""

from __future__ import annotations

UNHURRIED_SECONDS = 600.0
"""A run's deadline where the deadline is not what the test proves (the kits' contexts).

Wall-clock time: a machine whose cores are all busy stretches it many times over (a test that
takes a second of a quiet core's time took over 30 s at load 29 on two cores), and a run ending
``deadline_exceeded`` there would fail a test of something else. Ten minutes is finite, so a
run the product fails to end still ends, and no test of this suite needs near that. A test OF a
deadline passes its own, short and explicit (``context(seconds=2)``, ``Deadline.after(0.15)``).
"""
