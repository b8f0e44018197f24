"""A real, throw-away PostgreSQL server for tests: Debian's PostgreSQL binaries run into a temp folder.

``initdb`` refuses to run as root, so as root the server runs as the unprivileged ``postgres``
user (``runuser``); otherwise as the current user. It listens on 127.0.0.1 (or the ``host`` given,
such as the host end of a private link) on a free port with trust authentication for local
connections and the ``clients`` network named, and is stopped (fast shutdown) and deleted after use.
`.ci/run` makes sure the binaries are installed.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ragpipe_tests.support.services import free_port


class PostgresUnavailable(RuntimeError):
    pass


def postgres_bindir() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl`` (PATH first, then Debian's versioned folders)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not candidates:
        raise PostgresUnavailable("PostgreSQL server binaries not found: apt-get install postgresql-15 (see .ci/run)")
    return Path(candidates[-1]).parent


@dataclass
class PostgresServer:
    root: Path
    port: int
    host: str = "127.0.0.1"
    user: str = "ragpipe"
    database: str = "dagster"

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"

    def _run(self, *args: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        out = subprocess.run(prefix + list(args), capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(args[:2])} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")

    @classmethod
    def start(cls, host: str = "127.0.0.1", clients: str | None = None) -> PostgresServer:
        """A running server on ``host``; ``clients`` (a CIDR network) may connect besides local ones."""
        bindir = postgres_bindir()
        root = Path(tempfile.mkdtemp(prefix="ragpipe-pg-"))
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(root, pw.pw_uid, pw.pw_gid)
        server = cls(root=root, port=free_port(), host=host)
        data, sockets = root / "data", root / "sockets"
        try:
            server._run(
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                server.user,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            )
            if clients is not None:
                server._run("sh", "-c", f'echo "host all all {clients} trust" >> "{data}/pg_hba.conf"')
            server._run("mkdir", str(sockets))
            server._run(
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(root / "server.log"),
                "-w",
                "-t",
                "60",
                "-o",
                f"-p {server.port} -k {sockets} -c listen_addresses={host} -c fsync=off",
                "start",
            )
            server._run(
                str(bindir / "createdb"), "-h", host, "-p", str(server.port), "-U", server.user, server.database
            )
        except BaseException:
            # Stop a server that did start (pg_ctl refuses quietly if none runs) and remove the folder.
            subprocess.run(
                (["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else [])
                + [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=60,
            )
            shutil.rmtree(root, ignore_errors=True)
            raise
        return server

    def stop(self) -> None:
        try:
            self._run(str(postgres_bindir() / "pg_ctl"), "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
