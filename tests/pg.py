"""A throwaway Postgres cluster for tests: initdb in a temp dir, one server on a unix socket there, stopped at the end.

Run as root (CI, this machine), the binaries run as the unprivileged `postgres` user: initdb refuses root. The server
listens on a socket in its own directory only (no TCP port, so no race for a free one between xdist workers), with
fsync off: the cluster dies with the test session, durability across power loss is not what the tests check.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

PG_USER = "postgres"  # the unprivileged account Debian's postgresql package creates; also the cluster's superuser
_SERVER_OPTIONS = {
    "listen_addresses": "''",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",  # several engines' pools per test, a few processes in the crash tests
    "shared_buffers": "32MB",
    "log_min_messages": "fatal",
}


class PostgresUnavailable(Exception):
    """No Postgres binaries (or no driver) on this host; the message says what is missing."""


def find_bindir() -> Path:
    """Where initdb, pg_ctl and postgres are: `pg_config --bindir`, else Debian's /usr/lib/postgresql/<n>/bin."""
    candidates: list[str] = []
    if pg_config := shutil.which("pg_config"):
        try:
            candidates.append(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                             check=True).stdout.strip())
        except (OSError, subprocess.CalledProcessError):
            pass
    # newest major version first: Debian installs each under its own number
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    for d in candidates:
        if d and all((Path(d) / b).is_file() for b in ("initdb", "pg_ctl", "postgres")):
            return Path(d)
    raise PostgresUnavailable("no Postgres server binaries (initdb, pg_ctl): apt-get install postgresql-15")


def reap_orphans(tmp: str | None = None) -> None:
    """Stop and remove the clusters of test processes that died without stopping theirs (kill -9, a timeout): the
    server outlives its parent, so each would keep its memory and a socket until the machine restarts."""
    for root in glob.glob(os.path.join(tmp or tempfile.gettempdir(), "mspg-*")):
        try:
            pid = int(Path(root, "owner.pid").read_text())
            os.kill(pid, 0)
            continue  # its owner still runs
        except ProcessLookupError:
            pass
        except (OSError, ValueError):
            continue  # not ours to judge (being set up, or another user's)
        pidfile = Path(root, "data", "postmaster.pid")
        try:
            os.kill(int(pidfile.read_text().split()[0]), 9)  # nothing in a test cluster needs a clean shutdown
        except (OSError, ValueError, IndexError):
            pass
        shutil.rmtree(root, ignore_errors=True)


class PgCluster:
    """One initdb'd cluster with its server; `url(db)` addresses a database in it over the socket."""

    def __init__(self, bindir: Path | None = None):
        try:
            import psycopg  # noqa: F401  the driver the URLs name
        except ImportError as exc:
            raise PostgresUnavailable(f"no psycopg driver ({exc}): pip install 'psycopg[binary]'")
        self.bindir = bindir or find_bindir()
        self.as_root = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="mspg-"))  # short: a socket path has ~107 bytes
        self.data = self.root / "data"
        if self.as_root:
            try:
                pw = pwd.getpwnam(PG_USER)
            except KeyError:
                raise PostgresUnavailable(f"running as root and no unprivileged {PG_USER!r} user for initdb")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self.superuser = PG_USER if self.as_root else pwd.getpwuid(os.geteuid()).pw_name
        self.started = False

    def _run(self, *args: str) -> None:
        kw = {"user": PG_USER, "group": pwd.getpwnam(PG_USER).pw_gid} if self.as_root else {}
        env = {**os.environ, "LC_ALL": "C", "PGTZ": "UTC"}
        proc = subprocess.run([str(self.bindir / args[0]), *args[1:]], cwd=self.root, env=env,
                              capture_output=True, text=True, **kw)  # type: ignore[call-overload]
        if proc.returncode:
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")

    def start(self) -> PgCluster:
        reap_orphans()
        (self.root / "owner.pid").write_text(str(os.getpid()))
        self._run("initdb", "-D", str(self.data), "-U", self.superuser, "--auth=trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        opts = " ".join(f"-c {k}={v}" for k, v in _SERVER_OPTIONS.items())
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-o", f"{opts} -k {self.root}")
        self.started = True
        return self

    def stop(self) -> None:
        """Stop the server at once (nothing in it is kept) and remove the cluster's files."""
        if self.started:
            try:
                self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")
            finally:
                self.started = False
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.superuser}@/{database}?host={self.root}"

    def _admin(self, sql: str) -> None:
        import psycopg

        # CREATE/DROP DATABASE cannot run inside a transaction: autocommit, on the maintenance database
        with psycopg.connect(dbname="postgres", user=self.superuser, host=str(self.root), autocommit=True) as conn:
            conn.execute(sql)

    def create_database(self, template: str | None = None) -> str:
        """A new, uniquely named database (a copy of `template` when given: a file copy, milliseconds); its name."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        self._admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return name

    def drop_database(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # FORCE: a leaked connection must not block
