"""A real, throw-away Redis for tests: Debian's ``redis-server`` on 127.0.0.1 (or the ``host``
given), in a temp folder,
without persistence. ``start()`` waits for the server's own "Ready to accept connections" line (a
condition, not a sleep); ``stop()`` ends it. `.ci/run` installs the package; `make redis` starts
one by hand."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ragpipe_tests.support.services import free_port


class RedisUnavailable(RuntimeError):
    pass


@dataclass
class RedisServer:
    process: subprocess.Popen
    port: int
    root: Path
    host: str = "127.0.0.1"

    def url(self, db: int = 0) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

    @classmethod
    def start(cls, host: str = "127.0.0.1") -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisUnavailable("redis-server not found: apt-get install redis-server (see .ci/run)")
        root, port = Path(tempfile.mkdtemp(prefix="ragpipe-redis-")), free_port()
        args = [binary, "--port", str(port), "--bind", host, "--dir", str(root), "--save", ""]
        args += ["--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", "--loglevel", "notice"]
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen = []
        for line in process.stdout or ():  # ends when the server exits
            seen.append(line)
            if "Ready to accept connections" in line:
                return cls(process=process, port=port, root=root, host=host)
        shutil.rmtree(root, ignore_errors=True)
        raise RedisUnavailable(f"redis-server exited: {''.join(seen[-5:])}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
