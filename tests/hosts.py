"""Separate hosts on one machine: network namespaces behind a bridge, for many-host tests.

`Network` makes a bridge holding the service address (the root namespace: API, Postgres,
Redis, object store) and adds hosts, each a network namespace on a veth pair with an
address of its own, that reach the services only over that address, as another machine
would. Postgres and the shared Redis listen on 127.0.0.1 alone, so `Forwarder` relays a
port of the service address to them. Everything made is removed by `close`.

Needs root (CAP_NET_ADMIN) and `ip` from iproute2; CI runs as root on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


def _ip(*arguments: str) -> None:
    subprocess.run(["ip", *arguments], check=True, capture_output=True, timeout=30)


@dataclass
class Host:
    """A network namespace with one address on the network, where processes run."""

    name: str
    address: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def popen(self, argv: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        """Start `argv` on this host in a process group of its own, its output in `log`."""
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["ip", "netns", "exec", self.name, *argv],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def kill_all(self) -> None:
        """kill -9 every process started here (their whole process groups)."""
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 9)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)


class Network:
    """A bridge with the service address, and hosts behind it, on a /24."""

    def __init__(self, subnet: str | None = None) -> None:
        # A subnet of its own per run: one a crashed run left behind is never reused.
        self.subnet = subnet or f"10.231.{random.randrange(1, 255)}"
        self.tag = uuid.uuid4().hex[:6]  # names of this run's links and namespaces
        self.bridge = f"rsbr{self.tag}"
        self.address = f"{self.subnet}.1"  # the services'
        self.hosts: list[Host] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except subprocess.CalledProcessError:
            self.close()
            raise

    def add_host(self, label: str) -> Host:
        """A new namespace on a veth pair whose outer end joins the bridge."""
        number = len(self.hosts) + 2
        host = Host(f"rs{self.tag}{label}", f"{self.subnet}.{number}")
        outer, inner = f"rsv{self.tag}{number}", f"rsi{self.tag}{number}"
        _ip("netns", "add", host.name)
        self.hosts.append(host)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", host.name)
        _ip("link", "set", outer, "master", self.bridge)
        _ip("link", "set", outer, "up")
        inside = ("netns", "exec", host.name, "ip")
        _ip(*inside, "addr", "add", f"{host.address}/24", "dev", inner)
        _ip(*inside, "link", "set", inner, "up")
        _ip(*inside, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        """Stop the hosts' processes; remove the namespaces (their veths go with them) and
        the bridge."""
        for host in self.hosts:
            host.kill_all()
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", host.name)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", self.bridge)


@contextlib.contextmanager
def network(subnet: str | None = None) -> Iterator[Network]:
    """A `Network`, removed at the end whatever happens."""
    made = Network(subnet)
    try:
        yield made
    finally:
        made.close()


class Forwarder:
    """Relays TCP connections to (listen address, port) on to (target host, port), in a
    thread with its own event loop."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.listen, self.target = listen, target
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.relays: set[asyncio.Task[None]] = set()
        self.thread = threading.Thread(target=self._run, name="forwarder", daemon=True)

    def __enter__(self) -> Forwarder:
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError(f"the forwarder on {self.listen} did not start")
        return self

    def __exit__(self, *_: object) -> None:
        self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        self.stopping = asyncio.Event()
        server = await asyncio.start_server(self._relay, *self.listen, reuse_address=True)
        self.ready.set()
        await self.stopping.wait()
        server.close()
        for task in self.relays:  # open connections end with the forwarder
            task.cancel()
        await asyncio.gather(*self.relays, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.relays.add(task)
        try:
            target_reader, target_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        finally:
            task.add_done_callback(self.relays.discard)
        await asyncio.gather(
            _pipe(reader, target_writer), _pipe(target_reader, writer), return_exceptions=True
        )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    finally:
        writer.close()
