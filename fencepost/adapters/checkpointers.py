"""LangGraph checkpointers by URL.

``memory://``, ``sqlite:///runs.db`` (relative), ``sqlite:////var/lib/runs.db`` (absolute: the
SQLAlchemy convention, four slashes), ``sqlite:///:memory:``, ``postgresql://user:pw@host/db``
(also ``postgres://``). Each opener is a context manager: it builds the saver with LangGraph's
default serializer (a checkpoint holds plain data and LangChain messages only), runs ``setup()``,
and closes its connection on exit.

``read_only=True`` opens an existing store for reading and never changes the database: the SQLite
file is opened read-only and must exist, a Postgres session is read-only, and a database without
LangGraph's checkpoint tables is refused (:class:`NotACheckpointStore`) instead of having them
created in it. ``fencepost runs``/``show``/``report`` open stores this way.

Every failure is a :class:`CheckpointerError` whose ``str()`` is one sentence of fencepost's own
with the URL's password masked (never the driver's text, which can quote hosts, users or secrets)
and whose ``code`` names the failure for machines.

Example::

    with open_checkpointer("sqlite:///runs.db") as saver:
        graph = build_agent_graph(registry, model).compile(checkpointer=saver)
        graph.invoke(start("why?"), {"configurable": {"thread_id": "t1"}}, context=ctx)
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver

__all__ = [
    "CheckpointerAuthenticationFailed",
    "CheckpointerError",
    "CheckpointerUnavailable",
    "NoSuchCheckpointDatabase",
    "NotACheckpointStore",
    "UnsupportedCheckpointerURL",
    "aopen_checkpointer",
    "checkpoint_store",
    "close_with",
    "checkpointer_errors",
    "mask_url",
    "open_checkpointer",
    "sqlite_file",
]

_SCHEMES = "memory://, sqlite:///path/to/runs.db, postgresql://user@host/db"
_CONNECT_TIMEOUT_SECONDS = 10


class CheckpointerError(Exception):
    """A checkpoint database could not be opened or read.

    ``str()`` is one sentence of fencepost's own, safe to show: the URL with its password masked,
    what failed and at most the driver error's class name. ``url`` is that masked URL.
    """

    code = "checkpointer_error"
    """A stable name for the failure (``--json`` error output uses it)."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url = url


class UnsupportedCheckpointerURL(CheckpointerError, ValueError):
    """The URL's scheme is not one fencepost opens (or a needed extra is not installed)."""

    code = "unsupported_url"


class CheckpointerUnavailable(CheckpointerError, ConnectionError):
    """The database named by the URL could not be reached, opened, set up or read."""

    code = "store_unavailable"


class NoSuchCheckpointDatabase(CheckpointerUnavailable):
    """The database does not exist (a read-only open never creates one)."""

    code = "no_such_database"


class CheckpointerAuthenticationFailed(CheckpointerUnavailable):
    """The server refused the credentials (wrong password, unknown user, no access rule)."""

    code = "authentication_failed"


class NotACheckpointStore(CheckpointerError):
    """The database exists but holds no LangGraph checkpoint tables (or is no database at all)."""

    code = "not_a_checkpoint_store"


_AUTHORITY = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<authority>[^/?#]*)(?P<rest>.*)$", re.S
)
_KV_PASSWORD = re.compile(r"(?i)(password\s*=\s*)[^\s&#]+")


