"""kube32.kubelet: the node agent (see kubelet.py for the design and invariants).

    from kube32.kubelet import Kubelet, KubeletOptions
    kl = Kubelet(client, KubeletOptions(node_name="sim-1", port=0, heap_bytes=8 << 20))
    await kl.start(); ...; await kl.stop()

``kl.port`` is the endpoint's port once started; ``kl.pod_frozen_changed(uid)`` is
the hook freeze/thaw calls so Ready is written at once.
"""
from .kubelet import Kubelet, KubeletOptions

__all__ = ["Kubelet", "KubeletOptions"]
