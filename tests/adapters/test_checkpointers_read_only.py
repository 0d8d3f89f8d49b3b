"""open_checkpointer(url, read_only=True): reads an existing store, never changes a database.

And one error family: every failure is a CheckpointerError whose text is fencepost's own sentence
(URL masked, no driver text) and whose ``code`` names the failure — a Postgres authentication
failure included, which is not "no such database".
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import fencepost as fp
from fencepost.adapters.checkpointers import (
    CheckpointerAuthenticationFailed,
    CheckpointerError,
    CheckpointerUnavailable,
    NoSuchCheckpointDatabase,
    NotACheckpointStore,
    UnsupportedCheckpointerURL,
    aopen_checkpointer,
    open_checkpointer,
    sqlite_file,
)
from tests.adapters.fakes import ctx
from tests.adapters.test_checkpointers import CONFIG, _model, _registry, _start, write_run


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _other_sqlite(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.commit()
    conn.close()
    return path


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_read_only_reads_a_run_written_by_a_writable_opener(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    written = write_run(url)
    with open_checkpointer(url, read_only=True) as saver:
        graph = fp.build_agent_graph(_registry(), _model()).compile(checkpointer=saver)
        assert fp.run_output(graph.get_state(CONFIG).values) == written


def test_read_only_cannot_write_to_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    write_run(url)
    before = _digest(tmp_path / "runs.db")
    with open_checkpointer(url, read_only=True) as saver:
        graph = fp.build_agent_graph(_registry(), _model()).compile(checkpointer=saver)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            graph.invoke(_start(), {"configurable": {"thread_id": "t-new"}}, context=ctx())
    assert _digest(tmp_path / "runs.db") == before


def test_read_only_never_creates_a_missing_database(tmp_path: Path) -> None:
    db = tmp_path / "missing.db"
    url = f"sqlite:///{db}"
    with pytest.raises(NoSuchCheckpointDatabase) as err, open_checkpointer(url, read_only=True):
        pass
    assert str(err.value) == f"no such database: {url}"
    assert err.value.code == "no_such_database"
    assert isinstance(err.value, CheckpointerUnavailable)  # callers catching that still do
    assert not db.exists()


@pytest.mark.parametrize("kind", ["text file", "other sqlite database", "directory"])
def test_read_only_refuses_a_database_that_is_not_a_checkpoint_store_and_leaves_it_unchanged(
    tmp_path: Path, kind: str
) -> None:
    if kind == "text file":
        db = tmp_path / "notes.db"
        db.write_text("not a database\n" * 100)
    elif kind == "directory":
        db = tmp_path / "a-directory.db"
        db.mkdir()
    else:
        db = _other_sqlite(tmp_path / "billing.db")
    before = _digest(db) if db.is_file() else None
    with (
        pytest.raises(NotACheckpointStore) as err,
        open_checkpointer(f"sqlite:///{db}", read_only=True),
    ):
        pass
    assert err.value.code == "not_a_checkpoint_store"
    assert "not a checkpoint store" in str(err.value)
    if before is not None:
        assert _digest(db) == before
    if kind == "other sqlite database":
        assert _tables(db) == {"invoices"}  # LangGraph's tables were not created in it


def test_read_only_in_memory_sqlite_is_refused() -> None:
    with (
        pytest.raises(UnsupportedCheckpointerURL),
        open_checkpointer("sqlite:///:memory:", read_only=True),
    ):
        pass


def test_sqlite_file_names_the_file_of_a_sqlite_url() -> None:
    assert sqlite_file("sqlite:///.fencepost/runs.db") == Path(".fencepost/runs.db")
    assert sqlite_file("sqlite:////var/runs.db") == Path("/var/runs.db")
    assert sqlite_file("sqlite:///:memory:") is None
    assert sqlite_file("postgresql://db/runs") is None


async def test_the_async_twin_reads_only_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    written = write_run(url)
    async with aopen_checkpointer(url, read_only=True) as saver:
        graph = fp.build_agent_graph(_registry(), _model()).compile(checkpointer=saver)
        assert fp.run_output((await graph.aget_state(CONFIG)).values) == written
    with pytest.raises(NoSuchCheckpointDatabase):
        async with aopen_checkpointer(f"sqlite:///{tmp_path / 'nope.db'}", read_only=True):
            pass
    other = _other_sqlite(tmp_path / "billing.db")
    with pytest.raises(NotACheckpointStore):
        async with aopen_checkpointer(f"sqlite:///{other}", read_only=True):
            pass
    assert _tables(other) == {"invoices"}


# --- Postgres -----------------------------------------------------------------------------------


def test_read_only_postgres_refuses_a_schema_without_checkpoint_tables_and_creates_none(
    postgres_schema: str,
) -> None:
    import psycopg

    with pytest.raises(NotACheckpointStore), open_checkpointer(postgres_schema, read_only=True):
        pass
    with psycopg.connect(postgres_schema) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchone()
    assert tables == (0,)


def test_read_only_postgres_reads_a_run_and_its_session_cannot_write(postgres_schema: str) -> None:
    import psycopg

    written = write_run(postgres_schema)
    with open_checkpointer(postgres_schema, read_only=True) as saver:
        graph = fp.build_agent_graph(_registry(), _model()).compile(checkpointer=saver)
        assert fp.run_output(graph.get_state(CONFIG).values) == written
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            graph.invoke(_start(), {"configurable": {"thread_id": "t-new"}}, context=ctx())


async def test_async_read_only_postgres(postgres_schema: str) -> None:
    with pytest.raises(NotACheckpointStore):
        async with aopen_checkpointer(postgres_schema, read_only=True):
            pass
    written = write_run(postgres_schema)
    async with aopen_checkpointer(postgres_schema, read_only=True) as saver:
        graph = fp.build_agent_graph(_registry(), _model()).compile(checkpointer=saver)
        assert fp.run_output((await graph.aget_state(CONFIG)).values) == written


def _role_url(dsn: str, user: str, dbname: str | None = None) -> str:
    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(dsn)
    port = f":{p['port']}" if p.get("port") else ""
    return (
        f"postgresql://{user}:s3cret-pw@{p.get('host', '127.0.0.1')}{port}/{dbname or p['dbname']}"
    )


@pytest.mark.parametrize("read_only", [False, True])
def test_an_unknown_postgres_user_is_an_authentication_failure_not_a_missing_database(
    postgres_dsn: str, read_only: bool
) -> None:
    url = _role_url(postgres_dsn, "fp_no_such_role")
    with (
        pytest.raises(CheckpointerAuthenticationFailed) as err,
        open_checkpointer(url, read_only=read_only),
    ):
        pass
    message = str(err.value)
    assert message.startswith("authentication failed for postgresql://fp_no_such_role:***@")
    assert "s3cret-pw" not in message and "does not exist" not in message
    assert err.value.code == "authentication_failed"
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_missing_postgres_database_is_no_such_database(postgres_dsn: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    user = conninfo_to_dict(postgres_dsn).get("user") or "postgres"
    url = _role_url(postgres_dsn, str(user), "fp_no_such_database")
    with pytest.raises(NoSuchCheckpointDatabase) as err, open_checkpointer(url, read_only=True):
        pass
    assert str(err.value) == f"no such database: {url.replace('s3cret-pw', '***')}"


@pytest.mark.parametrize(
    "server_says",
    [
        'FATAL:  password authentication failed for user "app"',
        "fe_sendauth: no password supplied",
        'FATAL:  no pg_hba.conf entry for host "10.0.0.5", user "app", database "runs"',
        'FATAL:  role "app" does not exist',
    ],
)
def test_a_refused_password_is_an_authentication_failure_without_the_servers_text(
    monkeypatch: pytest.MonkeyPatch, server_says: str
) -> None:
    # The test server trusts every local user, so the server's refusal is played by a fake.
    import psycopg

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError(f'connection to server at "10.0.0.5" failed: {server_says}')

    monkeypatch.setattr(psycopg.Connection, "connect", refuse)
    url = "postgresql://app:hunter2@db.internal:5432/runs"
    with pytest.raises(CheckpointerAuthenticationFailed) as err, open_checkpointer(url):
        pass
    assert str(err.value) == (
        "authentication failed for postgresql://app:***@db.internal:5432/runs: check the user "
        "name and password (or the server's access rules)"
    )


def test_every_failure_is_one_family_with_a_code() -> None:
    for cls in (
        UnsupportedCheckpointerURL,
        CheckpointerUnavailable,
        NoSuchCheckpointDatabase,
        CheckpointerAuthenticationFailed,
        NotACheckpointStore,
    ):
        assert issubclass(cls, CheckpointerError)
        assert cls.code != CheckpointerError.code
    assert len({c.code for c in CheckpointerError.__subclasses__()}) == len(
        CheckpointerError.__subclasses__()
    )
