"""Private Redis and RabbitMQ servers that a test may stop and start again.

The shared brokers (6379, 5672) are never touched: each server here runs on free
loopback ports, with its data, logs and (for RabbitMQ) Erlang cookie in a directory
of its own, and is stopped and removed by its owner.

- ``PrivateRedis``: ``redis-server`` with AOF on and ``appendfsync always`` (every
  accepted write is on disk before the reply), RDB snapshots off. ``restart()`` is
  ``SHUTDOWN`` (which fsyncs the AOF), then the same command again.
- ``PrivateRabbit``: a second RabbitMQ node (its own node name, AMQP and
  distribution ports, mnesia and log directories, no plugins, so it binds nothing
  else) run in the foreground as our child. ``restart()`` stops the whole node
  (``rabbitmqctl stop``) and boots it again on the same data directory: durable
  queues and persistent messages survive, every client connection is cut.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

#: Seconds a server gets to accept connections after it was started.
BOOT_TIMEOUT = 60.0
#: Where Debian and RabbitMQ's own packages keep the real (non-wrapper) scripts.
RABBITMQ_SCRIPTS = ("/usr/lib/rabbitmq/bin", "/usr/local/lib/rabbitmq/bin")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait(predicate: Callable[[], bool], what: str, timeout: float = BOOT_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not reached within {timeout:.0f}s")
        time.sleep(0.05)


def redis_binary() -> str | None:
    return shutil.which("redis-server")


def rabbitmq_scripts() -> Path | None:
    """The directory of ``rabbitmq-server`` and ``rabbitmqctl`` that run as any user.

    Debian's ``/usr/sbin`` wrappers switch to the ``rabbitmq`` user (which could not
    write our directory); the scripts they wrap do not.
    """
    for folder in (os.environ.get("OJS_RABBITMQ_SCRIPTS"), *RABBITMQ_SCRIPTS):
        if folder and (Path(folder) / "rabbitmq-server").exists():
            return Path(folder)
    found = shutil.which("rabbitmq-server")
    return Path(found).resolve().parent if found else None


class PrivateRedis:
    """``redis-server`` on a free port with AOF (``appendfsync always``) in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        binary = redis_binary()
        assert binary is not None, "redis-server is not installed"
        log = open(self.folder / "redis.log", "ab")  # noqa: SIM115 - kept by the child
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--protected-mode", "no", "--daemonize", "no"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        _wait(self._ready, f"redis-server on port {self.port}")

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.process.returncode}; see "
                               f"{self.folder / 'redis.log'}")
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1).ping())
        except redis.RedisError:  # LOADING the AOF, or not listening yet
            return False

    def stop(self) -> None:
        """SIGTERM (redis-server then shuts down as on ``SHUTDOWN``: the AOF is fsynced)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)  # redis-server's SIGTERM is a SHUTDOWN
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self, down_for: float = 0.0) -> None:
        """Stop, stay down ``down_for`` seconds, start again on the same port and data."""
        self.stop()
        time.sleep(down_for)
        self.start()
        self.restarts += 1

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


class PrivateRabbit:
    """A RabbitMQ node of our own: see the module docstring."""

    def __init__(self, folder: Path, *, rabbit_env: dict[str, int] | None = None) -> None:
        """``rabbit_env``: settings of the ``rabbit`` application (``advanced.config``),
        e.g. ``{"consumer_timeout": 2500, "channel_tick_interval": 250}``."""
        scripts = rabbitmq_scripts()
        assert scripts is not None, "rabbitmq-server is not installed"
        self.scripts = scripts
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port, self.dist_port = free_port(), free_port()
        self.node = f"ojs-restart-{os.getpid()}-{secrets.token_hex(3)}@localhost"
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        (folder / "enabled_plugins").write_text("[].\n")
        (folder / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "log.console = false\n")
        settings = ", ".join(f"{{{k}, {v}}}" for k, v in (rabbit_env or {}).items())
        (folder / "advanced.config").write_text(f"[{{rabbit, [{settings}]}}].\n")
        (folder / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's (its node name)
        cookie = folder / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)

    def env(self) -> dict[str, str]:
        base = self.folder
        return {
            **os.environ,
            "HOME": str(base),  # the CLI and the node read the cookie from here
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(base / "plugins-expand"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def ctl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.scripts / "rabbitmqctl"), "-n", self.node, *args],
                              env=self.env(), capture_output=True, text=True, timeout=timeout,
                              check=False)

    def start(self) -> None:
        log = open(self.folder / "server.log", "ab")  # noqa: SIM115 - kept by the child
        self.process = subprocess.Popen(
            [str(self.scripts / "rabbitmq-server")], env=self.env(), cwd=self.folder,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        _wait(self._ready, f"RabbitMQ node {self.node} on port {self.port}")

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            tail = (self.folder / "server.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"RabbitMQ node exited with {self.process.returncode}:\n{tail}")
        return accepts(self.port)

    def stop(self) -> None:
        """``rabbitmqctl stop`` (a clean shutdown), then wait for the node's process to end."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        self.ctl("stop", timeout=60)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # the clean stop did not end it
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def restart(self, down_for: float = 0.0) -> None:
        """Stop the node, stay down ``down_for`` seconds, boot it again on the same data."""
        self.stop()
        time.sleep(down_for)
        self.start()
        self.restarts += 1

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
