"""The ledger key scheme: how a run's account and each reservation are named.

Names are hashes of what identifies the run (the thread and the run id), never the caller's or
the model's text verbatim: a call id full of NUL bytes or whitespace still makes a short, clean,
unique key, and no key leaks what the model wrote.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from json.encoder import encode_basestring_ascii


def _hashed(*parts: str) -> str:
    # JSON keeps the parts apart whatever they contain: ("a\x1fb", "c") is not ("a", "b\x1fc").
    # Written as json.dumps(parts, ensure_ascii=True) writes it (durable ledgers hold these
    # keys), without building an encoder per call: a fresh call id misses the cache.
    if len(parts) == 1:  # a call id: no separators to write
        joined = "[" + encode_basestring_ascii(parts[0]) + "]"
    else:
        joined = "[" + ", ".join(map(encode_basestring_ascii, parts)) + "]"
    return hashlib.sha256(joined.encode("ascii")).hexdigest()[:32]


# A run's tag, its thread's claims and each call id are hashed again at every reservation,
# settlement and marker of the run; the digest is a pure function of its text, so a bounded cache
# is safe to share. What is hashed once a run (its account, cached whole below; the run id of a
# task) is not kept in it: an entry never read again, held while the run is in flight.
_digest = lru_cache(maxsize=4096)(_hashed)


# One string object per account: a run's reservations, markers and ledger records all hold it.
@lru_cache(maxsize=4096)
def run_account(
    thread_id: str, run_id: str, namespace: str = "", turn: int = 0, branch: str | None = None
) -> str:
    """The ledger account of the run on checkpoint thread ``thread_id``.

    A thread holds a conversation of runs, so the account is named from the thread and the
    run's place in it (``turn``: how many runs the thread held before it, 0 for its first, whose
    account is named from the thread alone) — a field a caller can write (the run id, the
    tenant) cannot move a run to another account, and no state update can write a run's place
    (see ``graph.record``); ``run_id`` names it only when there is no thread (no checkpointer).
    The identity (tenant, principal) is recorded *in* the account: a state update that rewrites
    it lands on this account, whose owner then differs. A run invoked from a parent graph's
    node shares the parent's thread under a checkpoint ``namespace`` of its own, which names its
    account too (a top-level run's is ``""``).
    """
    at = () if turn == 0 else (f"turn:{turn}",)
    if branch is not None:
        at = (*at, f"fork:{branch}")
    if thread_id and namespace:
        return f"run:{_hashed('thread', thread_id, namespace, *at)}"
    if thread_id:
        return f"run:{_hashed('thread', thread_id, *at)}"
    return f"run:{_hashed('run', run_id)}"


def task_run_id(thread_id: str, task_namespace: str) -> str:
    """The run id of a run whose start names none, from the thread and the namespace of the
    task that starts it: LangGraph derives a task's id from the checkpoint it runs after, so
    the first step run again after a crash names the same run, and a run started on the same
    thread id elsewhere (another checkpointer) another."""
    return f"run-{_hashed('task-run', thread_id, task_namespace)[:16]}"


def conversation_account_name(tenant_id: str, thread_id: str) -> str:
    """The ledger account a conversation (checkpoint thread ``thread_id``) of tenant
    ``tenant_id`` shares between its runs: a hash of both, so no tenant names another's."""
    return f"conversation:{_digest('conversation', tenant_id, thread_id)}"


def run_tag(run_id: str) -> str:
    """The run an account was opened for, as its owner records it: a hash, since a run id is
    the caller's text and an owner holds only clean names."""
    return _digest("run-id", run_id)


def step_key(account: str, step: int) -> str:
    """The reservation of model step ``step`` (1-based) of the run's ``account``."""
    return f"{account}:step:{step}"


def overage_key(account: str, step: int) -> str:
    """Usage a step reported beyond its reserved estimate."""
    return f"{account}:step:{step}:over"


def call_key(account: str, call_id: str, attempt: int) -> str:
    """The budget reservation of attempt ``attempt`` of tool call ``call_id``."""
    return f"{account}:call:{_digest(call_id)}:{attempt}"


def started_key(account: str, call_id: str, attempt: int) -> str:
    """The durable marker that attempt ``attempt`` of ``call_id`` started (zero amounts).

    Written before the tool runs: finding it on a re-run means an earlier attempt started and
    never reported, so its effect may have happened.
    """
    return f"{call_key(account, call_id, attempt)}:started"


def claim_key(thread_id: str, namespace: str, run_id: str, call_id: str) -> str:
    """The durable marker (zero amounts) that run ``run_id`` of checkpoint thread ``thread_id``
    claimed call id ``call_id`` before its first attempt started.

    Named from the thread and the run, not the run's account: a fork of a run (time travel to
    one of its checkpoints) keeps its run id on an account of its own, and a call id it
    re-proposes that another branch of the run claimed (it ran, or may have) is held by that
    branch's account, so the ledger refuses it here (``LedgerConflict``) and it never runs
    twice, whichever branch asks. A later run of the conversation has a run id of its own: a
    model that numbers its calls from 1 in each run (a scripted or fake model) is not refused.
    """
    return f"thread:{_digest('claims', thread_id, namespace, run_id)}:call:{_digest(call_id)}"


def is_claim_key(key: str) -> bool:
    """Whether ``key`` is a thread's claim of a call id (:func:`claim_key`): kept when a
    process-local ledger forgets an ended run's markers, since a fork may still ask."""
    return key.startswith("thread:") and ":call:" in key


def completed_key(account: str, call_id: str) -> str:
    """The durable marker (zero amounts) that the task call ``call_id`` accepted was shown done.

    Written by the execute node before the completion receipt, only on verified evidence: a
    receipt in state is a caller's ``update_state`` away from forged, so a final answer counts
    accepted work done only when the ledger holds this marker.
    """
    return f"{account}:done:{_digest(call_id)}"


def result_key(account: str, call_id: str) -> str:
    """The durable marker (zero amounts) that the tool of call ``call_id`` returned a result
    (completed, or accepted with a task id).

    Written by the execute node before the call's attempt is settled, only for a result the
    tool itself returned: an observation in state is a caller's ``update_state`` away from
    forged, so a citation names, and a dependency waits on, only a call the ledger marks so.
    """
    return f"{account}:result:{_digest(call_id)}"


def approver_key(account: str, principal_id: str) -> str:
    """The durable marker (zero amounts) that principal ``principal_id``, not the requester,
    answered an approval of the run's ``account``.

    Written by the approve node once the answer is taken: a later node of the run acts for the
    requester (with the capabilities the account recorded) only for a caller the ledger marks
    so, never for one a ``approved_by`` in state names (a caller's ``update_state`` away from
    forged).
    """
    return f"{account}:approver:{_digest(principal_id)}"
