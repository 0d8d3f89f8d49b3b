"""Containment: running the decision model and the tools so that nothing they do — raise a
``BaseException``, block, ignore their deadline or cancellation, never return — can hurt the
run, another run or the process.

- :mod:`~fencepost.graph.containment.model`: the decision model, on the shared model loop (a
  plain ``def decide``: on the tool threads, as a sync tool body);
- :mod:`~fencepost.graph.containment.tools`: one tool body, sync on a tenant's share of the
  tool threads (:mod:`~fencepost.graph.containment.tool_threads`), async on the caller's loop on
  a :mod:`~fencepost.graph.containment.leash`;
- :mod:`~fencepost.graph.containment.shared_loop`: async parts run from a sync invoke;
- :mod:`~fencepost.graph.containment.waiting`: waiting on them within a deadline.
"""
