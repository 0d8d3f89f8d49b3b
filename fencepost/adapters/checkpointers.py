"""LangGraph checkpointers by URL, with fencepost's serializer allowlist applied.

``memory://``, ``sqlite:///runs.db`` (relative), ``sqlite:////var/lib/runs.db`` (absolute: the
SQLAlchemy convention, four slashes), ``sqlite:///:memory:``, ``postgresql://user:pw@host/db``
(also ``postgres://``). Each opener is a context manager: it builds the saver with
:func:`~fencepost.graph.fencepost_serializer` as its serde (so strict msgpack revives fencepost's
types instead of plain dicts), runs ``setup()``, and closes its connection on exit.

Example::

    with open_checkpointer("sqlite:///runs.db") as saver:
        graph = build_agent_graph(registry, model).compile(checkpointer=saver)
        graph.invoke(start("why?"), {"configurable": {"thread_id": "t1"}}, context=ctx)
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

from fencepost.graph.serde import fencepost_serializer

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver

__all__ = [
    "CheckpointerError",
    "CheckpointerUnavailable",
    "UnsupportedCheckpointerURL",
    "aopen_checkpointer",
    "mask_url",
    "open_checkpointer",
]

_SCHEMES = "memory://, sqlite:///path/to/runs.db, postgresql://user@host/db"
_CONNECT_TIMEOUT_SECONDS = 10


class CheckpointerError(Exception):
    """A checkpointer URL could not be opened. ``url`` is the URL with any password masked."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(f"checkpointer {url}: {problem}")
        self.url = url


class UnsupportedCheckpointerURL(CheckpointerError, ValueError):
    """The URL's scheme is not one fencepost opens (or a needed extra is not installed)."""


class CheckpointerUnavailable(CheckpointerError, ConnectionError):
    """The database named by the URL could not be reached or set up."""


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


_OPEN = "it could not be opened"
_SETUP = "its checkpoint tables could not be set up"


def _unavailable(url: str, what: str, exc: BaseException) -> CheckpointerUnavailable:
    """The error for ``url``, naming the driver error's class only: its text may hold hosts,
    user names or secrets, so it is never kept."""
    return CheckpointerUnavailable(mask_url(url), f"{what} ({type(exc).__name__})")


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
        mask_url(url), f"unsupported scheme {shown!r}; use one of {_SCHEMES}"
    )


def _sqlite_path(url: str) -> str:
    rest = url.split("://", 1)[1]
    if rest in ("", "/"):
        return ":memory:"
    if not rest.startswith("/"):
        raise UnsupportedCheckpointerURL(
            mask_url(url), "a SQLite URL is sqlite:///relative.db or sqlite:////absolute.db"
        )
    path = rest[1:].split("?", 1)[0]
    return path or ":memory:"


def _postgres_dsn(url: str) -> str:
    # libpq understands postgresql:// and postgres:// alike; keep the URL as given.
    return url


def _connect_kwargs(url: str) -> dict[str, Any]:
    from psycopg.rows import dict_row

    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    if "connect_timeout" not in url:
        kwargs["connect_timeout"] = _CONNECT_TIMEOUT_SECONDS
    return kwargs


def _missing_extra(url: str, extra: str) -> UnsupportedCheckpointerURL:
    return UnsupportedCheckpointerURL(
        mask_url(url), f"needs the {extra!r} extra: pip install 'fencepost[{extra}]'"
    )


@contextmanager
def open_checkpointer(url: str) -> Iterator[BaseCheckpointSaver[Any]]:
    """Open the checkpointer named by ``url`` (see the module doc), set up and ready to use.

    Raises :class:`UnsupportedCheckpointerURL` for an unknown scheme and
    :class:`CheckpointerUnavailable` when the database cannot be reached; both name the URL with
    its password masked.
    """
    kind = _kind(url)
    serde = fencepost_serializer()
    if kind == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        yield InMemorySaver(serde=serde)
        return
    if kind == "sqlite":
        import sqlite3

        try:
            from langgraph.checkpoint.sqlite import SqliteSaver
        except ImportError:
            raise _missing_extra(url, "sqlite") from None
        path = _sqlite_path(url)
        try:
            # The saver serializes access with its own lock; LangGraph calls it from worker threads.
            conn = sqlite3.connect(path, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _unavailable(url, _OPEN, exc) from None
        try:
            saver = SqliteSaver(conn, serde=serde)
            try:
                saver.setup()
            except sqlite3.Error as exc:
                raise _unavailable(url, _SETUP, exc) from None
            yield saver
        finally:
            conn.close()
        return
    try:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:
        raise _missing_extra(url, "postgres") from None
    try:
        pg = psycopg.Connection.connect(_postgres_dsn(url), **_connect_kwargs(url))
    except psycopg.Error as exc:
        # psycopg's text may quote the DSN: only its class name is kept, and it is not chained.
        raise _unavailable(url, _OPEN, exc) from None
    try:
        pg_saver = PostgresSaver(pg, serde=serde)
        try:
            pg_saver.setup()
        except psycopg.Error as exc:
            raise _unavailable(url, _SETUP, exc) from None
        yield pg_saver
    finally:
        pg.close()


@asynccontextmanager
async def aopen_checkpointer(url: str) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """The async twin of :func:`open_checkpointer`, for ``ainvoke``/``astream``.

    ``memory://`` gives the same in-memory saver; ``sqlite://`` an ``AsyncSqliteSaver`` on
    aiosqlite; ``postgresql://`` an ``AsyncPostgresSaver`` on a psycopg async connection.
    """
    kind = _kind(url)
    serde = fencepost_serializer()
    if kind == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        yield InMemorySaver(serde=serde)
        return
    if kind == "sqlite":
        import sqlite3

        try:
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        except ImportError:
            raise _missing_extra(url, "sqlite") from None
        path = _sqlite_path(url)
        try:
            conn = await aiosqlite.connect(path)
        except sqlite3.Error as exc:
            raise _unavailable(url, _OPEN, exc) from None
        try:
            saver = AsyncSqliteSaver(conn, serde=serde)
            try:
                await saver.setup()
            except sqlite3.Error as exc:
                raise _unavailable(url, _SETUP, exc) from None
            yield saver
        finally:
            await conn.close()
        return
    try:
        import psycopg
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    except ImportError:
        raise _missing_extra(url, "postgres") from None
    try:
        pg = await psycopg.AsyncConnection.connect(_postgres_dsn(url), **_connect_kwargs(url))
    except psycopg.Error as exc:
        raise _unavailable(url, _OPEN, exc) from None
    try:
        pg_saver = AsyncPostgresSaver(pg, serde=serde)
        try:
            await pg_saver.setup()
        except psycopg.Error as exc:
            raise _unavailable(url, _SETUP, exc) from None
        yield pg_saver
    finally:
        await pg.close()
