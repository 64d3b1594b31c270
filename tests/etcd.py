"""The tests' etcd: a real etcd (Debian's etcd-server) on free loopback ports in a temp dir.

`etcd_cluster` is one single-member cluster for the whole session; each store test
takes a key prefix of its own on it (`store_prefix`), so tests share the cluster's one
revision counter but never see each other's keys.  Without the etcd binary or the
``[etcd]`` extra the etcd tests are skipped, except in CI (CI=true), where that is a
failure: CI installs both (.ci/run).
"""
from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
from typing import Iterator

import pytest

from kube32.sim.etcd import EtcdCluster


def need_etcd() -> None:
    """Skip (fail in CI) unless the etcd binary and the grpc client are installed."""
    missing = []
    if shutil.which("etcd") is None and not os.path.exists("/usr/bin/etcd"):
        missing.append("the etcd binary (apt-get install etcd-server)")
    if importlib.util.find_spec("aetcd") is None or importlib.util.find_spec("grpc") is None:
        missing.append("the etcd extra (pip install -e '.[etcd]')")
    if missing:
        why = "etcd tests need " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


def new_prefix() -> str:
    return f"/test-{secrets.token_hex(6)}/"


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    need_etcd()
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"), members=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def etcd_endpoints(cluster: EtcdCluster) -> str:
    return ",".join(cluster.endpoints)

