"""An AgentDojo harness for fencepost's policies (``make agentdojo``).

AgentDojo (``agentdojo==0.1.35``, benchmark v1.2.2: banking, slack, travel, workspace) is run
offline: no model and no network. A scripted model replays each user task's ground-truth calls
through fencepost (:mod:`.replay`); under attack, a scripted, fully compliant victim also replays
the injection task's ground-truth calls after the first tool output that carries the injected
goal, whatever AgentDojo template wraps it.
AgentDojo's own utility and security checks score each run (:mod:`.pipeline`).

What it measures is what a policy stops against a compliant attacker — not a real model's
robustness. The modules:

- :mod:`.suites`    the suites, their tasks, the attack text and which pairs are replayable;
- :mod:`.tools`     AgentDojo functions as ``@fp.tool`` s (the environment injected), per-tool guards;
- :mod:`.replay`    the scripted user-task model and the compliant victim;
- :mod:`.held_out`  held-out injection tasks, written before RECOMMENDED and scored apart;
- :mod:`.trusted`   the old approver: trusted records per suite and its rules over them;
- :mod:`.provenance` a stand-in for fencepost's provenance rule, as the graph's approver;
- :mod:`.policies`  a policy = capabilities + the graph's approver + what a denial does, and
  the RECOMMENDED policy's declarations (trust, sensitive arguments, least privilege);
- :mod:`.pipeline`  one run as an AgentDojo pipeline element (fencepost, and the bare ceiling);
- :mod:`.runner`    every suite under every policy, with numbers;
- :mod:`.report`    ``benchmarks/agentdojo.md``.

Run it as a module from the repository root (``python -m benchmarks.agentdojo``) in the
harness's own virtual environment: ``benchmarks/agentdojo/`` must never be on ``sys.path``
itself, or this package would shadow the real ``agentdojo``.
"""
