"""A durable :class:`~fencepost.policy.ledger.Ledger` in Postgres, for many machines.

Every operation is ONE statement, ``SELECT * FROM fencepost_ledger_<op>(...)``, sent on an
autocommit connection: one round trip, one transaction. The functions are PL/pgSQL, created by
:meth:`PostgresLedger.setup`. ``fencepost_ledger_reserve`` returns an earlier reservation of the
same key first (idempotency before anything else), walks the parent chain, locks the chain's
account rows (``FOR NO KEY UPDATE``, always in name order, so two reservations sharing an ancestor
are serialised and no two transactions wait on each other in a cycle), refuses a closed account,
checks room on every account of the chain (nearest first), inserts the reservation, charges the
chain and returns the account's balance. An idempotency key two transactions insert at once is
settled by the primary key: the loser returns the winner's reservation marked ``existing``.

Each entry function runs with ``plan_cache_mode = force_generic_plan``: every statement in it
is a primary-key lookup or a join on one, which a generic plan does as well as a custom one, and
under the default PL/pgSQL planned several statements again at every call (a third of a
reservation's server time; more with many accounts, where the estimates move).

The functions read and lock; the rules that need no lock (validation, same terms on reopening,
which exception to raise) stay in Python, shared with the other backends through
:mod:`fencepost.policy.ledger`. The contract suite runs every rule on this backend and compares a
mixed run with the in-memory reference.

Sync methods use a :class:`psycopg_pool.ConnectionPool`. Async twins use
:class:`psycopg.AsyncConnection`, a small set of idle connections per event loop (an
``AsyncConnectionPool`` runs background tasks on the loop that opened it, and would have to be
closed inside that loop; a ledger outlives loops: ``asyncio.run`` per call, a test per loop).
Nothing blocking runs on the event loop's thread.

Tables, the result type and the functions are created in the connection's ``search_path`` on
construction; a database made by the first version (tables only) is migrated in place (two
columns added). :meth:`setup` is idempotent and safe to run from many processes at once; a role
without CREATE can use a database that is already set up. Amounts are ``double precision``.

Example::

    with PostgresLedger("postgresql://app@db/ledger") as ledger:
        ledger.open_account("tenant", {"tool_calls": 100})
        ledger.open_account("run-1", {"tool_calls": 60}, parent="tenant")
        ledger.reserve("run-1", "call-0001", {"tool_calls": 1})
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from psycopg import AsyncConnection, Connection, errors, pq
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from fencepost.adapters._ledger_sql import (
    ACCOUNT_COLUMNS,
    SCHEMA,
    SCOPE_INSERT,
    SCOPE_REVOKE,
    TABLES,
    decode_owner,
    encode_owner,
    read_scope,
    scope_query,
    scope_row,
)
from fencepost.policy.deadline import Clock, SystemClock
from fencepost.policy.ledger import (
    AccountClosed,
    Attempt,
    Balance,
    Ledger,
    LedgerConflict,
    Reservation,
    ReservationStatus,
    UnknownAccount,
    UnknownReservation,
    check_same_terms,
    exhausted,
    validate_amounts,
    validate_name,
    validate_owner,
    validate_windows,
    window_uses,
)
from fencepost.policy.remembered import ApprovalScope, ScopeStore, utc
from fencepost.policy.windows import ROLLING_STEPS, Window, stored_terms, stored_window

__all__ = ["PostgresLedger"]

_Conn = Connection[TupleRow]
_AConn = AsyncConnection[TupleRow]

# Serialises concurrent ``setup`` calls: CREATE TABLE IF NOT EXISTS is not safe under a race.
_SETUP_LOCK = 0x6665_6E63_6570_6F73  # "fencepos"

SCHEMA_VERSION = 10
"""Bumped whenever the functions change; ``setup`` (re)creates them when the database is older."""

# The result type of the version-9 functions, unchanged (a session of an older client holds
# plans for it), and the one every function of this version returns: the same fields and the
# spend windows' (what refused, and the balance's windows).
_OLD_FIELDS = """\
    outcome text,
    r_account text,
    r_status text,
    r_axes text[],
    r_amounts double precision[],
    b_account text,
    b_parent text,
    b_owner text,
    b_closed text,
    b_limit_axes text[],
    b_limit_amounts double precision[],
    b_held_axes text[],
    b_held_amounts double precision[],
    e_account text,
    e_axis text,
    e_limit double precision,
    e_requested double precision,
    e_reason text\
