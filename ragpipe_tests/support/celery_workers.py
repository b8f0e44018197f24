"""Real Celery workers for ragpipe's steps, each in a folder of its own.

``CeleryWorker.start`` runs the documented command — ``dagster-celery worker start -A
dagster_celery.app -y deploy/celery-worker.yaml -n <name> -q dagster -- --concurrency=1`` — in a
new temporary folder that is its working directory, ``$RAGPIPE_HOME`` and ``$DAGSTER_HOME``, so
two workers and the launcher share no disk: state reaches a worker only through the object store,
Postgres and Redis. ``start`` waits for Celery's own "ready." line (a condition, not a sleep).
Each worker runs in its own session, so ``stop`` (or ``kill``) ends the CLI and the Celery
processes it started, and nothing else. A ``prefix`` (``PrivateLink.exec_prefix()``) starts the
worker inside a network namespace of its own; a ``config`` replaces ``deploy/celery-worker.yaml``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ragpipe_tests.support.paths import REPO

READY_TIMEOUT_S = 120


@dataclass
class CeleryWorker:
    name: str
    folder: Path
    process: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.folder / "ragpipe"

    @classmethod
    def start(
        cls, name: str, env: dict[str, str], prefix: list[str] | None = None, config: Path | None = None
    ) -> CeleryWorker:
        folder = Path(tempfile.mkdtemp(prefix=f"ragpipe-worker-{name}-"))
        bindir = Path(sys.executable).parent
        worker_env = {
            **env,
            "RAGPIPE_HOME": str(folder / "ragpipe"),
            "DAGSTER_HOME": str(folder / "dagster"),  # the CLI writes its Celery config module there
            "PATH": f"{bindir}{os.pathsep}{env.get('PATH', os.environ.get('PATH', ''))}",
        }
        (folder / "dagster").mkdir()
        command = [*(prefix or []), str(bindir / "dagster-celery"), "worker", "start", "-A", "dagster_celery.app"]
        command += ["-y", str(config or REPO / "deploy" / "celery-worker.yaml"), "-n", name, "-q", "dagster"]
        command += ["--", "--concurrency=1", "--loglevel=INFO"]
        process = subprocess.Popen(
            command,
            cwd=folder,
            env=worker_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        worker = cls(name=name, folder=folder, process=process)
        ready = threading.Event()

        def read() -> None:  # keeps draining the pipe after "ready" so the worker never blocks on it
            for line in process.stdout or ():
                worker.lines.append(line)
                if f"{name}@" in line and " ready." in line:
                    ready.set()
            ready.set()  # the worker exited

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(READY_TIMEOUT_S) or process.poll() is not None:
            worker.kill()
            raise RuntimeError(f"celery worker {name} did not start:\n{''.join(worker.lines[-30:])}")
        return worker

    def kill(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
