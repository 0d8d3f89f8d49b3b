"""The threads sync tool bodies run on: a bounded share for each tenant, a bounded total.

A thread cannot be stopped, so a body past its deadline keeps its thread: it is *abandoned*
(left behind). How many threads bodies may hold:

- **A tenant's share.** A tenant's healthy bodies (not abandoned) run on at most ``base`` (32)
  threads at once, and its abandoned ones do not count against that, so bodies it left behind
  do not consume the capacity its healthy tools need; but one tenant never holds more than
  ``tenant_cap`` (64) threads in all. Past that its next call waits for one of its own threads
  while some of its bodies are healthy (each returns or is abandoned by its deadline), and fails
  at once as ``unavailable`` when all of them are abandoned. It never runs.
- **The process's total.** Never more than ``cap`` (256) threads in all. At the total a call
  waits while some body is healthy, and fails at once as ``unavailable`` when none is.
- So tenant A's hung bodies, inside their timeout or left behind, take from A's share only:
  ``cap - tenant_cap`` threads stay for everyone else, and tenant B's healthy tool starts at
  once whatever A does. Idle threads are kept up to ``base``; the rest end when their body does.

Which share a body takes from is keyed by the tenant id of the run's trusted ``RunContext`` —
a name the caller chooses, so the rule for it:

- It is the one name the caller vouches for (invariant 5: from the caller on every invoke, never
  from the model or the arguments; a caller passing another tenant's id already acts as that
  tenant). Run, thread and call ids key nothing here: a share per run would let one tenant's
  many runs take the total (8 runs of 32 hung bodies were the 256 the cap allows).
- The map holds counts only: nothing is cached or read under a name. An entry exists only while
  its tenant has a body on a thread or a call waiting for one, so it never outgrows the threads
  and the waiting calls, however many tenant ids have been seen.
- A caller minting tenant ids gets a share for each, so a few minted ids whose bodies all hang
  (``cap // tenant_cap`` = 4) can take the whole total, and then every call fails fast. The
  total protects the process (its threads); the shares protect tenants from each other where
  the caller derives tenant ids from who is calling, as invariant 5 asks of it anyway.

See :mod:`fencepost.graph.containment.tools` for how a call is run and judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from fencepost.graph.containment.waiting import thread_wait_seconds, within
from fencepost.policy import ErrorCode
from fencepost.policy.error_codes import failure_code_for

__all__ = [
    "BlockingJob",
    "Job",
    "Left",
    "LoopJob",
    "Outcome",
    "ToolThreads",
    "pool",
    "returned",
]

_BASE_THREADS = 32
"""A tenant's healthy bodies at once; also the idle threads kept."""
_TENANT_THREADS = 64
"""A tenant's bodies on threads at once, abandoned ones included."""
_MAX_THREADS = 256
"""The process's threads for tool bodies, all tenants together."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a body ended: its value, or a safe code, and when."""

    value: Any = None
    error: ErrorCode | None = None
    finished: float = 0.0
    """``time.monotonic()`` when the body returned or failed."""


def returned(value: Any) -> Outcome:
    """The outcome of a body that returned ``value``."""
    if inspect.isawaitable(value):
        # A body that hands back an awaitable did not do its work; nothing will ever await it.
        if inspect.iscoroutine(value):
            value.close()
        return Outcome(error=ErrorCode.INTERNAL_ERROR, finished=time.monotonic())
    return Outcome(value=value, finished=time.monotonic())


# ---------------------------------------------------------------------------------------------
# Sync bodies: a bounded pool whose capacity abandoned threads cannot consume
# ---------------------------------------------------------------------------------------------


class _Share:
    """One tenant's bodies on threads, and its calls waiting for one (per caller)."""

    __slots__ = ("abandoned", "running", "waiters")

    def __init__(self) -> None:
        self.running = 0
        """Bodies on threads, abandoned ones included."""
        self.abandoned = 0
        self.waiters: dict[object, deque[Callable[[], None]]] = {}
        """Calls waiting for a thread, queued per caller (an event loop, or a blocked thread)."""