"""

_RESULT = f"""
CREATE TYPE fencepost_ledger_result AS (
{_OLD_FIELDS}
)
"""
_OUTCOME = f"""
CREATE TYPE fencepost_ledger_outcome AS (
{_OLD_FIELDS},
    e_w_kind text,
    e_w_seconds double precision,
    e_w_tz text,
    b_w_axes text[],
    b_w_limits double precision[],
    b_w_kinds text[],
    b_w_seconds double precision[],
    b_w_tzs text[],
    b_w_held double precision[]
)
"""

# Outcomes: ok | existing | missing | unknown_account | unknown_reservation | conflict |
# exhausted | closed | invalid_actual. Every function reads under the caller's search_path.
_FUNCTIONS = (
    # The bucket usage made at p_at is counted in, and the oldest bucket a window counts at
    # p_now: the rules of fencepost.policy.windows.Window.bucket and .since, in SQL (our own
    # integer constant is the only thing formatted in).
    f"""
    CREATE OR REPLACE FUNCTION fencepost_ledger_bucket(
        p_kind text, p_seconds double precision, p_tz text, p_at double precision
    ) RETURNS double precision LANGUAGE sql STABLE AS $$
        SELECT CASE WHEN p_kind = 'rolling'
            THEN floor(p_at / (p_seconds / {ROLLING_STEPS})) * (p_seconds / {ROLLING_STEPS})
            ELSE extract(epoch FROM
                date_trunc(p_kind, to_timestamp(p_at) AT TIME ZONE p_tz) AT TIME ZONE p_tz
            )::double precision
        END
    $$
    """,  # noqa: S608
    """
    CREATE OR REPLACE FUNCTION fencepost_ledger_since(
        p_kind text, p_seconds double precision, p_tz text, p_now double precision
    ) RETURNS double precision LANGUAGE sql STABLE AS $$
        SELECT fencepost_ledger_bucket(p_kind, p_seconds, p_tz,
            CASE WHEN p_kind = 'rolling' THEN p_now - p_seconds ELSE p_now END)
    $$
    """,
    """
    CREATE OR REPLACE FUNCTION fencepost_ledger_window_held(
        p_account text, p_position integer, p_kind text, p_seconds double precision,
        p_tz text, p_now double precision
    ) RETURNS double precision LANGUAGE sql STABLE AS $$
        SELECT coalesce(sum(b.amount), 0) FROM fencepost_ledger_window_held b
         WHERE b.account = p_account AND b.position = p_position
           AND b.bucket >= fencepost_ledger_since(p_kind, p_seconds, p_tz, p_now)
    $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_with_windows(
        r fencepost_ledger_outcome, p_account text, p_now double precision
    ) RETURNS fencepost_ledger_outcome LANGUAGE plpgsql AS $$
    BEGIN
        SELECT coalesce(array_agg(w.axis ORDER BY w.position), '{}'),
               coalesce(array_agg(w.lim ORDER BY w.position), '{}'),
               coalesce(array_agg(w.kind ORDER BY w.position), '{}'),
               coalesce(array_agg(w.seconds ORDER BY w.position), '{}'),
               coalesce(array_agg(w.tz ORDER BY w.position), '{}'),
               coalesce(array_agg(fencepost_ledger_window_held(
                   w.account, w.position, w.kind, w.seconds, w.tz, p_now) ORDER BY w.position),
                   '{}')
          INTO r.b_w_axes, r.b_w_limits, r.b_w_kinds, r.b_w_seconds, r.b_w_tzs, r.b_w_held
          FROM fencepost_ledger_windows w WHERE w.account = p_account;
        RETURN r;
    END $$
    """,
    # Count p_axes/p_amounts in every window of the chain on those axes, in the buckets of p_at.
    """
    CREATE OR REPLACE FUNCTION fencepost_ledger_add_windows(
        p_chain text[], p_axes text[], p_amounts double precision[], p_at double precision
    ) RETURNS void LANGUAGE sql AS $$
        INSERT INTO fencepost_ledger_window_held AS h (account, position, bucket, amount)
        SELECT w.account, w.position, fencepost_ledger_bucket(w.kind, w.seconds, w.tz, p_at),
               sum(x.amount)
          FROM fencepost_ledger_windows w
          JOIN unnest(p_axes, p_amounts) AS x (axis, amount) ON x.axis = w.axis
         WHERE w.account = ANY (p_chain) AND x.amount <> 0
         GROUP BY 1, 2, 3
        ON CONFLICT (account, position, bucket) DO UPDATE SET amount = h.amount + excluded.amount
    $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_with_balance(
        r fencepost_ledger_outcome, p_account text, p_now double precision
    ) RETURNS fencepost_ledger_outcome LANGUAGE plpgsql AS $$
    BEGIN
        -- Three index reads, each planned once per session (a join of the three, aggregating
        -- laterally, cost twice as much at every call).
        SELECT a.name, a.parent, a.owner, a.closed
          INTO r.b_account, r.b_parent, r.b_owner, r.b_closed
          FROM fencepost_ledger_accounts a WHERE a.name = p_account;
        IF NOT FOUND THEN
            r.outcome := 'unknown_account';
            r.e_account := p_account;
            RETURN r;
        END IF;
        SELECT coalesce(array_agg(x.axis ORDER BY x.position), '{}'),
               coalesce(array_agg(x.amount ORDER BY x.position), '{}')
          INTO r.b_limit_axes, r.b_limit_amounts
          FROM fencepost_ledger_limits x WHERE x.account = p_account;
        SELECT coalesce(array_agg(x.axis ORDER BY x.axis), '{}'),
               coalesce(array_agg(x.amount ORDER BY x.axis), '{}')
          INTO r.b_held_axes, r.b_held_amounts
          FROM fencepost_ledger_held x WHERE x.account = p_account;
        RETURN fencepost_ledger_with_windows(r, p_account, p_now);
    END $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_with_reservation(r fencepost_ledger_outcome, p_key text)
    RETURNS fencepost_ledger_outcome LANGUAGE plpgsql AS $$
    BEGIN
        SELECT s.account, s.status INTO r.r_account, r.r_status
          FROM fencepost_ledger_reservations s WHERE s.key = p_key;
        SELECT coalesce(array_agg(m.axis ORDER BY m.position), '{}'),
               coalesce(array_agg(m.amount ORDER BY m.position), '{}')
          INTO r.r_axes, r.r_amounts
          FROM fencepost_ledger_reservation_amounts m WHERE m.key = p_key;
        RETURN r;
    END $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_existing(
        p_key text, p_account text, p_holder text, p_now double precision
    )
    RETURNS fencepost_ledger_outcome LANGUAGE plpgsql AS $$
    DECLARE
        r fencepost_ledger_outcome;
    BEGIN
        IF p_holder <> p_account THEN
            r.outcome := 'conflict';
            RETURN r;
        END IF;
        r := fencepost_ledger_with_reservation(r, p_key);
        r.outcome := 'existing';
        RETURN fencepost_ledger_with_balance(r, p_account, p_now);
    END $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_reserved_before(
        p_key text, p_account text, p_now double precision
    )
    RETURNS fencepost_ledger_outcome LANGUAGE plpgsql AS $$
    -- A key reserved before comes back as it was (existing, or a conflict if another account
    -- holds it), whatever has happened to the account since; no outcome if it is new.
    DECLARE
        r fencepost_ledger_outcome;
        v_holder text;
    BEGIN
        SELECT s.account INTO v_holder FROM fencepost_ledger_reservations s WHERE s.key = p_key;
        IF FOUND THEN
            RETURN fencepost_ledger_existing(p_key, p_account, v_holder, p_now);
        END IF;
        RETURN r;
    END $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_open(
        p_account text, p_parent text, p_owner text, p_axes text[], p_amounts double precision[],
        p_w_axes text[], p_w_limits double precision[], p_w_kinds text[],
        p_w_seconds double precision[], p_w_tzs text[], p_now double precision
    ) RETURNS fencepost_ledger_outcome LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan AS $$
    DECLARE
        r fencepost_ledger_outcome;
    BEGIN
        IF p_parent IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM fencepost_ledger_accounts a WHERE a.name = p_parent) THEN
            r.outcome := 'unknown_account';
            r.e_account := p_parent;
            RETURN r;
        END IF;
        INSERT INTO fencepost_ledger_accounts (name, parent, owner)
        VALUES (p_account, p_parent, p_owner) ON CONFLICT (name) DO NOTHING;
        IF FOUND THEN
            INSERT INTO fencepost_ledger_limits (account, axis, position, amount)
            SELECT p_account, x.axis, x.n - 1, x.amount
              FROM unnest(p_axes, p_amounts) WITH ORDINALITY AS x (axis, amount, n);
            INSERT INTO fencepost_ledger_windows (account, position, axis, lim, kind, seconds, tz)
            SELECT p_account, x.n - 1, x.axis, x.lim, x.kind, x.seconds, x.tz
              FROM unnest(p_w_axes, p_w_limits, p_w_kinds, p_w_seconds, p_w_tzs)
                   WITH ORDINALITY AS x (axis, lim, kind, seconds, tz, n);
            r.outcome := 'ok';
        ELSE
            r.outcome := 'existing';
        END IF;
        RETURN fencepost_ledger_with_balance(r, p_account, p_now);
    END $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_close(p_account text, p_reason text, p_now double precision)
    RETURNS fencepost_ledger_outcome LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan AS $$
    DECLARE
        r fencepost_ledger_outcome;
    BEGIN
        UPDATE fencepost_ledger_accounts a SET closed = p_reason
         WHERE a.name = p_account AND a.closed IS NULL;
        r.outcome := 'ok';
        RETURN fencepost_ledger_with_balance(r, p_account, p_now);
    END $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_reserve(
        p_account text, p_key text, p_axes text[], p_amounts double precision[],
        p_now double precision
    ) RETURNS fencepost_ledger_outcome LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan AS $$
    DECLARE
        r fencepost_ledger_outcome;
        v_before fencepost_ledger_outcome;
        v_holder text;
        v_parent text;
        v_owner text;
        v_chain text[];
        v_name text;
        v_top text;
        v_hit record;
        v_closed_at integer;
        v_windowed boolean := false;
    BEGIN
        -- Every statement costs about as much to start as to run (a reservation's server time
        -- is mostly executor set-up), so the usual path runs as few and as small ones as it can.
        -- Idempotency first: a key reserved before is returned, even on a closed account. Read
        -- with the account's row (its parent and owner never change once opened).
        SELECT a.parent, a.owner,
               (SELECT s.account FROM fencepost_ledger_reservations s WHERE s.key = p_key)
          INTO v_parent, v_owner, v_holder
          FROM fencepost_ledger_accounts a WHERE a.name = p_account;
        IF NOT FOUND THEN
            v_before := fencepost_ledger_reserved_before(p_key, p_account, p_now);
            IF v_before.outcome IS NOT NULL THEN
                RETURN v_before;
            END IF;
            r.outcome := 'unknown_account';
            r.e_account := p_account;
            RETURN r;
        END IF;
        IF v_holder IS NOT NULL THEN
            RETURN fencepost_ledger_existing(p_key, p_account, v_holder, p_now);
        END IF;
        -- The chain, nearest first: one index read per ancestor (a recursive query cost more
        -- than the whole walk for the usual two or three accounts).
        v_chain := ARRAY[p_account];
        v_name := v_parent;
        WHILE v_name IS NOT NULL LOOP
            SELECT a.parent INTO v_top FROM fencepost_ledger_accounts a WHERE a.name = v_name;
            -- At most 1001 accounts, as the SQLite backend walks (depth 0 to 1000).
            IF NOT FOUND OR cardinality(v_chain) > 1000 THEN
                r.outcome := 'unknown_account';
                r.e_account := v_name;
                RETURN r;
            END IF;
            v_chain := v_chain || v_name;
            v_name := v_top;
        END LOOP;
        -- One lock order for every transaction: no cycle of waits. A row locked after another
        -- transaction changed it is read as committed (a close is seen); the nearest closed
        -- account of the chain is the one reported.
        FOR v_hit IN
            SELECT a.name, a.closed FROM fencepost_ledger_accounts a
             WHERE a.name = ANY (v_chain) ORDER BY a.name FOR NO KEY UPDATE
        LOOP
            IF v_hit.closed IS NOT NULL
               AND (v_closed_at IS NULL OR array_position(v_chain, v_hit.name) < v_closed_at) THEN
                v_closed_at := array_position(v_chain, v_hit.name);
                r.e_account := v_hit.name;
                r.e_reason := v_hit.closed;
            END IF;
        END LOOP;
        IF v_closed_at IS NOT NULL THEN
            -- The key may have been reserved by the transaction this one waited on for the lock
            -- (before it closed the account): what was reserved before comes back as existing.
            v_before := fencepost_ledger_reserved_before(p_key, p_account, p_now);
            IF v_before.outcome IS NOT NULL THEN
                RETURN v_before;
            END IF;
            r.outcome := 'closed';
            RETURN r;
        END IF;
        -- Each statement from here takes a new snapshot: what the transactions that held these
        -- locks before committed (a charge) is seen, and nothing else can change it meanwhile.
        -- Room is first probed with two key lookups per (account, axis) and no sort; only a
        -- request that does not fit pays for the ordered query naming what it exceeds.
        IF cardinality(p_axes) > 0 THEN
            SELECT x.name INTO v_name
              FROM (SELECT c.name, unnest(p_axes) AS axis, unnest(p_amounts) AS amount
                      FROM unnest(v_chain) AS c (name)) AS x
             WHERE coalesce((SELECT h.amount FROM fencepost_ledger_held h
                              WHERE h.account = x.name AND h.axis = x.axis), 0) + x.amount
                   > (SELECT l.amount FROM fencepost_ledger_limits l
                       WHERE l.account = x.name AND l.axis = x.axis);
            IF FOUND THEN
                SELECT c.name, x.axis, l.amount AS lim, x.amount AS req INTO v_hit
                  FROM unnest(v_chain) WITH ORDINALITY AS c (name, n)
                  CROSS JOIN unnest(p_axes, p_amounts) WITH ORDINALITY AS x (axis, amount, m)
                  JOIN fencepost_ledger_limits l ON l.account = c.name AND l.axis = x.axis
                  LEFT JOIN fencepost_ledger_held h ON h.account = c.name AND h.axis = x.axis
                 WHERE coalesce(h.amount, 0) + x.amount > l.amount
                 ORDER BY c.n, x.m LIMIT 1;
                IF FOUND THEN
                    -- As for a close: the room may be gone to this very key, reserved meanwhile.
                    v_before := fencepost_ledger_reserved_before(p_key, p_account, p_now);
                    IF v_before.outcome IS NOT NULL THEN
                        RETURN v_before;
                    END IF;
                    r.outcome := 'exhausted';
                    r.e_account := v_hit.name;
                    r.e_axis := v_hit.axis;
                    r.e_limit := v_hit.lim;
                    r.e_requested := v_hit.req;
                    -- Busy: no account of the chain would refuse were only what it spent
                    -- counted (what it holds less what reservations in flight hold).
                    -- Said in e_reason, unused by an exhaustion: the result type stays the
                    -- one that clients of the previous version hold plans for.
                    r.e_reason := CASE WHEN NOT EXISTS (
                        SELECT 1
                          FROM unnest(v_chain) AS c (name)
                          CROSS JOIN unnest(p_axes, p_amounts) AS x (axis, amount)
                          JOIN fencepost_ledger_limits l
                            ON l.account = c.name AND l.axis = x.axis
                          LEFT JOIN fencepost_ledger_held h
                            ON h.account = c.name AND h.axis = x.axis
                          LEFT JOIN fencepost_ledger_in_flight f
                            ON f.account = c.name AND f.axis = x.axis
                         WHERE coalesce(h.amount, 0) - coalesce(f.amount, 0) + x.amount
                               > l.amount) THEN 'busy' END;
                    RETURN r;
                END IF;
            END IF;
            -- Spend windows of the chain, nearest account first, each in its opening order:
            -- what each holds now plus the request must stay within its limit.
            v_windowed := EXISTS (
                SELECT 1 FROM fencepost_ledger_windows w WHERE w.account = ANY (v_chain));
            IF v_windowed THEN
                SELECT y.* INTO v_hit FROM (
                    SELECT c.n, w.position, c.name, w.axis, w.lim, x.amount AS req,
                           w.kind, w.seconds, w.tz,
                           fencepost_ledger_window_held(
                               w.account, w.position, w.kind, w.seconds, w.tz, p_now) AS held
                      FROM unnest(v_chain) WITH ORDINALITY AS c (name, n)
                      JOIN fencepost_ledger_windows w ON w.account = c.name
                      JOIN unnest(p_axes, p_amounts) AS x (axis, amount) ON x.axis = w.axis
                ) AS y WHERE y.held + y.req > y.lim ORDER BY y.n, y.position LIMIT 1;
                IF FOUND THEN
                    v_before := fencepost_ledger_reserved_before(p_key, p_account, p_now);
                    IF v_before.outcome IS NOT NULL THEN
                        RETURN v_before;
                    END IF;
                    r.outcome := 'exhausted';
                    r.e_account := v_hit.name;
                    r.e_axis := v_hit.axis;
                    r.e_limit := v_hit.lim;
                    r.e_requested := v_hit.req;
                    r.e_w_kind := v_hit.kind;
                    r.e_w_seconds := v_hit.seconds;
                    r.e_w_tz := v_hit.tz;
                    -- Busy as the other backends judge it: in-flight reservations on the
                    -- account (made moments ago, so in this window) would make the room.
                    SELECT CASE WHEN f.amount > 0 AND v_hit.held - f.amount + v_hit.req
                                     <= v_hit.lim THEN 'busy' END
                      INTO r.e_reason
                      FROM fencepost_ledger_in_flight f
                     WHERE f.account = v_hit.name AND f.axis = v_hit.axis;
                    RETURN r;
                END IF;
            END IF;
        END IF;
        -- Plain statements, not one statement of data-modifying CTEs (whose scans and joins
        -- cost more to set up than the extra statements), and none for a request of nothing.
        INSERT INTO fencepost_ledger_reservations (key, account, status)
        VALUES (p_key, p_account, 'reserved') ON CONFLICT (key) DO NOTHING;
        IF NOT FOUND THEN  -- committed by another transaction since the first look
            RETURN fencepost_ledger_reserved_before(p_key, p_account, p_now);
        END IF;
        IF cardinality(p_axes) > 0 THEN
            -- Set-returning functions in the select list run in step, element by element.
            INSERT INTO fencepost_ledger_reservation_amounts (key, axis, position, amount)
            SELECT p_key, unnest(p_axes), generate_series(0, cardinality(p_axes) - 1),
                   unnest(p_amounts);
            INSERT INTO fencepost_ledger_held AS h (account, axis, amount)
            SELECT c.name, unnest(p_axes), unnest(p_amounts) FROM unnest(v_chain) AS c (name)
            ON CONFLICT (account, axis) DO UPDATE SET amount = h.amount + excluded.amount;
            INSERT INTO fencepost_ledger_in_flight AS h (account, axis, amount)
            SELECT c.name, unnest(p_axes), unnest(p_amounts) FROM unnest(v_chain) AS c (name)
            ON CONFLICT (account, axis) DO UPDATE SET amount = h.amount + excluded.amount;
            IF v_windowed THEN
                PERFORM fencepost_ledger_add_windows(v_chain, p_axes, p_amounts, p_now);
                INSERT INTO fencepost_ledger_reservation_at (key, at) VALUES (p_key, p_now);
            END IF;
        END IF;
        r.outcome := 'ok';
        r.r_account := p_account;
        r.r_status := 'reserved';
        r.r_axes := p_axes;
        r.r_amounts := p_amounts;
        -- The balance fencepost_ledger_with_balance would return, without the call or another
        -- read of the account: parent and owner never change, and no account of the chain was
        -- closed under the lock nor can be before this commits. Limits and held in one ordered
        -- pass (two array_agg statements cost more): limits by position, then held by axis.
        r.b_account := p_account;
        r.b_parent := v_parent;
        r.b_owner := v_owner;
        r.b_limit_axes := '{}';
        r.b_limit_amounts := '{}';
        r.b_held_axes := '{}';
        r.b_held_amounts := '{}';
        FOR v_hit IN
            SELECT 0 AS t, x.position AS o, x.axis, x.amount
              FROM fencepost_ledger_limits x WHERE x.account = p_account
            UNION ALL
            SELECT 1, NULL, x.axis, x.amount
              FROM fencepost_ledger_held x WHERE x.account = p_account
            ORDER BY 1, 2, 3
        LOOP
            IF v_hit.t = 0 THEN
                r.b_limit_axes := r.b_limit_axes || v_hit.axis;
                r.b_limit_amounts := r.b_limit_amounts || v_hit.amount;
            ELSE
                r.b_held_axes := r.b_held_axes || v_hit.axis;
                r.b_held_amounts := r.b_held_amounts || v_hit.amount;
            END IF;
        END LOOP;
        IF v_windowed THEN
            RETURN fencepost_ledger_with_windows(r, p_account, p_now);
        END IF;
        RETURN r;
    END $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_charge(
        p_account text, p_key text, p_axes text[], p_amounts double precision[],
        p_now double precision, p_of text
    ) RETURNS fencepost_ledger_outcome LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan AS $$
    -- Usage already spent: held on the account and every ancestor whatever their limits and
    -- closes say. Reports the nearest account (then axis, in the request's order) left past a
    -- limit on a charged axis, in the e_ fields of an 'ok' or 'existing' outcome.
    DECLARE
        r fencepost_ledger_outcome;
        v_parent text;
        v_chain text[];
        v_name text;
        v_top text;
        v_holder text;
        v_hit record;
    BEGIN
        SELECT a.parent INTO v_parent FROM fencepost_ledger_accounts a WHERE a.name = p_account;
        IF NOT FOUND THEN
            r.outcome := 'unknown_account';
            r.e_account := p_account;
            RETURN r;
        END IF;
        v_chain := ARRAY[p_account];
        v_name := v_parent;
        WHILE v_name IS NOT NULL LOOP
            SELECT a.parent INTO v_top FROM fencepost_ledger_accounts a WHERE a.name = v_name;
            IF NOT FOUND OR cardinality(v_chain) > 1000 THEN
                r.outcome := 'unknown_account';
                r.e_account := v_name;
                RETURN r;
            END IF;
            v_chain := v_chain || v_name;
            v_name := v_top;
        END LOOP;
        -- The lock order reserve takes: a charge and a reservation on one chain serialise.
        PERFORM 1 FROM fencepost_ledger_accounts a
          WHERE a.name = ANY (v_chain) ORDER BY a.name FOR NO KEY UPDATE;
        SELECT s.account INTO v_holder FROM fencepost_ledger_reservations s WHERE s.key = p_key;
        IF FOUND THEN
            IF v_holder <> p_account THEN
                r.outcome := 'conflict';
                RETURN r;
            END IF;
            r := fencepost_ledger_with_reservation(r, p_key);
            r.outcome := 'existing';
        ELSE
            INSERT INTO fencepost_ledger_reservations (key, account, status)
            VALUES (p_key, p_account, 'settled') ON CONFLICT (key) DO NOTHING;
            IF NOT FOUND THEN  -- committed by another transaction since the first look
                RETURN fencepost_ledger_reserved_before(p_key, p_account, p_now);
            END IF;
            IF cardinality(p_axes) > 0 THEN
                INSERT INTO fencepost_ledger_reservation_amounts (key, axis, position, amount)
                SELECT p_key, unnest(p_axes), generate_series(0, cardinality(p_axes) - 1),
                       unnest(p_amounts);
                INSERT INTO fencepost_ledger_held AS h (account, axis, amount)
                SELECT c.name, unnest(p_axes), unnest(p_amounts) FROM unnest(v_chain) AS c (name)
                ON CONFLICT (account, axis) DO UPDATE SET amount = h.amount + excluded.amount;
                -- Counted in the windows at the instant of the reservation it belongs to.
                PERFORM fencepost_ledger_add_windows(v_chain, p_axes, p_amounts, coalesce(
                    (SELECT t.at FROM fencepost_ledger_reservation_at t
                       JOIN fencepost_ledger_reservations s ON s.key = t.key
                      WHERE t.key = p_of AND s.account = p_account), p_now));
            END IF;
            r.outcome := 'ok';
            r.r_account := p_account;
            r.r_status := 'settled';
            r.r_axes := p_axes;
            r.r_amounts := p_amounts;
        END IF;
        SELECT c.name, x.axis, l.amount AS lim, h.amount AS held INTO v_hit
          FROM unnest(v_chain) WITH ORDINALITY AS c (name, n)
          CROSS JOIN unnest(p_axes) WITH ORDINALITY AS x (axis, m)
          JOIN fencepost_ledger_limits l ON l.account = c.name AND l.axis = x.axis
          JOIN fencepost_ledger_held h ON h.account = c.name AND h.axis = x.axis
         WHERE h.amount > l.amount
         ORDER BY c.n, x.m LIMIT 1;
        IF FOUND THEN
            r.e_account := v_hit.name;
            r.e_axis := v_hit.axis;
            r.e_limit := v_hit.lim;
            r.e_requested := v_hit.held;
        END IF;
        RETURN fencepost_ledger_with_balance(r, p_account, p_now);
    END $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_finish(
        p_key text, p_settle boolean, p_invalid boolean,
        p_axes text[], p_amounts double precision[], p_now double precision
    ) RETURNS fencepost_ledger_outcome LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan AS $$
    DECLARE
        r fencepost_ledger_outcome;
        v_account text;
        v_chain text[] := '{}';
        v_name text;
        v_status text;
        v_at double precision;
        v_back_axes text[];
        v_back_amounts double precision[];
    BEGIN
        SELECT s.account INTO v_account FROM fencepost_ledger_reservations s WHERE s.key = p_key;
        IF NOT FOUND THEN
            r.outcome := 'unknown_reservation';
            RETURN r;
        END IF;
        -- The chain, as reserve walks it (a reservation's account and its parents exist).
        v_name := v_account;
        WHILE v_name IS NOT NULL AND coalesce(array_length(v_chain, 1), 0) <= 1000 LOOP
            v_chain := v_chain || v_name;
            SELECT a.parent INTO v_name FROM fencepost_ledger_accounts a WHERE a.name = v_name;
        END LOOP;
        PERFORM 1 FROM fencepost_ledger_accounts a
          WHERE a.name = ANY (v_chain) ORDER BY a.name FOR NO KEY UPDATE;
        SELECT s.status INTO v_status FROM fencepost_ledger_reservations s
         WHERE s.key = p_key FOR UPDATE;
        IF v_status <> 'reserved' THEN  -- an outcome is recorded once; never refunded twice
            r := fencepost_ledger_with_reservation(r, p_key);
            r.outcome := 'existing';
            RETURN fencepost_ledger_with_balance(r, v_account, p_now);
        END IF;
        IF p_invalid THEN
            r.outcome := 'invalid_actual';
            RETURN r;
        END IF;
        -- Settled or released, it is no longer in flight: what it reserved, before a
        -- settlement rewrites its amounts.
        UPDATE fencepost_ledger_in_flight f SET amount = f.amount + (-m.amount)
          FROM fencepost_ledger_reservation_amounts m
         WHERE m.key = p_key AND f.account = ANY (v_chain) AND f.axis = m.axis;
        -- What goes back to the spend windows, in the buckets the reservation was counted in
        -- (read before a settlement rewrites its amounts).
        SELECT t.at INTO v_at FROM fencepost_ledger_reservation_at t WHERE t.key = p_key;
        IF v_at IS NOT NULL THEN
            SELECT array_agg(m.axis),
                   array_agg(CASE WHEN p_settle THEN x.amount - m.amount ELSE -m.amount END)
              INTO v_back_axes, v_back_amounts
              FROM fencepost_ledger_reservation_amounts m
              LEFT JOIN unnest(p_axes, p_amounts) AS x (axis, amount) ON x.axis = m.axis
             WHERE m.key = p_key AND (NOT p_settle OR x.amount < m.amount);
            IF v_back_axes IS NOT NULL THEN
                PERFORM fencepost_ledger_add_windows(v_chain, v_back_axes, v_back_amounts, v_at);
            END IF;
        END IF;
        IF NOT p_settle THEN  -- release: refund everything
            UPDATE fencepost_ledger_held h SET amount = h.amount + (-m.amount)
              FROM fencepost_ledger_reservation_amounts m
             WHERE m.key = p_key AND h.account = ANY (v_chain) AND h.axis = m.axis;
            UPDATE fencepost_ledger_reservations s SET status = 'released' WHERE s.key = p_key;
        ELSE  -- settle: refund only what was held beyond the actual amounts
            IF p_axes IS NOT NULL THEN
                WITH refund AS (
                    SELECT m.axis, m.amount - x.amount AS back
                      FROM fencepost_ledger_reservation_amounts m
                      JOIN unnest(p_axes, p_amounts) AS x (axis, amount) ON x.axis = m.axis
                     WHERE m.key = p_key AND x.amount < m.amount
                ), kept AS (
                    UPDATE fencepost_ledger_reservation_amounts m SET amount = m.amount - f.back
                      FROM refund f WHERE m.key = p_key AND m.axis = f.axis
                )
                UPDATE fencepost_ledger_held h SET amount = h.amount + (-f.back)
                  FROM refund f WHERE h.account = ANY (v_chain) AND h.axis = f.axis;
            END IF;
            UPDATE fencepost_ledger_reservations s SET status = 'settled' WHERE s.key = p_key;
        END IF;
        r := fencepost_ledger_with_reservation(r, p_key);
        r.outcome := 'ok';
        RETURN fencepost_ledger_with_balance(r, v_account, p_now);
    END $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_get(p_key text)
    RETURNS fencepost_ledger_result LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan AS $$
    DECLARE
        r fencepost_ledger_outcome;
    BEGIN
        r := fencepost_ledger_with_reservation(r, p_key);
        r.outcome := CASE WHEN r.r_account IS NULL THEN 'missing' ELSE 'ok' END;
        RETURN fencepost_ledger_old(r);
    END $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_balance(p_account text, p_now double precision)
    RETURNS fencepost_ledger_outcome LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan AS $$
    DECLARE
        r fencepost_ledger_outcome;
    BEGIN
        r.outcome := 'ok';
        RETURN fencepost_ledger_with_balance(r, p_account, p_now);
    END $$
    """,
    # The version-9 entry points, for a client that has not upgraded: the same signatures and
    # result type, run by this version's functions at the database's clock.
    """
    CREATE FUNCTION fencepost_ledger_old(fencepost_ledger_outcome)
    RETURNS fencepost_ledger_result LANGUAGE sql IMMUTABLE AS
    'SELECT ROW(($1).outcome, ($1).r_account, ($1).r_status, ($1).r_axes, ($1).r_amounts, ($1).b_account, ($1).b_parent, ($1).b_owner, ($1).b_closed, ($1).b_limit_axes, ($1).b_limit_amounts, ($1).b_held_axes, ($1).b_held_amounts, ($1).e_account, ($1).e_axis, ($1).e_limit, ($1).e_requested, ($1).e_reason)::fencepost_ledger_result'
    """,
    """
    CREATE FUNCTION fencepost_ledger_open(
        p_account text, p_parent text, p_owner text, p_axes text[], p_amounts double precision[]
    ) RETURNS fencepost_ledger_result LANGUAGE sql AS $$
        SELECT fencepost_ledger_old(fencepost_ledger_open(
            p_account, p_parent, p_owner, p_axes, p_amounts, '{}', '{}', '{}', '{}', '{}',
            extract(epoch FROM clock_timestamp())::double precision))
    $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_close(p_account text, p_reason text)
    RETURNS fencepost_ledger_result LANGUAGE sql AS $$
        SELECT fencepost_ledger_old(fencepost_ledger_close(
            p_account, p_reason, extract(epoch FROM clock_timestamp())::double precision))
    $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_reserve(
        p_account text, p_key text, p_axes text[], p_amounts double precision[]
    ) RETURNS fencepost_ledger_result LANGUAGE sql AS $$
        SELECT fencepost_ledger_old(fencepost_ledger_reserve(
            p_account, p_key, p_axes, p_amounts,
            extract(epoch FROM clock_timestamp())::double precision))
    $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_charge(
        p_account text, p_key text, p_axes text[], p_amounts double precision[]
    ) RETURNS fencepost_ledger_result LANGUAGE sql AS $$
        SELECT fencepost_ledger_old(fencepost_ledger_charge(
            p_account, p_key, p_axes, p_amounts,
            extract(epoch FROM clock_timestamp())::double precision, NULL))
    $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_finish(
        p_key text, p_settle boolean, p_invalid boolean,
        p_axes text[], p_amounts double precision[]
    ) RETURNS fencepost_ledger_result LANGUAGE sql AS $$
        SELECT fencepost_ledger_old(fencepost_ledger_finish(
            p_key, p_settle, p_invalid, p_axes, p_amounts,
            extract(epoch FROM clock_timestamp())::double precision))
    $$
    """,
    """
    CREATE FUNCTION fencepost_ledger_balance(p_account text)
    RETURNS fencepost_ledger_result LANGUAGE sql AS $$
        SELECT fencepost_ledger_old(fencepost_ledger_balance(
            p_account, extract(epoch FROM clock_timestamp())::double precision))
    $$
    """,
    f"""
    CREATE FUNCTION fencepost_ledger_version() RETURNS integer
    LANGUAGE sql IMMUTABLE AS 'SELECT {SCHEMA_VERSION}'
    """,
)

# Arrays travel as literals (see _text_array): psycopg adapting a Python list inspects it at
# every call, more client time than the rest of the parameters together.
_OPEN = (
    "SELECT * FROM fencepost_ledger_open(%s, %s, %s, %s::text[], %s::float8[],"
    " %s::text[], %s::float8[], %s::text[], %s::float8[], %s::text[], %s)"
)
_CLOSE = "SELECT * FROM fencepost_ledger_close(%s, %s, %s)"
_RESERVE = "SELECT * FROM fencepost_ledger_reserve(%s, %s, %s::text[], %s::float8[], %s)"
_CHARGE = "SELECT * FROM fencepost_ledger_charge(%s, %s, %s::text[], %s::float8[], %s, %s::text)"
_FINISH = "SELECT * FROM fencepost_ledger_finish(%s, %s, %s, %s::text[], %s::float8[], %s)"
_GET = "SELECT * FROM fencepost_ledger_get(%s)"
_RESERVED = "SELECT * FROM fencepost_ledger_reserved_before(%s, %s, %s)"
# The combined operations: one statement, so one transaction on the autocommit connection. Each
# subquery is fenced (OFFSET 0) so its function runs once, before the one that reads its result.
_BEGIN = (
    "SELECT (c).*, (m).* FROM (SELECT c, CASE WHEN (c).outcome IN ('ok', 'existing')"
    " THEN fencepost_ledger_reserve(%s, %s, '{}'::text[], '{}'::float8[], %s) END AS m"
    " FROM (SELECT fencepost_ledger_reserve(%s, %s, '{}'::text[], '{}'::float8[], %s) AS c"
    " OFFSET 0) s OFFSET 0) t"
)
_MARK_AND_FINISH = (
    "SELECT (f).* FROM (SELECT m, fencepost_ledger_finish(%s, %s, %s, %s::text[], %s::float8[], %s)"
    " AS f FROM (SELECT fencepost_ledger_reserve(%s, %s, '{}'::text[], '{}'::float8[], %s) AS m"
    " OFFSET 0) s OFFSET 0) t"
)
_BALANCE = "SELECT * FROM fencepost_ledger_balance(%s, %s)"
# One row per axis in flight, or one row of NULLs for an account with none; none for an unknown one.
_IN_FLIGHT = (
    "SELECT f.axis, f.amount FROM fencepost_ledger_accounts a"
    " LEFT JOIN fencepost_ledger_in_flight f ON f.account = a.name WHERE a.name = %s"
)

_Call = tuple[str, tuple[Any, ...]]
"""One function call: the statement and its parameters."""

_RETRIED = (errors.DeadlockDetected, errors.SerializationFailure)


def _text_array(items: Iterable[str]) -> str:
    """A ``text[]`` literal. Every element is quoted, so none reads as NULL or splits on a comma,
    and a backslash or double quote in it is escaped."""
    quoted = (item.replace("\\", "\\\\").replace('"', '\\"') for item in items)
    return "{" + ",".join(f'"{item}"' for item in quoted) + "}"


def _float_array(values: Iterable[float]) -> str:
    """A ``float8[]`` literal: ``repr`` is the shortest text that reads back as the same double."""
    return "{" + ",".join(map(repr, values)) + "}"


# -- decoding a result row ---------------------------------------------------------------------


def _pairs(axes: Sequence[str] | None, amounts: Sequence[float] | None) -> dict[str, float]:
    return {axis: float(amount) for axis, amount in zip(axes or (), amounts or (), strict=True)}


def _balance(row: Sequence[Any], now: float) -> Balance:
    return Balance(
        account=row[5],
        parent=row[6],
        owner=decode_owner(row[7]),
        closed=row[8],
        limits=_pairs(row[9], row[10]),
        held=_pairs(row[11], row[12]),
        windows=window_uses(
            (
                (stored_window(axis, float(lim), kind, float(seconds), tz), float(held))
                for axis, lim, kind, seconds, tz, held in zip(
                    *(row[i] or () for i in range(21, 27)), strict=True
                )
            ),
            now,
        ),
    )


def _reservation(row: Sequence[Any], key: str, now: float) -> Reservation:
    return Reservation(
        account=row[1],
        key=key,
        status=ReservationStatus(row[2]),
        amounts=_pairs(row[3], row[4]),
        existing=row[0] == "existing",
        balance=_balance(row, now) if row[5] is not None else None,
    )


def _charged(row: Sequence[Any], key: str, now: float) -> Reservation:
    """A charge's reservation, with the account its e_ fields name as past a limit."""
    _raise_for(row, key)
    reservation = _reservation(row, key, now)
    if row[13] is None or row[14] is None:
        return reservation
    return reservation.model_copy(update={"exceeded": (row[13], row[14])})


def _raise_for(row: Sequence[Any], key: str | None = None, now: float | None = None) -> None:
    """Raise what the function's outcome means, as the in-memory ledger would."""
    outcome = row[0]
    if outcome == "unknown_account":
        raise UnknownAccount(row[13])
    if outcome == "unknown_reservation":
        raise UnknownReservation(key)
    if outcome == "conflict":
        raise LedgerConflict(f"key {key!r} is held by another account")
    if outcome == "closed":
        raise AccountClosed(row[13], row[17])
    if outcome == "exhausted":
        window = (
            stored_window(row[14], float(row[15]), row[18], float(row[19]), row[20])
            if row[18] is not None
            else None
        )
        raise exhausted(
            row[13],
            row[14],
            float(row[15]),
            float(row[16]),
            busy=row[17] == "busy",
            window=window,
            now=now,
        )


class _LoopConnections:
    """The idle async connections of one event loop, and a bound on those in use."""

    def __init__(self, max_size: int) -> None:
        self.idle: list[_AConn] = []
        self.slots = asyncio.Semaphore(max_size)

    def discard(self) -> None:
        """Close the idle connections without the loop (it may be closed): libpq's own close."""
        while self.idle:
            self.idle.pop().pgconn.finish()


class PostgresLedger(Ledger, ScopeStore):
    """Accounts and reservations in Postgres; atomic across connections, processes and machines.

    ``conninfo`` is a libpq connection string or URI. Sync calls take connections from a
    :class:`psycopg_pool.ConnectionPool` of ``min_size`` to ``max_size`` connections; async calls
    keep up to ``max_size`` :class:`psycopg.AsyncConnection` per event loop. :meth:`close` (or
    leaving a ``with`` block) closes both. Deadlocks and serialisation failures (which the lock
    order should rule out) are retried up to ``max_retries`` times with jitter.

    Remembered approvals (:class:`~fencepost.policy.remembered.ScopeStore`) are plain statements
    on the sync pool (their async twins run them in a worker thread): they are read once per
    call that needs approval, not on the reservation path.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        max_retries: int = 5,
        clock: Clock | None = None,
    ) -> None:
        self._clock: Clock = clock or SystemClock()
        self._conninfo = conninfo
        self._max_size = max(min_size, max_size, 1)
        self._max_retries = max(1, max_retries)
        self._closed = False
        self._loops: dict[asyncio.AbstractEventLoop, _LoopConnections] = {}
        self._loops_lock = threading.Lock()
        self._pool: ConnectionPool[_Conn] = ConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=self._max_size,
            kwargs={"autocommit": True},  # each call is one statement: its own transaction
            open=True,
            name="fencepost-ledger",
        )
        try:
            self.setup()
        except BaseException:
            self.close()
            raise

    @property
    def books(self) -> str:
        """The database, by its connection string (a name for this process, never shown)."""
        return f"postgres:{self._conninfo}"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- setup ------------------------------------------------------------------------------------

    def setup(self) -> None:
        """Create (or migrate) the tables, the result type and the functions when the database
        is older than this version. Idempotent; called on construction."""
        if self._closed:
            raise RuntimeError("the ledger is closed")
        with self._pool.connection() as conn, conn.transaction():
            if self._current(conn):
                return  # nothing to create: a role without CREATE can use the ledger
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SETUP_LOCK,))
            if self._current(conn):
                return  # another process set it up while this one waited
            for statement in SCHEMA:
                conn.execute(statement)
            for column, declaration in ACCOUNT_COLUMNS.items():
                # Our own constant names and declarations only.
                conn.execute(
                    f"ALTER TABLE fencepost_ledger_accounts ADD COLUMN IF NOT EXISTS {column} {declaration}"
                )
            # The functions depend on the type: dropping it drops an older version's functions.
            conn.execute("DROP TYPE IF EXISTS fencepost_ledger_result CASCADE")
            conn.execute("DROP TYPE IF EXISTS fencepost_ledger_outcome CASCADE")
            conn.execute("DROP FUNCTION IF EXISTS fencepost_ledger_chain(text)")
            conn.execute("DROP FUNCTION IF EXISTS fencepost_ledger_version()")
            conn.execute(_RESULT)
            conn.execute(_OUTCOME)
            for statement in _FUNCTIONS:
                conn.execute(statement)

    @staticmethod
    def _current(conn: _Conn) -> bool:
        row = conn.execute(
            "SELECT count(to_regclass(name)) = %s AND to_regproc('fencepost_ledger_version') IS NOT NULL"
            " FROM unnest(%s::text[]) AS name",
            (len(TABLES), list(TABLES)),
        ).fetchone()
        if row is None or not row[0]:
            return False
        version = conn.execute("SELECT fencepost_ledger_version()").fetchone()
        return version is not None and version[0] >= SCHEMA_VERSION

    # -- running one call -------------------------------------------------------------------------

    def _rows(self, call: _Call) -> list[Sequence[Any]]:
        """Run one plain query on a pooled connection: every row."""
        if self._closed:
            raise RuntimeError("the ledger is closed")
        with self._pool.connection() as conn:
            return list(conn.execute(call[0], call[1]).fetchall())

    async def _arows(self, call: _Call) -> list[Sequence[Any]]:
        """:meth:`_rows` on an async connection of the running loop."""
        conns = self._connections()
        async with conns.slots:
            conn = conns.idle.pop() if conns.idle else None
            if conn is None:
                conn = await AsyncConnection.connect(self._conninfo, autocommit=True)
            reusable = False
            try:
                rows = await (await conn.execute(call[0], call[1])).fetchall()
                reusable = True
            finally:
                idle = conn.info.transaction_status == pq.TransactionStatus.IDLE
                if reusable and idle and not self._closed:
                    conns.idle.append(conn)
                    if self._closed:
                        conns.discard()
                else:
                    conn.pgconn.finish()
        return list(rows)

    @staticmethod
    def _flying(rows: Sequence[Sequence[Any]], account: str) -> dict[str, float]:
        if not rows:
            raise UnknownAccount(account)
        return {row[0]: float(row[1]) for row in rows if row[0] is not None}

    def _call(self, call: _Call) -> Sequence[Any]:
        """Run one function call on a pooled connection; retry deadlocks with jitter."""
        if self._closed:
            raise RuntimeError("the ledger is closed")
        attempt = 0
        while True:
            attempt += 1
            try:
                # getconn/putconn, not connection(): its exit commits, which on an autocommit
                # connection does nothing but costs the client as much as a third of the call's
                # own work. putconn replaces a broken connection as connection() would.
                conn = self._pool.getconn()
                try:
                    row = conn.execute(call[0], call[1]).fetchone()
                finally:
                    self._pool.putconn(conn)
            except _RETRIED:
                if attempt >= self._max_retries:
                    raise
                time.sleep(random.uniform(0, 0.01 * 2**attempt))  # noqa: S311 (jitter)
                continue
            assert row is not None  # a function returning a composite always yields one row
            return row

    def _connections(self) -> _LoopConnections:
        loop = asyncio.get_running_loop()
        with self._loops_lock:
            if self._closed:
                raise RuntimeError("the ledger is closed")
            mine = self._loops.get(loop)
            if mine is None:
                for other, held in list(self._loops.items()):  # forget loops that have closed
                    if other.is_closed():
                        held.discard()
                        del self._loops[other]
                mine = self._loops[loop] = _LoopConnections(self._max_size)
            return mine

    async def _acall(self, call: _Call) -> Sequence[Any]:
        """:meth:`_call` on an async connection of the running loop."""
        conns = self._connections()
        attempt = 0
        while True:
            attempt += 1
            async with conns.slots:
                conn = conns.idle.pop() if conns.idle else None
                if conn is None:
                    conn = await AsyncConnection.connect(self._conninfo, autocommit=True)
                reusable = False
                try:
                    row = await (await conn.execute(call[0], call[1])).fetchone()
                    reusable = True
                except _RETRIED:
                    reusable = True
                    if attempt >= self._max_retries:
                        raise
                    row = None
                finally:
                    idle = conn.info.transaction_status == pq.TransactionStatus.IDLE
                    if reusable and idle and not self._closed:
                        conns.idle.append(conn)
                        if self._closed:  # closed while it was being put back
                            conns.discard()
                    else:  # broken, cancelled mid-call, or the ledger closed meanwhile
                        conn.pgconn.finish()
            if row is not None:
                return row
            await asyncio.sleep(random.uniform(0, 0.01 * 2**attempt))  # noqa: S311 (jitter)

    def close(self) -> None:
        """Close the connection pool and every idle async connection. Further calls raise
        ``RuntimeError``; an async call in flight closes its connection when it ends."""
        with self._loops_lock:
            self._closed = True
            for held in self._loops.values():
                held.discard()
            self._loops.clear()
        self._pool.close()

    # -- the calls --------------------------------------------------------------------------------

    def _now(self) -> float:
        return self._clock.now().timestamp()

    def _open_call(
        self,
        account: str,
        limits: Mapping[str, float],
        parent: str | None,
        owner: Mapping[str, str] | None,
        windows: Iterable[Window] | None,
    ) -> tuple[_Call, Balance]:
        """The call, and the terms (as a Balance with nothing held) reopening must match."""
        validate_name(account, "account")
        if parent is not None:
            validate_name(parent, "parent")
        clean = validate_amounts(limits)
        who = validate_owner(owner)
        spans = validate_windows(windows)
        axes, amounts = _text_array(clean), _float_array(clean.values())
        terms = [stored_terms(w) for w in spans]
        params = (
            account,
            parent,
            encode_owner(who),
            axes,
            amounts,
            _text_array(t[0] for t in terms),
            _float_array(t[1] for t in terms),
            _text_array(t[2] for t in terms),
            _float_array(t[3] for t in terms),
            _text_array(t[4] for t in terms),
            self._now(),
        )
        opened = Balance(
            account=account,
            parent=parent,
            limits=clean,
            owner=who,
            windows=window_uses(((w, 0.0) for w in spans), 0.0),
        )
        return (_OPEN, params), opened

    @staticmethod
    def _opened(row: Sequence[Any], call: _Call, terms: Balance) -> Balance:
        _raise_for(row)
        balance = _balance(row, call[1][-1])
        if row[0] == "existing":
            check_same_terms(
                terms.account,
                (balance.parent, balance.limits, balance.owner),
                (terms.parent, terms.limits, terms.owner),
                [use.window for use in balance.windows],
                [use.window for use in terms.windows],
            )
        return balance

    def _close_call(self, account: str, reason: str) -> _Call:
        return _CLOSE, (
            validate_name(account, "account"),
            validate_name(reason, "reason"),
            self._now(),
        )

    @staticmethod
    def _closed_balance(row: Sequence[Any], call: _Call) -> Balance:
        _raise_for(row)
        return _balance(row, call[1][-1])

    def _reserve_call(self, account: str, key: str, amounts: Mapping[str, float]) -> _Call:
        validate_name(account, "account")
        validate_name(key)
        clean = validate_amounts(amounts)
        axes, values = _text_array(clean), _float_array(clean.values())
        return _RESERVE, (account, key, axes, values, self._now())

    @staticmethod
    def _reserved(row: Sequence[Any], call: _Call, key: str) -> Reservation:
        now = call[1][-1]
        _raise_for(row, key, now)
        return _reservation(row, key, now)

    def _charge_call(
        self, account: str, key: str, amounts: Mapping[str, float], of: str | None
    ) -> _Call:
        validate_name(account, "account")
        validate_name(key)
        if of is not None:
            validate_name(of)
        clean = validate_amounts(amounts)
        axes, values = _text_array(clean), _float_array(clean.values())
        return _CHARGE, (account, key, axes, values, self._now(), of)

    @staticmethod
    def _finished(
        row: Sequence[Any], call: _Call, key: str, invalid: ValueError | None
    ) -> Reservation:
        if row[0] == "invalid_actual" and invalid is not None:
            raise invalid  # as the in-memory ledger: only a reservation still open checks it
        _raise_for(row, key)
        return _reservation(row, key, call[1][-1])

    def _settle_call(
        self, key: str, actual: Mapping[str, float] | None
    ) -> tuple[_Call, ValueError | None]:
        validate_name(key)
        now = self._now()
        if actual is None:
            return (_FINISH, (key, True, False, None, None, now)), None
        try:
            clean = validate_amounts(actual)
        except ValueError as invalid:
            return (_FINISH, (key, True, True, None, None, now)), invalid
        axes, amounts = _text_array(clean), _float_array(clean.values())
        return (_FINISH, (key, True, False, axes, amounts, now)), None

    def _release_call(self, key: str) -> _Call:
        return _FINISH, (validate_name(key), False, False, None, None, self._now())

    def _reserved_call(self, account: str, key: str) -> _Call:
        return _RESERVED, (validate_name(key), validate_name(account, "account"), self._now())

    @staticmethod
    def _found(row: Sequence[Any], call: _Call, key: str) -> Reservation | None:
        if row[0] is None:  # never reserved
            return None
        now = call[1][-1]
        _raise_for(row, key, now)
        return _reservation(row, key, now)

    def _begin_call(self, account: str, marker: str, claim: str | None) -> _Call:
        validate_name(account, "account")
        validate_name(marker)
        if claim is None:
            return _RESERVE, (account, marker, "{}", "{}", self._now())
        now = self._now()
        return _BEGIN, (account, marker, now, account, validate_name(claim), now)

    @staticmethod
    def _begun(row: Sequence[Any], call: _Call, marker: str, claim: str | None) -> Attempt:
        now = call[1][-1]
        if claim is None:
            _raise_for(row, marker, now)
            return Attempt(claimed=True, started=_reservation(row, marker, now))
        width = len(row) // 2
        claimed, started = row[:width], row[width:]
        if claimed[0] == "conflict":
            return Attempt(claimed=False)
        _raise_for(claimed, claim, now)
        _raise_for(started, marker, now)
        return Attempt(claimed=True, started=_reservation(started, marker, now))

    def _finish_attempt_call(
        self, account: str, key: str, result: str | None, actual: Mapping[str, float] | None
    ) -> tuple[_Call, ValueError | None]:
        settle, invalid = self._settle_call(key, actual)
        if result is None:
            return settle, invalid
        validate_name(account, "account")
        validate_name(result)
        return (_MARK_AND_FINISH, (*settle[1], account, result, settle[1][-1])), invalid

    @staticmethod
    def _got(row: Sequence[Any], key: str) -> Reservation | None:
        return None if row[0] == "missing" else _reservation(row, key, 0.0)

    def _balance_call(self, account: str) -> _Call:
        return _BALANCE, (validate_name(account, "account"), self._now())

    @staticmethod
    def _balanced(row: Sequence[Any], call: _Call) -> Balance:
        _raise_for(row)
        return _balance(row, call[1][-1])

    # -- the port ---------------------------------------------------------------------------------

    def open_account(
        self,
        account: str,
        limits: Mapping[str, float],
        *,
        parent: str | None = None,
        owner: Mapping[str, str] | None = None,
        windows: Iterable[Window] | None = None,
    ) -> Balance:
        call, terms = self._open_call(account, limits, parent, owner, windows)
        return self._opened(self._call(call), call, terms)

    def close_account(self, account: str, reason: str) -> Balance:
        call = self._close_call(account, reason)
        return self._closed_balance(self._call(call), call)

    def reserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        call = self._reserve_call(account, key, amounts)
        return self._reserved(self._call(call), call, key)

    def settle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        call, invalid = self._settle_call(key, actual)
        return self._finished(self._call(call), call, key, invalid)

    def charge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        call = self._charge_call(account, key, amounts, of)
        return _charged(self._call(call), key, call[1][-2])

    def release(self, key: str) -> Reservation:
        call = self._release_call(key)
        return self._finished(self._call(call), call, key, None)

    def reserved(self, account: str, key: str) -> Reservation | None:
        call = self._reserved_call(account, key)
        return self._found(self._call(call), call, key)

    def begin_attempt(self, account: str, marker: str, *, claim: str | None = None) -> Attempt:
        call = self._begin_call(account, marker, claim)
        return self._begun(self._call(call), call, marker, claim)

    def finish_attempt(
        self,
        account: str,
        key: str,
        *,
        result: str | None = None,
        actual: Mapping[str, float] | None = None,
    ) -> Reservation:
        call, invalid = self._finish_attempt_call(account, key, result, actual)
        return self._finished(self._call(call), (call[0], call[1][:6]), key, invalid)

    def get(self, key: str) -> Reservation | None:
        row = self._call((_GET, (validate_name(key),)))
        return self._got(row, key)

    def balance(self, account: str) -> Balance:
        call = self._balance_call(account)
        return self._balanced(self._call(call), call)

    # -- async twins: the same calls on an AsyncConnection ----------------------------------------

    async def aopen_account(
        self,
        account: str,
        limits: Mapping[str, float],
        *,
        parent: str | None = None,
        owner: Mapping[str, str] | None = None,
        windows: Iterable[Window] | None = None,
    ) -> Balance:
        call, terms = self._open_call(account, limits, parent, owner, windows)
        return self._opened(await self._acall(call), call, terms)

    async def aclose_account(self, account: str, reason: str) -> Balance:
        call = self._close_call(account, reason)
        return self._closed_balance(await self._acall(call), call)

    async def areserve(self, account: str, key: str, amounts: Mapping[str, float]) -> Reservation:
        call = self._reserve_call(account, key, amounts)
        return self._reserved(await self._acall(call), call, key)

    async def asettle(self, key: str, actual: Mapping[str, float] | None = None) -> Reservation:
        call, invalid = self._settle_call(key, actual)
        return self._finished(await self._acall(call), call, key, invalid)

    async def acharge(
        self, account: str, key: str, amounts: Mapping[str, float], *, of: str | None = None
    ) -> Reservation:
        call = self._charge_call(account, key, amounts, of)
        return _charged(await self._acall(call), key, call[1][-2])

    async def arelease(self, key: str) -> Reservation:
        call = self._release_call(key)
        return self._finished(await self._acall(call), call, key, None)

    async def areserved(self, account: str, key: str) -> Reservation | None:
        call = self._reserved_call(account, key)
        return self._found(await self._acall(call), call, key)

    async def abegin_attempt(
        self, account: str, marker: str, *, claim: str | None = None
    ) -> Attempt:
        call = self._begin_call(account, marker, claim)
        return self._begun(await self._acall(call), call, marker, claim)

    async def afinish_attempt(
        self,
        account: str,
        key: str,
        *,
        result: str | None = None,
        actual: Mapping[str, float] | None = None,
    ) -> Reservation:
        call, invalid = self._finish_attempt_call(account, key, result, actual)
        return self._finished(await self._acall(call), (call[0], call[1][:6]), key, invalid)

    async def aget(self, key: str) -> Reservation | None:
        row = await self._acall((_GET, (validate_name(key),)))
        return self._got(row, key)

    async def abalance(self, account: str) -> Balance:
        call = self._balance_call(account)
        return self._balanced(await self._acall(call), call)

    # -- remembered approvals ---------------------------------------------------------------------

    def _scope_rows(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if self._closed:
            raise RuntimeError("the ledger is closed")
        with self._pool.connection() as conn:
            return list(conn.execute(sql.replace("?", "%s"), params).fetchall())

    def remember_scope(self, scope: ApprovalScope) -> ApprovalScope:
        if self._closed:
            raise RuntimeError("the ledger is closed")
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(SCOPE_INSERT.replace("?", "%s"), scope_row(scope))
            row = conn.execute(
                "SELECT body, revoked_at FROM fencepost_approval_scopes WHERE scope_id = %s",
                (scope.scope_id,),
            ).fetchone()
        assert row is not None  # inserted, or there already
        return read_scope(row[0], row[1])

    def approval_scopes(
        self, tenant_id: str, *, tool_name: str | None = None, include_revoked: bool = False
    ) -> list[ApprovalScope]:
        sql, params = scope_query(tenant_id, tool_name, include_revoked)
        return [read_scope(body, revoked) for body, revoked in self._scope_rows(sql, params)]

    def revoke_scope(self, tenant_id: str, scope_id: str, *, at: datetime) -> ApprovalScope | None:
        if self._closed:
            raise RuntimeError("the ledger is closed")
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(
                SCOPE_REVOKE.replace("?", "%s"), (utc(at).isoformat(), scope_id, tenant_id)
            )
            row = conn.execute(
                "SELECT body, revoked_at FROM fencepost_approval_scopes"
                " WHERE scope_id = %s AND tenant_id = %s",
                (scope_id, tenant_id),
            ).fetchone()
        return None if row is None else read_scope(row[0], row[1])

    def in_flight(self, account: str) -> dict[str, float]:
        rows = self._rows((_IN_FLIGHT, (validate_name(account, "account"),)))
        return self._flying(rows, account)

    async def ain_flight(self, account: str) -> dict[str, float]:
        rows = await self._arows((_IN_FLIGHT, (validate_name(account, "account"),)))
        return self._flying(rows, account)
