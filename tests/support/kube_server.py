"""Run the Kubernetes emulator on 127.0.0.1 in a background thread, for sync and async users.

The official ``kubernetes`` client is synchronous and kopf's ``KopfRunner`` runs its own
event loop in a thread, so the emulator gets a loop of its own: tests then call it over
real HTTP from any thread, exactly as a client in a cluster would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.test_utils
import aiohttp.web
import aiohttp.web_server
import kubernetes.client
import kubernetes.config
import yaml
from kmock import Server

from tests.support.kube_emulator import KubeEmulator

T = TypeVar("T")
START_TIMEOUT_S = 30.0
MAX_REQUEST_BODY = 3 * 1024 * 1024
"""The API server's MaxRequestBodyBytes: a body it reads (and may then refuse as Invalid)."""


class _ApiServerBodies(aiohttp.web_server.Server):
    """aiohttp reads at most 1 MiB of a body, then answers 413, which no API server sends
    for a ConfigMap just over its 1 MiB of data: the 422 the cluster sends is what a
    client must cope with."""

    def _make_request(self, message: Any, payload: Any, protocol: Any, writer: Any,
                      task: Any) -> aiohttp.web.BaseRequest:
        return aiohttp.web.BaseRequest(message, payload, protocol, writer, task, self._loop,
                                       client_max_size=MAX_REQUEST_BODY)


class _ApiTestServer(aiohttp.test_utils.RawTestServer):
    async def _make_runner(self, debug: bool = True,
                           **kwargs: Any) -> aiohttp.web.ServerRunner:
        srv = _ApiServerBodies(self._handler, loop=self._loop, debug=debug, **kwargs)
        return aiohttp.web.ServerRunner(srv, debug=debug, **kwargs)


@dataclass(frozen=True)
class RunningEmulator:
    emulator: KubeEmulator
    url: str
    kubeconfig: Path
    loop: asyncio.AbstractEventLoop

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run a coroutine on the emulator's loop (e.g. ``emulator.install(...)``)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def install(self, *bodies: Mapping[str, Any]) -> list[dict[str, Any]]:
        return self.call(self.emulator.install(*bodies))

    def kubeconfig_as(self, token: str, path: Path) -> Path:
        """A kubeconfig whose calls bear ``token`` (``emulator.restrict`` limits them)."""
        return write_kubeconfig(path, self.url, token=token)

    def api_client(self) -> kubernetes.client.ApiClient:
        """A fresh official client configured from the kubeconfig file (close it after use)."""
        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))


def write_kubeconfig(path: Path, url: str, namespace: str = "default", *,
                     token: str = "emulator-token") -> Path:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        # A token so that clients which insist on credentials (kopf's login) find some.
        "users": [{"name": "emulator", "user": {"token": token}}],
        "contexts": [{"name": "emulator", "context": {
            "cluster": "emulator", "user": "emulator", "namespace": namespace}}],
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@contextlib.contextmanager
def serve_emulator(workdir: Path, *, seed: int = 0) -> Iterator[RunningEmulator]:
    """Start the emulator on a free port; yields once it answers; stops it on exit."""
    loop = asyncio.new_event_loop()
    ready: concurrent.futures.Future[RunningEmulator] = concurrent.futures.Future()
    stop = asyncio.Event()

    async def main() -> None:
        emulator = KubeEmulator(seed=seed)
        async with emulator, Server(emulator, server_cls=_ApiTestServer) as server:
            url = str(server.url).rstrip("/")
            await emulator.install({"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": "default"}})
            ready.set_result(RunningEmulator(
                emulator, url, write_kubeconfig(workdir / "kubeconfig", url), loop))
            await stop.wait()
            await emulator.end_watches()

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # surface start-up failures to the waiting test
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="kube-emulator", daemon=True)
    thread.start()
    running = ready.result(timeout=START_TIMEOUT_S)
    try:
        yield running
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=START_TIMEOUT_S)