class Job:
    """One sync body: run by a worker thread, its outcome handed to the caller by ``notify``
    (onto the caller's loop, or to a blocked caller's lock) once its thread is back in the
    pool."""

    def __init__(
        self, fn: Callable[[], Any], notify: Callable[[Outcome], None], tenant: str
    ) -> None:
        self.fn = fn
        self.notify = notify
        self.tenant = tenant
        self.finished = False
        self.abandoned = False
        self.started = False
        """Set under the pool's lock as a worker takes the job: from then on its body runs."""
        self.withdrawn = False
        """Set under the pool's lock when its caller stopped waiting before a worker took it:
        then its body never starts (a loaded machine may take a thread past the deadline)."""
        self.outcome: Outcome | None = None
        self.slot_returned = False
        """Set under the pool's lock when handing the job failed before any worker took it: its
        slot was given back then, so the worker that takes it after all counts nothing."""

    blocks_caller = False
    """Whether its caller blocks its thread until it ends (no event loop to keep running)."""

    def discard(self) -> None:
        """A withdrawn job, as its worker takes it: the body is dropped, never called."""
        del self.fn

    def run(self) -> None:
        try:
            outcome = returned(self.fn())
        except BaseException as exc:  # contained: a tool cannot end its worker, or the process
            outcome = Outcome(error=failure_code_for(exc), finished=time.monotonic())
        del self.fn
        self.outcome = outcome  # read by the caller once `finished` is set under the pool's lock


class LoopJob(Job):
    """A job whose caller awaits ``future`` on its event loop."""

    def __init__(self, fn: Callable[[], Any], loop: asyncio.AbstractEventLoop, tenant: str) -> None:
        self.future: asyncio.Future[Outcome | None] = loop.create_future()
        """The outcome; None if its caller stopped waiting first (``settled_within``)."""
        super().__init__(fn, partial(_on_loop, loop, _deliver, self.future), tenant)


class BlockingJob(Job):
    """A job whose caller blocks its thread in :meth:`wait` (the sync graph: no event loop)."""

    blocks_caller = True

    def __init__(self, fn: Callable[[], Any], tenant: str) -> None:
        # A lock released once as the job ends: one C call on each side (an Event's condition
        # costs several Python-level lock operations on both threads, per call).
        self._ended = threading.Lock()
        self._ended.acquire()
        super().__init__(fn, self._notified, tenant)

    def _notified(self, _: Outcome) -> None:
        self._ended.release()

    def wait(self, seconds: float) -> bool:
        """Block up to ``seconds`` for the job's end; whether it ended (at most once true)."""
        return self._ended.acquire(timeout=thread_wait_seconds(seconds))


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    # A RuntimeError: the caller's loop is closed, nobody is waiting any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def _deliver(future: asyncio.Future[Any], outcome: Outcome) -> None:
    if not future.done():
        future.set_result(outcome)


def _wake(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)


class _Worker:
    """One tool thread: parked between jobs, handed one job at a time (:meth:`give`)."""

    def __init__(self, pool: ToolThreads) -> None:
        self.pool = pool
        self.jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        # Daemon: an abandoned body may never return, and must not hold the interpreter's exit.
        self.thread = threading.Thread(target=self._work, name="fencepost-tool", daemon=True)
        self.bell = _bell(self)
        self.on_bell = False
        """Whether it parks on its bell (its last caller blocked), else on its queue. Set by
        the worker before the pool's lock puts it back in the idle list, read by the caller
        that takes it from there: both sides agree on how it is woken."""

    def give(self, job: Job) -> None:
        """Hand ``job`` to this thread (parked, or not started yet)."""
        try:
            self.jobs.put(job)
        finally:
            # Rung even if the caller is interrupted right after the put: a job in the queue
            # always gets its worker, which drops it if its caller withdrew it.
            if self.on_bell and self.bell is not None:
                _ring(self.bell)

    def _next(self) -> Job:
        if self.on_bell and self.bell is not None:
            # Rung after the put, so the queue holds the job by the time the wait returns.
            os.eventfd_read(self.bell)
        return self.jobs.get()

    def _work(self) -> None:
        try:
            job: Job | None = self._next()
            while job is not None:
                ran = self.pool._begin(job)
                if ran:
                    job.run()
                else:
                    job.discard()
                self.on_bell = job.blocks_caller
                keep = self.pool._finished(self, job)
                # The caller hears only now, with this thread back in the pool: its next call
                # takes this thread rather than starting another, and the woken caller does not
                # wait for the GIL while this thread does the pool's bookkeeping.
                if ran and job.outcome is not None:
                    job.notify(job.outcome)
                del job
                job = self._next() if keep else None
        finally:
            # Not in the idle list any more: nobody rings it again.
            _close_bell(self)


