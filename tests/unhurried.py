"""The deadline of a run, and a tool's time limit, in a test that does not test them."""

from __future__ import annotations

UNHURRIED_SECONDS = 600.0
"""A run's deadline, or a tool's ``timeout_seconds``, where it is not what the test proves
(the kits' contexts and tools).

Wall-clock time: a machine whose cores are all busy stretches it many times over (a test that
takes a second of a quiet core's time took over 30 s at load 29 on two cores), and a run ending
``deadline_exceeded``, or a tool's body withdrawn unstarted at its time limit (``timeout``),
would fail a test of something else there. Ten minutes is finite, so a run the product fails
to end still ends, and no test of this suite needs near that. A test OF a deadline or a time
limit passes its own, short and explicit (``context(seconds=2)``, ``Deadline.after(0.15)``, the
graph kit's ``hang`` tool at 0.3 s).
"""
