"""kube32-sim's flags that pick sizes: the checkpoint data space."""
from kube32.sim.main import _parser, checkpoint_space


def space(*extra: str) -> int:
    argv = ["control-plane", "--data-dir", "x", *extra]
    return checkpoint_space(_parser().parse_args(argv), argv)


def test_the_simulator_has_16_mib_and_the_devkit_board_256_kib() -> None:
    assert space() == 16 << 20
    assert space("--profile", "devkit") == 256 << 10
    assert space("--profile", "laptop") == 16 << 20
    assert space("--checkpoint-space", "1Mi") == 1 << 20