# A worker whose last caller blocked for it (the sync graph) parks on an eventfd rather than on
# its queue's lock, as that caller is likely its next. Such a caller is about to block anyway,
# and rings it from ``os.eventfd_write``, which lets go of the GIL before it wakes the worker:
# woken through a lock (released with the GIL held), the worker often ran at once on the
# caller's core, found the GIL still held by the caller it had just preempted, and slept again
# until the caller blocked — per hop, about three context switches where one does. A caller on
# an event loop is not about to block: letting go of the GIL mid-step hands it to the worker
# while the loop may have other work ready (in-graph ``ainvoke`` A/Bs of it were inconclusive),
# so a worker whose last caller was a loop parks on its queue, woken by the put, as before.
# Where eventfd is missing or refused, every worker parks on its queue.
_belled: weakref.WeakSet[_Worker] = weakref.WeakSet()
"""The workers with a bell open: a forked child closes its copies (those workers do not exist
there) and takes the bells off them, so a worker object of the parent's never rings a
descriptor the child has since reused."""
_bells_lock = threading.Lock()


def _bell(worker: _Worker) -> int | None:
    make = getattr(os, "eventfd", None)
    if make is None:
        return None
    try:
        fd: int = make(0, os.EFD_CLOEXEC | os.EFD_SEMAPHORE)
    except OSError:  # out of descriptors: this worker is woken through its queue instead
        return None
    with _bells_lock:
        _belled.add(worker)
    return fd


def _ring(fd: int) -> None:
    os.eventfd_write(fd, 1)


def _close_bell(worker: _Worker) -> None:
    with _bells_lock:
        fd, worker.bell = worker.bell, None
        _belled.discard(worker)
    if fd is not None:
        os.close(fd)


class _NoSlot(enum.Enum):
    FULL = "full"
    """Abandoned bodies fill what this call may take: fail fast, do not queue."""
    WAIT = "wait"
    """What this call may take is busy with healthy bodies: wait for a thread until the deadline."""


class Left(enum.Enum):
    """What became of a job its caller stopped waiting for (:meth:`ToolThreads.abandon`)."""

    WITHDRAWN = "withdrawn"
    """No worker had taken it: its body never starts."""
    ABANDONED = "abandoned"
    """Its body is running: left behind on its thread (it may still act)."""
    FINISHED = "finished"
    """Its body had already ended: its outcome is on its way to the caller."""


class _Slot(NamedTuple):
    share: _Share
    worker: _Worker | None
    """An idle worker, or None for a new thread."""


