"""``kube32-sim control-plane``: the API server (and, as later parts land, the
scheduler, the controllers and a kubelet for the control plane's own node).

Startup order: open the store under ``--data-dir``, load or create the tokens,
listen (port 0 picks a free port), then write the kubeconfigs with the real
address, so a kubeconfig never names a port nobody listens on.  SIGINT/SIGTERM
stop it cleanly: the listener closes, open watches end, the store closes.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from .. import serving
from ..apiserver import checkpointstatus, pki, podreplacement
from ..apiserver.auth import (APISERVER, BOOTSTRAP_USER, KUBELET_CLIENT, load_or_create_tokens,
                              read_token_file, write_kubeconfigs)
from ..apiserver.checkpointdata import SIM_CAPACITY, CheckpointDataAPI, CheckpointDataSpace
from ..apiserver.server import APIServer
from ..client import Client
from ..controllers.base import ControllerOptions
from ..controllers.manager import ControllerManager
from ..kubelet import Kubelet, KubeletOptions
from ..store import SQLiteStore

log = logging.getLogger("kube32.controlplane")

LOCAL_SOCKET = "apiserver.sock"
SUN_PATH_MAX = 100  # a Unix socket's path must fit sockaddr_un (108 bytes on Linux)


def local_socket_path(data_dir: Path) -> tuple[Path, Path | None]:
    """Where the controllers' Unix socket goes: in the data directory, or, when that path
    is too long for a socket, in a private temporary directory (returned to remove)."""
    path = data_dir.resolve() / LOCAL_SOCKET
    if len(str(path)) <= SUN_PATH_MAX:
        return path, None
    private = Path(tempfile.mkdtemp(prefix="kube32-"))  # mode 0700
    return private / LOCAL_SOCKET, private


@dataclass(frozen=True)
class ControlPlaneOptions:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    insecure_http: bool = False  # plain HTTP: kubectl then sends no token, for debugging only
    controllers: ControllerOptions = ControllerOptions()
    kubelet: KubeletOptions | None = None  # the control plane's own node (None: no kubelet)
    checkpoint_space: int = SIM_CAPACITY  # bytes of memory for all checkpoint data
    token_auth_file: Path | None = None  # static user tokens, CSV token,user,uid,"groups"


class ControlPlane:
    def __init__(self, opts: ControlPlaneOptions) -> None:
        self.opts = opts
        self.runner: serving.GuardedRunner | None = None
        self._socket_dir: Path | None = None
        self.server: APIServer | None = None
        self.store: SQLiteStore | None = None
        self.url = ""
        self.kubeconfig: Path | None = None
        self.client: Client | None = None
        self.controllers: ControllerManager | None = None
        self.kubelet: Kubelet | None = None
        self.node_client: Client | None = None

    async def start(self) -> None:
        self.opts.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = await SQLiteStore.open(self.opts.data_dir / "state.db")
        auth = load_or_create_tokens(self.opts.data_dir)
        if self.opts.token_auth_file is not None:
            auth.add_static(read_token_file(self.opts.token_auth_file))
        # The CAs exist even with --insecure-http: kubelets still get serving
        # certificates, and the API server verifies them before sending its token.
        pki_dir = self.opts.data_dir / "pki"
        cas = pki.ensure_pki(pki_dir)
        # Kubelets: HTTPS ones get a client certificate; plain-HTTP ones a token of a
        # user with no API permissions.  No node ever sees a token of system:masters.
        # The API server trusts only the kubelet-serving signer for kubelets, and clients
        # only the API server CA for the API server (kube32.apiserver.pki).
        client_cert = pki.issue_client_cert(pki_dir, "apiserver-kubelet-client", pki.KUBELET_CLIENT_CN)
        self.server = APIServer(self.store, auth, kubelet_token=auth.token_for(KUBELET_CLIENT),
                                 kubelet_ssl=pki.client_context(cas.kubelet, client_cert),
                                 images_dir=self.opts.data_dir / "images")
        self.server.kubelets.cert_auth = True
        self.server.pki_dir = pki_dir
        await self.server.ensure_defaults()
        CheckpointDataAPI(self.server, CheckpointDataSpace(self.opts.checkpoint_space))
        # The data space starts empty: what the Checkpoints held is gone, and they say so.
        await checkpointstatus.lost_at_start(self.server.registry)
        podreplacement.install(self.server)
        self.runner = serving.GuardedRunner(self.server.app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        ssl_ctx, ca_pem = None, None
        if not self.opts.insecure_http:
            crt, key = pki.issue_serving_cert(pki_dir, "apiserver", pki.default_hosts(self.opts.host))
            ssl_ctx, ca_pem = pki.server_context(crt, key), cas.apiserver.read_bytes()
        site = web.TCPSite(self.runner, self.opts.host, self.opts.port, reuse_address=True,
                           ssl_context=ssl_ctx)
        await site.start()
        # The controllers' own door: a Unix socket only this user can open (the data
        # directory's socket file, mode 0600).  Requests still carry the API server's
        # token and pass authentication, authorization and admission like any other; what
        # they skip is TLS and TCP between two ends of one process.
        local, self._socket_dir = local_socket_path(self.opts.data_dir)
        local.unlink(missing_ok=True)
        old_umask = os.umask(0o177)
        try:
            await web.UnixSite(self.runner, str(local)).start()
        finally:
            os.umask(old_umask)
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        port = sock.getsockname()[1]
        scheme = "http" if self.opts.insecure_http else "https"
        self.url = f"{scheme}://{self.opts.host}:{port}"
        self.kubeconfig = write_kubeconfigs(self.opts.data_dir, self.url, auth, ca_pem)
        # The control loops use the API like any client (through the Unix socket), as the API
        # server's own identity: every write passes the same validation and watch.
        self.client = Client("http://localhost", auth.token_for(APISERVER), unix_socket=str(local),
                             user_agent="kube32-controller-manager")
        self.controllers = ControllerManager(self.client, self.opts.controllers)
        await self.controllers.start()
        if self.opts.kubelet is not None:
            # The control plane's node joins like any worker: over the API, with the
            # node bootstrap token (the kubelet trades it for its own at start).
            self.node_client = Client(self.url, auth.token_for(BOOTSTRAP_USER), ca_pem=ca_pem,
                                      user_agent=f"kubelet/{self.opts.kubelet.node_name}")
            self.kubelet = Kubelet(self.node_client, self.opts.kubelet)
            await self.kubelet.start()

    async def stop(self) -> None:
        if self.kubelet is not None:
            await self.kubelet.stop()
        if self.node_client is not None:
            await self.node_client.close()
        if self.controllers is not None:
            await self.controllers.stop()
        if self.client is not None:
            await self.client.close()
        if self.store is not None:
            await self.store.close()  # ends open watches so the runner can finish
        if self.runner is not None:
            await self.runner.cleanup()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)


async def run_control_plane(opts: ControlPlaneOptions) -> int:
    # Handlers first: a signal that arrives while starting still stops cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    cp = ControlPlane(opts)
    await cp.start()
    print(f"kube32 control plane listening on {cp.url}", flush=True)
    print(f"kubeconfig: {cp.kubeconfig}", flush=True)
    print(f"try: kubectl --kubeconfig {cp.kubeconfig} get nodes,pods", flush=True)
    await stop.wait()
    print("kube32 control plane stopping", flush=True)
    await cp.stop()
    return 0
