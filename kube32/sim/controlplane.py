"""``kube32-sim control-plane``: the API server, the scheduler, the controllers and a
kubelet for the control plane's own node (a child process: kube32/sim/node.py).

Startup order: open the store (``--store``: SQLite under ``--data-dir``, or etcd), load or create the tokens,
listen (port 0 picks a free port), then write the kubeconfigs with the real
address, so a kubeconfig never names a port nobody listens on.  SIGINT/SIGTERM
stop it cleanly, workers connected or not: the listener closes, open watches and
topic subscriptions end, the store closes, and a request still running after
``serving.SHUTDOWN_GRACE_SECONDS`` (a followed log, a proxied stream) is cancelled.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import signal
import socket
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from .. import serving
from ..collector import SurvivorFreezer
from ..stalls import StallWatch
from ..apiserver import pki
from ..apiserver.auth import APISERVER, load_or_create_tokens, read_token_file, write_kubeconfigs
from ..apiserver.dataspace import SIM_CAPACITY, CheckpointDataSpace
from ..apiserver.limits import MAX_REQUEST_LINE
from ..apiserver.server import APIServer
from ..client import Client
from ..controllers.base import ControllerOptions
from ..controllers.leaderelection import LeaderElectionTimings, LeaderElector
from ..controllers.manager import ControllerManager
from ..kubelet import KubeletOptions
from ..store import Store
from ..store.config import StoreSpec
from ..store.opening import open_store
from .node import NodeProcess

log = logging.getLogger("kube32.controlplane")

LOCAL_SOCKET = "apiserver.sock"
SUN_PATH_MAX = 100  # a Unix socket's path must fit sockaddr_un (108 bytes on Linux)
PEER_CHECK_SECONDS = 2.0  # how often a leader on its own API server looks for others


def controller_identity(data_dir: Path) -> str:
    """This control plane's name in leader election, kept in the data directory so a
    restarted control plane takes its own Lease back at once."""
    path = data_dir / "controller-identity"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        identity = f"{socket.gethostname()}_{uuid.uuid4()}"
        path.write_text(identity + "\n")
        return identity


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
    leader_election: LeaderElectionTimings = LeaderElectionTimings()  # client-go's defaults
    kubelet: KubeletOptions | None = None  # the control plane's own node (None: no kubelet)
    checkpoint_space: int = SIM_CAPACITY  # bytes of memory for all checkpoint data
    token_auth_file: Path | None = None  # static user tokens, CSV token,user,uid,"groups"
    store: StoreSpec = StoreSpec()  # --store: SQLite under data_dir (default), or etcd


class ControlPlane:
    def __init__(self, opts: ControlPlaneOptions) -> None:
        self.opts = opts
        self.runner: serving.GuardedRunner | None = None
        self._socket_dir: Path | None = None
        self.server: APIServer | None = None
        self.store: Store | None = None
        self.url = ""
        self.kubeconfig: Path | None = None
        self.client: Client | None = None
        self.controllers: ControllerManager | None = None  # while this control plane leads
        self.elector: LeaderElector | None = None
        self._campaign: asyncio.Task[None] | None = None
        self._ca_pem: bytes | None = None
        self.node: NodeProcess | None = None     # the control plane's own node, a child process

    async def start(self) -> None:
        self.opts.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = await open_store(self.opts.store, self.opts.data_dir)
        auth = load_or_create_tokens(self.opts.data_dir)
        if self.opts.token_auth_file is not None:
            auth.add_static(read_token_file(self.opts.token_auth_file))
        # The CAs exist even with --insecure-http: kubelets still get serving
        # certificates, and the API server verifies them (for their node's name).
        pki_dir = self.opts.data_dir / "pki"
        cas = pki.ensure_pki(pki_dir)
        # Kubelets: HTTPS ones get the API server's client certificate, and are verified
        # for their node's name; plain-HTTP ones a token bound to their Node alone
        # (kube32.apiserver.kubeletcredentials).  No node ever receives a credential
        # another kubelet accepts.  The API server trusts only the kubelet-serving signer
        # for kubelets, and clients only the API server CA for the API server
        # (kube32.apiserver.pki).
        client_cert = pki.issue_client_cert(pki_dir, "apiserver-kubelet-client", pki.KUBELET_CLIENT_CN)
        self.server = APIServer(self.store, auth,
                                 kubelet_tls=functools.partial(pki.client_context, cas.kubelet, client_cert),
                                 images_dir=self.opts.data_dir / "images", pki_dir=pki_dir,
                                 data_space=CheckpointDataSpace(self.opts.checkpoint_space))
        await self.server.start(shared_store=self.opts.store.is_etcd)
        self.runner = serving.GuardedRunner(self.server.app, handler_cancellation=True, access_log=None,
                                            max_line_size=MAX_REQUEST_LINE)
        await self.runner.setup()
        ssl_ctx, ca_pem = None, None
        if not self.opts.insecure_http:
            crt, key = pki.issue_serving_cert(pki_dir, pki.APISERVER_SERVING, pki.default_hosts(self.opts.host))
            ssl_ctx, ca_pem = pki.server_context(crt, key), cas.apiserver.read_bytes()
        site = web.TCPSite(self.runner, self.opts.host, self.opts.port, reuse_address=True,
                           ssl_context=ssl_ctx)
        await site.start()
        port = self.runner.addresses[0][1]   # the one site yet: (host, port[, ...]) as bound
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
        scheme = "http" if self.opts.insecure_http else "https"
        self.url = f"{scheme}://{self.opts.host}:{port}"
        self.kubeconfig = write_kubeconfigs(self.opts.data_dir, self.url, auth, ca_pem)
        self._ca_pem = ca_pem
        if self.opts.store.is_etcd:
            # Other API servers may share the store: announce this one, and answer checkpoint
            # data GETs for data they hold (kube32/apiserver/peers.py).
            await self.server.join_peers(self.url, auth.token_for(APISERVER), ca_pem)
        # The control loops use the API like any client (through the Unix socket), as the API
        # server's own identity: every write passes the same validation and watch.
        self.client = Client("http://localhost", auth.token_for(APISERVER), unix_socket=str(local),
                             user_agent="kube32-controller-manager")
        # The controllers and the scheduler run on one control plane at a time: the one
        # holding the Lease (kube32/controllers/leaderelection.py), as kube-controller-manager.
        self.elector = LeaderElector(self.client, controller_identity(self.opts.data_dir),
                                     self.opts.leader_election)
        self._campaign = asyncio.create_task(self.elector.run(self._lead), name="leader-election")
        if self.opts.kubelet is not None:
            # The control plane's node joins like any worker: over the API, with the
            # node bootstrap token (the kubelet trades it for its own at start), from a
            # process of its own, so its pods never share this process's GIL (pwasm runs
            # Wasm in Python): kube32/sim/node.py.
            self.node = NodeProcess(self.opts.data_dir / "node.kubeconfig", self.opts.kubelet)
            await self.node.start()

    async def _lead(self) -> None:
        """This control plane's term as the leader: a fresh controller manager, stopped
        when the term ends (cancelled by the elector).  A manager on this API server (alone,
        or failed over to it) is started again on the others once they run (see
        _controllers_client)."""
        assert self.elector is not None
        while True:
            client, alone = await self._controllers_client()
            # Fencing: no controller write once the term may have passed (leaderelection.py).
            client.guard = self.elector.fence
            self.controllers = ControllerManager(client, self.opts.controllers)
            try:
                await self.controllers.start()
                while not await self._back_to_peers(client, alone):
                    await asyncio.sleep(PEER_CHECK_SECONDS)
                log.info("other API servers run now: the controllers move to them")
            finally:
                await self.controllers.stop()
                self.controllers = None
                await client.close()

    async def _back_to_peers(self, client: Client, alone: bool) -> bool:
        """Whether the controllers should start again on the other API servers: they run on
        this one (alone at the start, or their client failed over to it when the one it used
        died) while others run now."""
        on_self = alone or client.server == self.url.rstrip("/")
        return on_self and await self._peers_up()

    async def _peers_up(self) -> bool:
        return self.server is not None and self.server.peers is not None and bool(await self.server.peers.others())

    async def _controllers_client(self) -> tuple[Client, bool]:
        """The leader's controllers use this API server through its Unix socket; when
        other API servers share the store, they use those instead (this one last), so
        the snapshots they pull, held in the memory of the API server that pulls them,
        outlive the leader: losing the leader then costs a failover of the controllers,
        not the checkpoint data (docs/high-availability.md)."""
        assert self.client is not None and self.server is not None
        others = await self.server.peers.others() if self.server.peers is not None else []
        if not others:  # a client of its own (the guard is the controllers' alone)
            return self.client.sibling(), True
        return Client(others[0], self.client.token, ca_pem=self._ca_pem, servers=[*others, self.url],
                      user_agent="kube32-controller-manager"), False

    async def stop(self) -> None:
        if self.node is not None:
            await self.node.stop()
        if self._campaign is not None:
            self._campaign.cancel()  # stops the controllers, then releases the Lease
            await asyncio.gather(self._campaign, return_exceptions=True)
        if self.server is not None:
            await self.server.leave_peers()
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
    # The process's event loop is the API server's and the controllers': a stall of it
    # (a long step, a full garbage collection) is logged with its cause (kube32.stalls).
    stalls = StallWatch()
    stalls.start()
    await cp.start()
    # Full collections scan only what is new since the last one (kube32.collector): at
    # a thousand nodes each scan of every cached object held the loop for over a second.
    freezer = SurvivorFreezer()
    freezer.start()
    print(f"kube32 control plane listening on {cp.url}", flush=True)
    print(f"kubeconfig: {cp.kubeconfig}", flush=True)
    print(f"try: kubectl --kubeconfig {cp.kubeconfig} get nodes,pods", flush=True)
    await stop.wait()
    print("kube32 control plane stopping", flush=True)
    freezer.stop()
    await cp.stop()
    await stalls.stop()
    return 0