class ToolThreads:
    """Threads for sync tool bodies: per tenant, ``base`` healthy bodies at once and never more
    than ``tenant_cap`` in all; never more than ``cap`` for all tenants together."""

    def __init__(
        self,
        base: int = _BASE_THREADS,
        cap: int = _MAX_THREADS,
        tenant_cap: int = _TENANT_THREADS,
    ) -> None:
        if not 0 < base <= tenant_cap <= cap:
            raise ValueError("tool threads: need 0 < base <= tenant_cap <= cap")
        self.base = base
        self.cap = cap
        self.tenant_cap = tenant_cap
        self._lock = threading.Lock()
        self._running = 0
        """Bodies in progress, abandoned ones included."""
        self._abandoned = 0
        self._idle: list[_Worker] = []
        self._shares: dict[str, _Share] = {}
        """Per tenant id, only while it has a body on a thread or a call waiting for one."""
        self._waiting: dict[str, _Share] = {}
        """The shares with calls waiting: the ones a freed or abandoned thread may wake."""

    def stats(self) -> tuple[int, int]:
        """(bodies running, of which abandoned)."""
        with self._lock:
            return self._running, self._abandoned

    def tenants(self) -> dict[str, tuple[int, int]]:
        """Per tenant holding a share now: (bodies running, of which abandoned)."""
        with self._lock:
            return {t: (s.running, s.abandoned) for t, s in self._shares.items()}

    def _room(self, share: _Share) -> _NoSlot | None:
        """Under the lock: None if a body of ``share``'s tenant may start now, else why not."""
        own = share.running < min(self.base + share.abandoned, self.tenant_cap)
        total = self._running < self.cap
        if own and total:
            return None
        # Wait only for a thread that is sure to come back: a healthy body returns, or is
        # abandoned, by its deadline (which wakes the waiters to judge again).
        if not own and share.running == share.abandoned:
            return _NoSlot.FULL
        if not total and self._running == self._abandoned:
            return _NoSlot.FULL
        return _NoSlot.WAIT

    def _slot(
        self, tenant: str, wake: Callable[[], None] | None = None, caller: object = None
    ) -> _Slot | _NoSlot:
        """Take a slot for a body of ``tenant``. Else say why not; when it is worth waiting,
        ``wake`` (if given) is called once a slot may have freed up."""
        with self._lock:
            share = self._shares.get(tenant)
            if share is None:
                share = self._shares[tenant] = _Share()
            why = self._room(share)
            if why is None:
                self._running += 1
                share.running += 1
                return _Slot(share, self._idle.pop() if self._idle else None)
            if why is _NoSlot.WAIT and wake is not None:
                share.waiters.setdefault(caller, deque()).append(wake)
                self._waiting[tenant] = share
            else:
                self._drop_if_idle(tenant, share)
            return why

    def _drop_if_idle(self, tenant: str, share: _Share) -> None:
        """Under the lock: forget a tenant with nothing on a thread and nothing waiting."""
        if share.running == 0 and not share.waiters and self._shares.get(tenant) is share:
            del self._shares[tenant]

    def _stop_waiting(
        self, tenant: str, wake: Callable[[], None], caller: object, *, woken: bool
    ) -> None:
        """A waiter leaves the queue. One that was woken for a slot and gives up anyway (its
        deadline, its cancellation) passes the wake-up on, so a free slot never goes unclaimed."""
        with self._lock:
            share = self._shares.get(tenant)
            queue = share.waiters.get(caller) if share is not None else None
            if share is not None and queue is not None and wake in queue:
                queue.remove(wake)
                if not queue:
                    del share.waiters[caller]
                if not share.waiters:
                    self._waiting.pop(tenant, None)
                self._drop_if_idle(tenant, share)
                return  # never woken
            if share is not None:
                self._drop_if_idle(tenant, share)
        if not woken:
            self._wake_callers()

    async def start(self, fn: Callable[[], Any], deadline: float, tenant: str) -> LoopJob | None:
        """Hand ``fn`` to a thread from ``tenant``'s share; None when no thread could take it
        (it never ran)."""
        loop = asyncio.get_running_loop()
        slot = self._slot(tenant)
        while slot is _NoSlot.WAIT:
            waiter: asyncio.Future[None] = loop.create_future()
            wake = partial(_on_loop, loop, _wake, waiter)
            slot = self._slot(tenant, wake, loop)
            if slot is not _NoSlot.WAIT:
                break
            woken = False
            try:
                remaining = deadline - time.monotonic()
                woken = remaining > 0 and await within(waiter, remaining)
            finally:
                self._stop_waiting(tenant, wake, loop, woken=woken)
            if not woken:
                return None
            slot = self._slot(tenant)
        if not isinstance(slot, _Slot):
            return None  # full: only bodies left behind stand in its way
        job = LoopJob(fn, loop, tenant)
        return job if self._hand(job, slot) else None

    def start_blocking(
        self, fn: Callable[[], Any], deadline: float, tenant: str
    ) -> BlockingJob | None:
        """As :meth:`start`, for a caller with no event loop: waits for a slot by blocking."""
        slot = self._slot(tenant)
        while slot is _NoSlot.WAIT:
            freed = threading.Event()
            slot = self._slot(tenant, freed.set, freed)
            if slot is not _NoSlot.WAIT:
                break
            woken = False
            try:
                remaining = deadline - time.monotonic()
                woken = remaining > 0 and freed.wait(thread_wait_seconds(remaining))
            finally:
                self._stop_waiting(tenant, freed.set, freed, woken=woken)
            if not woken:
                return None
            slot = self._slot(tenant)
        if not isinstance(slot, _Slot):
            return None
        job = BlockingJob(fn, tenant)
        return job if self._hand(job, slot) else None

    def _hand(self, job: Job, slot: _Slot) -> bool:
        worker = slot.worker
        try:
            if worker is None:
                worker = _Worker(self)
                worker.give(job)
                worker.thread.start()
            else:
                worker.give(job)
        except BaseException as exc:
            if worker is not None and worker.thread.ident is None:
                _close_bell(worker)  # its thread never started: nothing else will close it
            # No thread could be started — or the caller was interrupted (Ctrl-C) while one
            # started, after the job was queued: a worker may take it after all. One that
            # already has it releases the slot when it ends; otherwise the job is withdrawn (a
            # worker that takes it drops it, counting nothing) and the slot given back now.
            with self._lock:
                taken = job.started
                if not taken:
                    job.withdrawn = job.slot_returned = True
                    self._running -= 1
                    slot.share.running -= 1
                    self._drop_if_idle(job.tenant, slot.share)
            self._wake_callers()
            if not isinstance(exc, Exception):
                raise  # the caller's own interruption is its to handle, never swallowed
            return taken
        return True

    def _begin(self, job: Job) -> bool:
        """Called by a worker as it takes ``job``: True to run its body, False if its caller
        withdrew it first. The one place a body is let start, under the lock ``abandon`` takes,
        so a call its caller gave up on never starts behind its back."""
        with self._lock:
            if job.withdrawn:
                return False
            job.started = True
            return True

    def abandon(self, job: Job) -> Left:
        """Stop waiting for ``job``: withdrawn if no worker has taken it yet (its body never
        starts), else left behind (its thread no longer counts against its tenant's healthy
        share), unless it has finished."""
        with self._lock:
            if job.finished:
                return Left.FINISHED
            if not job.started:
                # Its slot stays taken until the worker drops it: that worker is on its way.
                job.withdrawn = True
                return Left.WITHDRAWN
            if job.abandoned:
                return Left.ABANDONED
            job.abandoned = True
            self._abandoned += 1
            self._shares[job.tenant].abandoned += 1
        self._wake_callers()
        return Left.ABANDONED

    def _finished(self, worker: _Worker, job: Job) -> bool:
        """Called by ``worker`` after ``job``: True to park and wait for more work."""
        with self._lock:
            job.finished = True
            if job.slot_returned:
                keep = len(self._idle) < self.base
                if keep:
                    self._idle.append(worker)
                return keep
            share = self._shares[job.tenant]
            self._running -= 1
            share.running -= 1
            if job.abandoned:
                self._abandoned -= 1
                share.abandoned -= 1
            self._drop_if_idle(job.tenant, share)
            keep = len(self._idle) < self.base
            if keep:
                self._idle.append(worker)
            waiting = bool(self._waiting)  # a waiter registers under this lock: none missed
        if waiting:
            self._wake_callers()
        return keep

    def _wake_callers(self) -> None:
        # A thread freed, or one was abandoned: in each tenant's queue that may now take a
        # thread, the first waiter of each caller is woken; where its calls can only fail, all
        # are. Waking all cost O(waiters) a call (1,000 runs on one loop: ~5% of calls missed
        # their deadline waiting); waking one in all could send the only wake-up to a loop a
        # tenant's tool is blocking, or to a tenant that still has no room.
        wakes: list[Callable[[], None]] = []
        with self._lock:
            for tenant, share in list(self._waiting.items()):
                why = self._room(share)
                if why is _NoSlot.WAIT:
                    continue
                for caller, queue in list(share.waiters.items()):
                    if why is _NoSlot.FULL:
                        wakes.extend(queue)
                        queue.clear()
                    else:
                        wakes.append(queue.popleft())
                    if not queue:
                        del share.waiters[caller]
                if not share.waiters:
                    del self._waiting[tenant]
                    self._drop_if_idle(tenant, share)
        for wake in wakes:
            wake()


_threads = ToolThreads()


def pool() -> ToolThreads:
    """The process's pool (a forked child's own, in a child)."""
    return _threads


def _new_pool_in_child() -> None:
    # The parent's workers do not exist in a forked child, and its lock may be held forever.
    global _threads, _bells_lock
    _bells_lock = threading.Lock()
    for worker in list(_belled):
        fd, worker.bell = worker.bell, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # the child's copy: the parent's workers keep theirs
    _belled.clear()
    _threads = ToolThreads(_threads.base, _threads.cap, _threads.tenant_cap)


os.register_at_fork(after_in_child=_new_pool_in_child)
