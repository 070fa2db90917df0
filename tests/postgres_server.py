"""A throwaway PostgreSQL server for the tests (Debian's `postgresql` package; `.ci/run` installs it).

    with PostgresServer() as server:       # initdb into a temporary folder, pg_ctl start on a Unix socket
        url = server.create_database("gradebook")   # postgresql+psycopg2://grader@/gradebook?host=/tmp/...

The server listens on a Unix socket in its own temporary folder only (no TCP port), trusts local
connections, runs without fsync (it is thrown away), keeps its dynamic shared memory in its data folder
rather than in /dev/shm (which other programs on a shared machine may clear), and is stopped and removed
on exit. PostgreSQL
refuses to run as root, so under root (CI) it runs as the unprivileged `postgres` user (or `nobody`)
through `runuser`/`setpriv`. `unavailable()` says in one line why no server can start here (None when
one can); the tests skip with that line, except in CI (`CI=true`), where they fail.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

SUPERUSER = "grader"


def _binaries() -> Path | None:
    """The folder holding initdb and pg_ctl: Debian keeps them in /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda f: int(Path(f).parent.name), reverse=True):
        if os.access(os.path.join(folder, "initdb"), os.X_OK):
            return Path(folder)
    return None


def _account() -> pwd.struct_passwd | None:
    """Whom the server runs as: None (this user) unless we are root, then `postgres`, else `nobody`."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    return None


@lru_cache(maxsize=1)
def unavailable() -> str | None:
    """None when a server can be started here, else the reason in one line."""
    if _binaries() is None:
        return "PostgreSQL is not installed (Debian: apt-get install postgresql)"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install -e '.[postgres]')"
    if os.geteuid() == 0:
        if _account() is None:
            return "running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as"
        if not (shutil.which("runuser") or shutil.which("setpriv")):
            return "running as root and neither runuser nor setpriv is there to drop privileges"
    return None


class PostgresServer:
    def __init__(self) -> None:
        self.binaries = _binaries()
        self.account = _account()
        self.base = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))  # short: a socket path has 107 bytes
        self.data, self.socket = self.base / "data", self.base / "socket"
        self.started = False

    def _as_server_user(self, command: list[str]) -> list[str]:
        if self.account is None:
            return command
        if shutil.which("runuser"):
            return ["runuser", "-u", self.account.pw_name, "--", *command]
        return ["setpriv", f"--reuid={self.account.pw_uid}", f"--regid={self.account.pw_gid}", "--clear-groups",
                "--", *command]

    def _run(self, command: list[str], timeout: float = 120) -> None:
        process = subprocess.run(self._as_server_user(command), capture_output=True, text=True, timeout=timeout,
                                 cwd=self.base, env={**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"})
        if process.returncode != 0:
            log = (self.base / "server.log").read_text(errors="replace")[-1500:] if (
                self.base / "server.log").exists() else ""
            raise RuntimeError(f"{' '.join(command[:2])} failed: {process.stderr.strip()[-1500:]} {log}")

    def start(self) -> PostgresServer:
        assert self.binaries is not None, unavailable()
        self.socket.mkdir()
        if self.account is not None:
            for path in (self.base, self.socket):
                os.chown(path, self.account.pw_uid, self.account.pw_gid)
        self._run([str(self.binaries / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                   "--encoding=UTF8", "--no-sync"])
        options = (f"-k {self.socket} -c listen_addresses='' -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off -c max_connections=100 -c dynamic_shared_memory_type=mmap")
        self._run([str(self.binaries / "pg_ctl"), "-D", str(self.data), "-l", str(self.base / "server.log"), "-w",
                   "-t", "60", "-o", options, "start"])
        self.started = True
        return self

    def url(self, database: str) -> str:
        return f"postgresql+psycopg2://{SUPERUSER}@/{database}?host={self.socket}"

    def create_database(self, name: str) -> str:
        import psycopg2

        connection = psycopg2.connect(dbname="postgres", user=SUPERUSER, host=str(self.socket))
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()
        return self.url(name)

    def stop(self) -> None:
        if self.started:
            try:
                self._run([str(self.binaries / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                          timeout=60)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            self.started = False
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exception: object) -> None:
        self.stop()
