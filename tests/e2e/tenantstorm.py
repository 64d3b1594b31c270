"""Bad bearer tokens at a kubelet, while /healthz and a node's Lease are watched
(tests/e2e/test_adversarial_tenants.py, once tests/attack/storm19b.py).

    python tenantstorm.py KUBELET_URL SECONDS CONNECTIONS API_URL ADMIN_TOKEN NODE

Prints the answers' counts, the worst /healthz time and the distinct renewTimes of the
node's Lease seen about once a second."""
from __future__ import annotations

import asyncio
import json
import secrets
import ssl
import sys
import time

import aiohttp

KUBELET, DUR, CONC, API, ADMIN, NODE = (sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                                        sys.argv[5], sys.argv[6])
CTX = ssl._create_unverified_context()
counts: dict[object, int] = {}


async def worker(s: aiohttp.ClientSession) -> None:
    end = time.time() + DUR
    while time.time() < end:
        try:
            async with s.get(f"{KUBELET}/pods/victim/vpod/http/", ssl=CTX,
                             headers={"Authorization": "Bearer " + secrets.token_hex(16)}) as r:
                await r.read()
                counts[r.status] = counts.get(r.status, 0) + 1
        except Exception as e:  # noqa: BLE001 - counted, the storm goes on
            counts[type(e).__name__] = counts.get(type(e).__name__, 0) + 1


async def probe(s: aiohttp.ClientSession) -> tuple[float, list[str]]:
    worst, renew, end = 0.0, [], time.time() + DUR
    while time.time() < end:
        t = time.time()
        try:
            async with s.get(f"{API}/healthz", ssl=CTX, timeout=aiohttp.ClientTimeout(total=10)) as r:
                await r.read()
        except Exception as e:  # noqa: BLE001
            print("healthz fail", e)
        worst = max(worst, time.time() - t)
        async with s.get(f"{API}/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}", ssl=CTX,
                         headers={"Authorization": "Bearer " + ADMIN}) as r:
            renew.append(json.loads(await r.read())["spec"]["renewTime"])
        await asyncio.sleep(1)
    return worst, renew


async def main() -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as s, \
            aiohttp.ClientSession() as p:
        res = await asyncio.gather(probe(p), *[worker(s) for _ in range(CONC)])
        worst, renew = res[0]  # type: ignore[misc]
        print("requests", counts, "rate", sum(counts.values()) / DUR)
        print("worst healthz", round(worst, 2))
        print("distinct renewals", len(set(renew)), renew[::5])


asyncio.run(main())
