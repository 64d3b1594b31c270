"""The other API servers of a cluster on one store, and the checkpoint data they hold.

Checkpoint data lives in the memory of the API server that received it (the spec):
with several API servers, a GET of the data (a user's, or a move's target restoring)
may come to one that does not hold it.  That one asks its peers, and streams the first
200 it gets; the data is never copied into it.

Each API server announces itself as kube-apiserver does its identity: a Lease
``kube-system/kube32-apiserver-<hash of its URL>`` labelled ``kube32.io/apiserver``,
``holderIdentity`` its URL, renewed every `RENEW_SECONDS` (`DURATION_SECONDS` long)
and deleted on a clean stop; the renewal goes on through any store error (a quorum
loss ends, and the Lease comes back).  A peer whose Lease expired took the data it
held: the first API server still running marks those Checkpoints ``DataStored=False``
(:meth:`Peers._after_peers_went`).  Its peers are the others whose Lease was renewed within
its duration.  A peer is asked with the API server's own credentials (the local one
has authorized the request already) and the header `PEER_HEADER`, so it answers from
its own memory only: a question never goes round.

Trust (a Lease is no proof: whoever may write it could name any address):

* Only ``system:kube-apiserver`` writes the Leases named `LEASE_PREFIX` in
  `NAMESPACE` (kube32/apiserver/authz.py), and a Lease counts only when its name is
  `lease_name` of the URL it holds.
* A peer is verified before anything is sent to it (:meth:`Peers.verified`): its URL
  is https; a TLS handshake to it verifies its serving certificate with the cluster's
  API server CA alone and the address against the certificate's names; and the
  certificate is an API server's serving certificate (pki.apiserver_cert_problem), not a
  node's or a client's.  A verdict is kept `VERIFY_SECONDS`.
* No credential ever goes to a plain-http URL or an unverified one: the checkpoint data
  asks and the leader's controllers (kube32/sim/controlplane.py) use :meth:`Peers.others`,
  which lists verified peers only.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import ssl
from typing import Any, Callable

import aiohttp
import yarl

from ..store import StoreError
from ..terms import GROUP_PATH, Header, Label
from . import checkpointstatus, errors, pki
from .registry import Registry
from .resources import by_plural

log = logging.getLogger("kube32.peers")

NAMESPACE = "kube-system"
LABEL = Label.APISERVER
PEER_HEADER = Header.PEER
RENEW_SECONDS = 5.0
DURATION_SECONDS = 15
ASK_TIMEOUT = 5.0  # to connect to a peer and have its answer begin (waitSeconds comes on top)
LEASE_PREFIX = "kube32-apiserver-"
VERIFY_SECONDS = 60.0  # how long a verified peer's verdict is kept
REFUSED_SECONDS = 5.0  # how long a refusal is (a peer whose Lease came first may not listen yet)
VERIFY_TIMEOUT = 2.0   # the TLS handshake of a verification


def lease_name(url: str) -> str:
    return LEASE_PREFIX + hashlib.sha256(url.encode()).hexdigest()[:16]


def _micro_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _fresh(lease: dict[str, Any], now: dt.datetime) -> bool:
    spec = lease.get("spec") or {}
    try:
        renewed = dt.datetime.strptime(spec.get("renewTime") or "", "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return False
    age = (now - renewed.replace(tzinfo=dt.timezone.utc)).total_seconds()
    return age < float(spec.get("leaseDurationSeconds") or DURATION_SECONDS)


class Peers:
    def __init__(self, registry: Registry, url: str, token: str, ca_pem: bytes | None) -> None:
        self.registry = registry
        self.url = url
        self._headers = {"Authorization": f"Bearer {token}", PEER_HEADER: "1"}
        # Peers are verified with the API server CA alone (never the system's roots).
        self._ssl: ssl.SSLContext | None = (ssl.create_default_context(cadata=ca_pem.decode())
                                            if ca_pem else None)
        self._session: aiohttp.ClientSession | None = None
        self._verdicts: dict[str, tuple[float, bool]] = {}  # url -> (monotonic time, is a peer)
        self._known: set[str] = set()  # the peers seen at the last renewal
        # Whether this API server holds a Checkpoint's data (by uid); set by its owner.
        self.holds: Callable[[str], bool] | None = None

    # --- the announcement --------------------------------------------------

    async def run(self) -> None:
        """Announce this API server until cancelled; then withdraw."""
        res = by_plural("leases")
        name = lease_name(self.url)
        try:
            while True:
                try:
                    await self._renew(res, name)
                except errors.APIError as e:
                    log.info("cannot renew this API server's Lease: %s", e.message)
                except StoreError as e:  # no quorum, no member: renew again once it is back
                    log.info("cannot renew this API server's Lease: %s", e)
                try:
                    await self._after_peers_went()
                except (errors.APIError, StoreError) as e:
                    log.info("cannot check the checkpoint data of the API servers that went: %s", e)
                await asyncio.sleep(RENEW_SECONDS)
        finally:
            try:
                await self.registry.delete(res, NAMESPACE, name)
            except Exception:  # noqa: BLE001 - a stop goes on: the Lease then just expires
                pass
            if self._session is not None:
                await self._session.close()

    async def _renew(self, res: Any, name: str) -> None:
        spec = {"holderIdentity": self.url, "leaseDurationSeconds": DURATION_SECONDS, "renewTime": _micro_now()}
        lease = await self.registry.try_get(res, NAMESPACE, name)
        if lease is None:
            await self.registry.create(res, NAMESPACE, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": {LABEL: "true"}},
                "spec": spec})
        else:
            await self.registry.mutate(res, NAMESPACE, name, lambda obj: {**obj, "spec": spec})

    async def _after_peers_went(self) -> None:
        """When a peer went (its Lease expired), the Checkpoints whose data it held say so
        (checkpointstatus.lost_with_peer): done by the first of the API servers still
        running (by URL), asking every one, the gone ones included (a slow one may answer)."""
        now = set(await self.others())
        went, self._known = self._known - now, now
        if not went or self.holds is None or any(u < self.url for u in now):
            return
        lost = await self._mark_unheld(sorted(now | went))
        log.info("API servers %s went; %d checkpoints lost their data with them", ", ".join(sorted(went)), lost)

    async def restarted(self) -> None:
        """This API server started with an empty data space while others run: the data it
        held before (a restart within its Lease's term, which no peer sees expire) is gone,
        so the Checkpoints whose data no API server holds say so now (attack round 26b)."""
        lost = await self._mark_unheld(sorted(await self.others()))
        if lost:
            log.info("%d checkpoints lost their data with this API server's restart", lost)

    async def _mark_unheld(self, asked: list[str]) -> int:
        """checkpointstatus.lost_with_peer for the Checkpoints whose data neither this API
        server nor any of ``asked`` holds; how many."""
        holds = self.holds
        assert holds is not None

        async def held(ck: dict[str, Any]) -> bool:
            md = ck["metadata"]
            if holds(md["uid"]):
                return True
            path = f"{GROUP_PATH}/namespaces/{md.get('namespace')}/checkpoints/{md['name']}/data"
            for url in asked:
                resp = await self._ask(url, path, "")
                if resp is not None:
                    resp.close()
                    return True
            return False
        return await checkpointstatus.lost_with_peer(self.registry, held)

    async def others(self) -> list[str]:
        """The other API servers: fresh Leases whose holder passes :meth:`verified`."""
        leases, _ = await self.registry.list(by_plural("leases"), NAMESPACE)
        now = dt.datetime.now(dt.timezone.utc)
        holders = sorted({h for lease in leases if isinstance(h := (lease.get("spec") or {}).get("holderIdentity"), str)
                          and h != self.url and lease["metadata"].get("name") == lease_name(h)
                          and (lease["metadata"].get("labels") or {}).get(LABEL) and _fresh(lease, now)})
        verdicts = await asyncio.gather(*(self.verified(h) for h in holders))
        return [h for h, ok in zip(holders, verdicts, strict=True) if ok]

    async def verified(self, url: str) -> bool:
        """Whether ``url`` is an API server of this cluster (see the module docstring)."""
        kept = self._verdicts.get(url)
        if kept is not None and asyncio.get_running_loop().time() - kept[0] < (
                VERIFY_SECONDS if kept[1] else REFUSED_SECONDS):
            return kept[1]
        problem = await self._verify(url)
        if problem:
            log.warning("not a peer API server, sending it nothing: %s: %s", url, problem)
        self._verdicts[url] = (asyncio.get_running_loop().time(), problem is None)
        return problem is None

    async def _verify(self, url: str) -> str | None:
        """Why ``url`` is not a verified API server, or None."""
        try:
            u = yarl.URL(url)
        except ValueError:
            return "not a URL"
        if u.scheme != "https" or not u.host or u.path not in ("", "/") or u.user or u.query_string:
            return "not an https://HOST:PORT URL (a peer is asked over TLS only)"
        if self._ssl is None:
            return "this API server serves no TLS, so it cannot verify peers"
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(
                u.host, u.port, ssl=self._ssl, server_hostname=u.host), VERIFY_TIMEOUT)
        except (OSError, TimeoutError, ssl.SSLError) as e:
            return f"no verified TLS handshake: {e}"
        try:
            obj = writer.get_extra_info("ssl_object")
            der = obj.getpeercert(binary_form=True) if obj is not None else None
        finally:
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), VERIFY_TIMEOUT)
            except (OSError, TimeoutError, ssl.SSLError):
                pass
        return pki.apiserver_cert_problem(der) if der else "it presented no certificate"

    async def alive(self) -> list[str]:
        """The peers that answer their /healthz now (a Lease outlives its holder a while; its
        store check excluded: a peer cut off from the store still holds its data)."""
        async def answers(url: str) -> bool:
            try:
                timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT / 5)
                async with self.session.get(f"{url}/healthz?exclude=etcd", timeout=timeout) as r:
                    return r.status == 200
            except (aiohttp.ClientError, OSError, TimeoutError):
                return False
        urls = await self.others()
        return [u for u, ok in zip(urls, await asyncio.gather(*(answers(u) for u in urls)), strict=True) if ok]

    # --- asking ------------------------------------------------------------

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl or True))
        return self._session

    async def first_holder(self, path: str, query: str) -> aiohttp.ClientResponse | None:
        """The first peer's 200 answer to GET `path`?`query` (an open response: the caller
        reads and closes it), or None when none of them has it."""
        asks = [asyncio.ensure_future(self._ask(url, path, query)) for url in await self.others()]
        winner = None
        try:
            for done in asyncio.as_completed(asks):
                winner = await done
                if winner is not None:
                    return winner
            return None
        finally:
            for ask in asks:
                ask.cancel()
            for other in await asyncio.gather(*asks, return_exceptions=True):
                if isinstance(other, aiohttp.ClientResponse) and other is not winner:
                    other.close()

    async def _ask(self, url: str, path: str, query: str) -> aiohttp.ClientResponse | None:
        target = f"{url}{path}" + (f"?{query}" if query else "")
        try:
            resp = await self.session.get(target, headers=self._headers,
                                          timeout=aiohttp.ClientTimeout(total=None, sock_connect=ASK_TIMEOUT))
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            log.debug("peer %s did not answer for %s: %s", url, path, e)
            return None
        if resp.status != 200:
            resp.release()
            return None
        return resp

