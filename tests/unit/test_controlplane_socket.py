"""The controllers' Unix socket: in the data directory, or a private one when too long."""
from pathlib import Path

from kube32.sim.controlplane import LOCAL_SOCKET, SUN_PATH_MAX, local_socket_path


def test_the_socket_lives_in_the_data_directory(tmp_path: Path) -> None:
    path, private = local_socket_path(tmp_path)
    assert path == tmp_path.resolve() / LOCAL_SOCKET and private is None


def test_a_data_directory_too_deep_for_a_socket_gets_a_private_one(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * SUN_PATH_MAX)
    deep.mkdir()
    path, private = local_socket_path(deep)
    try:
        assert private is not None and path.parent == private
        assert len(str(path)) <= SUN_PATH_MAX
        assert private.stat().st_mode & 0o777 == 0o700
    finally:
        private.rmdir()