def _password(url: str) -> str | None:
    """The password in the URL's authority, if any (parsed by hand: never re-assembled)."""
    match = _AUTHORITY.match(url)
    if not match or "@" not in match["authority"]:
        return None
    userinfo = match["authority"].rpartition("@")[0]
    if ":" not in userinfo:
        return None
    return userinfo.split(":", 1)[1] or None


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (in the authority or a ``password=`` pair).

    The rest of the URL is kept exactly as written (``sqlite:////abs.db`` stays four slashes).

    >>> mask_url("postgresql://app:s3cret@db:5432/runs?sslmode=require")
    'postgresql://app:***@db:5432/runs?sslmode=require'
    """
    masked = url
    match = _AUTHORITY.match(url)
    if match and _password(url) is not None:
        userinfo, _, host = match["authority"].rpartition("@")
        user = userinfo.split(":", 1)[0]
        masked = f"{match['scheme']}{user}:***@{host}{match['rest']}"
    # A password in the query string, or a key/value DSN.
    return _KV_PASSWORD.sub(r"\1***", masked)


def _kind(url: str) -> str:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        return "memory"
    if scheme == "sqlite":
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        return "postgres"
    shown = scheme or "<none>"
    raise UnsupportedCheckpointerURL(
        mask_url(url), f"unsupported scheme {shown!r} in {mask_url(url)}: use one of {_SCHEMES}"
    )


def _sqlite_path(url: str) -> str:
    rest = url.split("://", 1)[1]
    if rest in ("", "/"):
        return ":memory:"
    if not rest.startswith("/"):
        raise UnsupportedCheckpointerURL(
            mask_url(url),
            f"cannot read the path in {mask_url(url)}: "
            "a SQLite URL is sqlite:///relative.db or sqlite:////absolute.db",
        )
    path = rest[1:].split("?", 1)[0]
    return path or ":memory:"


def sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite://`` URL names (relative to the working directory when the URL has
    three slashes), or ``None`` for another scheme or an in-memory database.

    >>> sqlite_file("sqlite:///.fencepost/runs.db")
    PosixPath('.fencepost/runs.db')
    """
    if _kind(url) != "sqlite":
        return None
    path = _sqlite_path(url)
    return None if path == ":memory:" else Path(path)


class _Opened:
    """What an opener here knows of a saver it opened for writing: where it writes, and what
    to close with it (the ledger a graph built with no ledger keeps beside it)."""

    def __init__(self, kind: str, where: str) -> None:
        self.kind = kind
        self.where = where
        self.closers: list[Callable[[], object]] = []

    def close(self) -> None:
        while self.closers:
            with contextlib.suppress(Exception):
                self.closers.pop()()


# Found again from the saver object (never from a name a caller chooses): an AsyncSqliteSaver's
# aiosqlite connection does not say which file it writes, and no saver keeps its password.
_OPENED: weakref.WeakKeyDictionary[Any, _Opened] = weakref.WeakKeyDictionary()


def checkpoint_store(saver: object) -> tuple[str, str] | None:
    """Where a checkpointer :func:`open_checkpointer` or :func:`aopen_checkpointer` opened
    keeps its checkpoints: ``("sqlite", file)`` (``""`` for ``:memory:``), ``("postgres",
    conninfo)``, or ``("read_only", "")`` for a store opened ``read_only``; ``None`` for any
    other saver. A graph built with no ledger keeps its budget in that same store
    (``fencepost.adapters.default_ledger``), or in memory for a read-only one."""
    try:
        opened = _OPENED.get(saver)
    except TypeError:  # not weakly referenceable: not one opened here
        return None
    return None if opened is None else (opened.kind, opened.where)


def close_with(saver: object, close: Callable[[], object]) -> bool:
    """Have ``close`` called when the opener that opened ``saver`` closes it (its ``with``
    block ends); ``False`` when ``saver`` was not opened here."""
    try:
        opened = _OPENED.get(saver)
    except TypeError:
        return False
    if opened is None:
        return False
    opened.closers.append(close)
    return True


def _remember(saver: object, kind: str, where: str, *, read_only: bool) -> _Opened:
    # A store opened read-only runs nothing that spends: its graphs keep an in-memory ledger.
    opened = _OPENED[saver] = _Opened("read_only", "") if read_only else _Opened(kind, where)
    return opened


def _file_of(target: str) -> str:
    return "" if target == ":memory:" else str(Path(target).resolve())


def _sqlite_read_only_target(url: str) -> str:
    """A ``file:`` URI opening the existing SQLite file of ``url`` read-only."""
    path = _sqlite_path(url)
    shown = mask_url(url)
    if path == ":memory:":
        raise UnsupportedCheckpointerURL(
            shown, f"cannot read {shown}: an in-memory SQLite database holds no runs"
        )
    file = Path(path)
    if file.is_dir():
        raise NotACheckpointStore(shown, f"{shown} is a directory, not a checkpoint store")
    if not file.is_file():
        raise NoSuchCheckpointDatabase(shown, f"no such database: {shown}")
    return f"{file.resolve().as_uri()}?mode=ro"


_SQLITE_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
_SQLITE_NEEDED = {"checkpoints", "writes"}
# to_regclass follows the session's search_path, as the saver's own queries do.
_POSTGRES_TABLES = (
    "SELECT to_regclass('checkpoints') IS NOT NULL AND to_regclass('checkpoint_writes') "
    "IS NOT NULL AND to_regclass('checkpoint_blobs') IS NOT NULL AS present"
)


def _not_a_store(url: str) -> NotACheckpointStore:
    shown = mask_url(url)
    return NotACheckpointStore(
        shown, f"{shown} is not a checkpoint store: it holds no LangGraph checkpoint tables"
    )


def _postgres_connect_error(url: str, exc: BaseException) -> CheckpointerError:
    """Classify a failed Postgres connection. The driver's text is read here, never kept."""
    shown = mask_url(url)
    text = str(exc).lower()
    if (
        "authentication failed" in text
        or "no password supplied" in text
        or "no pg_hba.conf entry" in text
        or re.search(r'role "[^"]*" does not exist', text)
    ):
        return CheckpointerAuthenticationFailed(
            shown,
            f"authentication failed for {shown}: check the user name and password "
            "(or the server's access rules)",
        )
    if re.search(r'database "[^"]*" does not exist', text):
        return NoSuchCheckpointDatabase(shown, f"no such database: {shown}")
    return CheckpointerUnavailable(shown, f"cannot connect to {shown} ({type(exc).__name__})")


@contextmanager
def checkpointer_errors(url: str) -> Iterator[None]:
    """Turn driver errors raised while using a saver on ``url`` into :class:`CheckpointerError`.

    For code that reads through a saver this module opened (``fencepost.reporting``): a table
    that is missing means :class:`NotACheckpointStore`, anything else the database failing
    (:class:`CheckpointerUnavailable`). The driver's text is never kept, and not chained.
    """
    shown = mask_url(url)
    try:
        yield
    except CheckpointerError:
        raise
    except sqlite3.DatabaseError as exc:
        message = str(exc).lower()
        if not isinstance(exc, sqlite3.OperationalError) or "no such table" in message:
            # "file is not a database", or a SQLite file with other tables.
            raise _not_a_store(url) from None
        raise CheckpointerUnavailable(
            shown, f"cannot read {shown}: busy, locked or unreadable ({type(exc).__name__})"
        ) from None
    except Exception as exc:
        _raise_postgres_error(url, exc)
        raise


def _raise_postgres_error(url: str, exc: Exception) -> None:
    try:
        import psycopg
    except ImportError:  # the postgres extra is not installed: exc is no psycopg error
        return
    shown = mask_url(url)
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
        raise _not_a_store(url) from None
    if isinstance(exc, psycopg.errors.InvalidAuthorizationSpecification):
        raise _postgres_connect_error(url, exc) from None
    if isinstance(exc, psycopg.OperationalError):
        raise CheckpointerUnavailable(
            shown, f"lost the connection to {shown} ({type(exc).__name__})"
        ) from None
    if isinstance(exc, psycopg.Error):
        raise CheckpointerUnavailable(
            shown, f"cannot read {shown} ({type(exc).__name__})"
        ) from None


def _postgres_conninfo(url: str, *, read_only: bool) -> str:
    if not read_only:
        # libpq understands postgresql:// and postgres:// alike; keep the URL as given.
        return url
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = conninfo_to_dict(url)
    except Exception:
        shown = mask_url(url)
        raise UnsupportedCheckpointerURL(
            shown, f"cannot parse {shown} as a Postgres connection URL"
        ) from None
    # A read-only session: whatever the URL points at, reading it cannot change it.
    options = [str(params.get("options") or ""), "-c default_transaction_read_only=on"]
    params["options"] = " ".join(o for o in options if o)
    return make_conninfo("", **params)


def _connect_kwargs(url: str) -> dict[str, Any]:
    from psycopg.rows import dict_row

    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    if "connect_timeout" not in url:
        kwargs["connect_timeout"] = _CONNECT_TIMEOUT_SECONDS
    return kwargs


def _missing_extra(url: str, extra: str) -> UnsupportedCheckpointerURL:
    shown = mask_url(url)
    return UnsupportedCheckpointerURL(
        shown, f"{shown} needs the {extra!r} extra: pip install 'fencepost[{extra}]'"
    )


def _setup_failed(url: str, exc: BaseException) -> CheckpointerUnavailable:
    shown = mask_url(url)
    return CheckpointerUnavailable(
        shown, f"cannot set up the checkpoint tables in {shown} ({type(exc).__name__})"
    )


def _open_failed(url: str, exc: BaseException) -> CheckpointerUnavailable:
    shown = mask_url(url)
    return CheckpointerUnavailable(shown, f"cannot open {shown} ({type(exc).__name__})")


@contextmanager
def open_checkpointer(url: str, *, read_only: bool = False) -> Iterator[BaseCheckpointSaver[Any]]:
    """Open the checkpointer named by ``url`` (see the module doc), set up and ready to use.

    With ``read_only=True`` the database must already be a checkpoint store and is never
    changed (see the module doc). Raises :class:`UnsupportedCheckpointerURL` for an unknown
    scheme, :class:`NoSuchCheckpointDatabase`, :class:`CheckpointerAuthenticationFailed` or
    :class:`CheckpointerUnavailable` when the database cannot be used, and
    :class:`NotACheckpointStore` (read-only) when it holds no checkpoint tables; all name the URL
    with its password masked.
    """
    kind = _kind(url)
    if kind == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        yield InMemorySaver()
        return
    if kind == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        target = _sqlite_read_only_target(url) if read_only else _sqlite_path(url)
        try:
            # The saver serializes access with its own lock; LangGraph calls it from worker threads.
            conn = sqlite3.connect(target, uri=read_only, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _open_failed(url, exc) from None
        opened: _Opened | None = None
        try:
            saver = SqliteSaver(conn)
            opened = _remember(saver, "sqlite", _file_of(target), read_only=read_only)
            if read_only:
                with checkpointer_errors(url):
                    tables = {row[0] for row in conn.execute(_SQLITE_TABLES)}
                if not _SQLITE_NEEDED.issubset(tables):
                    raise _not_a_store(url)
            try:
                saver.setup()  # read-only: only notes which columns the existing tables have
            except sqlite3.Error as exc:
                raise _setup_failed(url, exc) from None
            yield saver
        finally:
            if opened is not None:
                opened.close()
            conn.close()
        return
    try:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:
        raise _missing_extra(url, "postgres") from None
    conninfo = _postgres_conninfo(url, read_only=read_only)
    try:
        pg = psycopg.Connection.connect(conninfo, **_connect_kwargs(url))
    except psycopg.Error as exc:
        # psycopg's text may quote the DSN: it is only classified, and not chained.
        raise _postgres_connect_error(url, exc) from None
    pg_opened: _Opened | None = None
    try:
        pg_saver = PostgresSaver(pg)
        pg_opened = _remember(pg_saver, "postgres", conninfo, read_only=read_only)
        if read_only:
            with checkpointer_errors(url):
                present = pg.execute(_POSTGRES_TABLES).fetchone()
            if not present or not present["present"]:
                raise _not_a_store(url)
        else:
            try:
                pg_saver.setup()
            except psycopg.Error as exc:
                raise _setup_failed(url, exc) from None
        yield pg_saver
    finally:
        if pg_opened is not None:
            pg_opened.close()
        pg.close()


@asynccontextmanager
async def aopen_checkpointer(
    url: str, *, read_only: bool = False
) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """The async twin of :func:`open_checkpointer`, for ``ainvoke``/``astream``.

    ``memory://`` gives the same in-memory saver; ``sqlite://`` an ``AsyncSqliteSaver`` on
    aiosqlite; ``postgresql://`` an ``AsyncPostgresSaver`` on a psycopg async connection.
    ``read_only`` and the errors are those of :func:`open_checkpointer`.
    """
    kind = _kind(url)
    if kind == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        yield InMemorySaver()
        return
    if kind == "sqlite":
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        target = _sqlite_read_only_target(url) if read_only else _sqlite_path(url)
        try:
            conn = await aiosqlite.connect(target, uri=read_only)
        except sqlite3.Error as exc:
            raise _open_failed(url, exc) from None
        opened: _Opened | None = None
        try:
            saver = AsyncSqliteSaver(conn)
            opened = _remember(saver, "sqlite", _file_of(target), read_only=read_only)
            if read_only:
                with checkpointer_errors(url):
                    async with conn.execute(_SQLITE_TABLES) as cursor:
                        tables = {row[0] for row in await cursor.fetchall()}
                if not _SQLITE_NEEDED.issubset(tables):
                    raise _not_a_store(url)
            try:
                await saver.setup()
            except sqlite3.Error as exc:
                raise _setup_failed(url, exc) from None
            yield saver
        finally:
            if opened is not None:
                opened.close()
            await conn.close()
        return
    try:
        import psycopg
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    except ImportError:
        raise _missing_extra(url, "postgres") from None
    conninfo = _postgres_conninfo(url, read_only=read_only)
    try:
        pg = await psycopg.AsyncConnection.connect(conninfo, **_connect_kwargs(url))
    except psycopg.Error as exc:
        raise _postgres_connect_error(url, exc) from None
    pg_opened: _Opened | None = None
    try:
        pg_saver = AsyncPostgresSaver(pg)
        pg_opened = _remember(pg_saver, "postgres", conninfo, read_only=read_only)
        if read_only:
            with checkpointer_errors(url):
                rows = await pg.execute(_POSTGRES_TABLES)
                present = await rows.fetchone()
            if not present or not present["present"]:
                raise _not_a_store(url)
        else:
            try:
                await pg_saver.setup()
            except psycopg.Error as exc:
                raise _setup_failed(url, exc) from None
        yield pg_saver
    finally:
        if pg_opened is not None:
            pg_opened.close()
        await pg.close()
