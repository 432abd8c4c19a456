"""A throwaway PostgreSQL server in a temporary folder, for tests, benchmarks and trying things.

``initdb`` makes a cluster in a new temporary folder, ``pg_ctl`` starts it on a free port of
127.0.0.1 (its socket in the same folder, so nothing outside it is touched), and ``stop`` removes
it. PostgreSQL refuses to run as root: as root, the server runs as the ``postgres`` user (created,
as a system user without a home, when the machine has none).

    with LocalPostgres() as server:
        Keeper(archive=server.url)
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from keeper_middleware.errors import InvalidStateError, KeeperError

__all__ = ["LocalPostgres", "PostgresNotAvailableError", "find_postgres_bin"]

SERVER_USER = "postgres"
_SETTINGS = {
    # a scratch server: speed over durability (a client killed mid-cut is what the tests need;
    # the server itself is never crashed)
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "listen_addresses": "127.0.0.1",
}


class PostgresNotAvailableError(KeeperError, RuntimeError):
    """The PostgreSQL server programs are missing or the server would not start."""


def find_postgres_bin() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl``: on PATH, else the newest Debian install."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(os.path.realpath(on_path)).parent
    installed = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if installed:
        return Path(installed[-1]).parent
    raise PostgresNotAvailableError(
        "initdb and pg_ctl were not found: install PostgreSQL (Debian/Ubuntu: "
        "apt-get install -y postgresql) or put its bin folder on PATH"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_account() -> pwd.struct_passwd | None:
    """Who the server runs as: None (this user) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVER_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVER_USER)


class LocalPostgres:
    """A PostgreSQL cluster in a temporary folder, on a free local port, with trust auth.

    ``user`` is the database superuser the cluster is made with; ``url`` connects as it to the
    database ``postgres``.
    """

    def __init__(self, *, user: str = "keeper", start_timeout: float = 60.0) -> None:
        self.user = user
        self.start_timeout = start_timeout
        self.port = 0
        self.folder: Path | None = None

    @property
    def url(self) -> str:
        if self.folder is None:
            raise InvalidStateError("the server is not running; call start() first")
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def _run(self, args: list[str], account: pwd.struct_passwd | None) -> None:
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            cwd=self.folder,
            timeout=self.start_timeout,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
            user=None if account is None else account.pw_uid,
            group=None if account is None else account.pw_gid,
        )
        if done.returncode != 0:
            raise PostgresNotAvailableError(
                f"{Path(args[0]).name} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )

    def start(self) -> str:
        """Create and start the cluster; returns its URL."""
        bin_dir = find_postgres_bin()
        account = _server_account()
        self.folder = Path(tempfile.mkdtemp(prefix="keeper-pg-"))
        if account is not None:
            os.chown(self.folder, account.pw_uid, account.pw_gid)
        data = self.folder / "data"
        try:
            initdb = [str(bin_dir / "initdb"), "-D", str(data), "-U", self.user, "-A", "trust"]
            self._run([*initdb, "-E", "UTF8", "--locale=C", "--no-sync"], account)
            for attempt in range(3):
                self.port = _free_port()
                options = " ".join(f"-c {k}={v}" for k, v in _SETTINGS.items())
                try:
                    self._run(
                        [
                            str(bin_dir / "pg_ctl"),
                            "-D",
                            str(data),
                            "-l",
                            str(self.folder / "server.log"),
                            "-w",
                            "-t",
                            str(round(self.start_timeout)),
                            "-o",
                            f"-p {self.port} -k {self.folder} {options}",
                            "start",
                        ],
                        account,
                    )
                    break
                except PostgresNotAvailableError:
                    if attempt == 2:  # the port was taken in between, or the server is broken
                        raise PostgresNotAvailableError(self._log_tail()) from None
        except BaseException:
            self.stop()
            raise
        return self.url

    def _log_tail(self) -> str:
        assert self.folder is not None
        log = self.folder / "server.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        return f"the PostgreSQL server did not start; its log ends:\n{tail}"

    def stop(self) -> None:
        """Stop the server at once and remove its folder (safe to call twice)."""
        if self.folder is None:
            return
        data = self.folder / "data"
        if (data / "postmaster.pid").exists():
            bin_dir = find_postgres_bin()
            with contextlib.suppress(PostgresNotAvailableError):
                self._run(
                    [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                    _server_account(),
                )
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
