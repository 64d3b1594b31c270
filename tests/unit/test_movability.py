"""The control plane's blockers, one per row of the spec's table, word for word."""
from kube32.movability import embedded_digest, policy, spec_blockers


def pod(**spec_extra) -> dict:
    annotations = spec_extra.pop("annotations", {})
    container = spec_extra.pop("container", {})
    return {"metadata": {"name": "p", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "x", **container}], **spec_extra}}


def test_a_plain_pod_has_no_blockers() -> None:
    assert spec_blockers(pod()) == []
    assert spec_blockers(pod(container={"resources": {"requests": {"hardware.kube32.io/ipc": "1"}}})) == []


def test_each_row_of_the_table() -> None:
    assert spec_blockers(pod(container={"resources": {"limits": {"hardware.kube32.io/display": "1"}}})) == \
        ["grant hardware.kube32.io/display"]
    assert spec_blockers(pod(container={"resources": {"requests": {"esp32.io/gpio": "2"}}})) == ["grant esp32.io/gpio"]
    assert spec_blockers(pod(container={"securityContext": {"capabilities": {"add": ["KEYBOARD", "NET_ADMIN"]}}})) == \
        ["grant capability KEYBOARD"]
    assert spec_blockers(pod(annotations={"kube32.io/i2c-device": "0x3c"})) == ["grant kube32.io/i2c-device"]
    assert spec_blockers(pod(volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}])) == \
        ["volume claim data on node storage"]
    assert spec_blockers(pod(annotations={"kube32.io/migration": "Never"})) == ["annotation kube32.io/migration: Never"]
    assert spec_blockers(pod(), image_exports=["memory", "_start"]) == ["entry point _start runs on its own thread"]
    assert spec_blockers(pod(), image_exports=["memory", "k32_handle"]) == []


def test_every_reason_is_listed() -> None:
    p = pod(annotations={"kube32.io/migration": "Never"},
            container={"resources": {"requests": {"hardware.kube32.io/speaker": "1"}},
                       "securityContext": {"capabilities": {"add": ["SD"]}}},
            volumes=[{"name": "card", "csi": {"driver": "kube32.io/sd"}}])
    assert spec_blockers(p, ["main"]) == [
        "grant hardware.kube32.io/speaker", "grant capability SD", "volume claim card on node storage",
        "annotation kube32.io/migration: Never", "entry point main runs on its own thread"]


def test_policy_and_digest() -> None:
    assert policy(pod()) == "OnDrain"
    assert policy(pod(annotations={"kube32.io/migration": "Auto"})) == "Auto"
    assert embedded_digest("kube32.io/wasm-sha256:ABcd") == "abcd"
    assert embedded_digest("wasm://h/x.wasm") is None
