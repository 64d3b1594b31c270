"""kube32.kubelet: the node agent (see kubelet.py for the design and invariants).

    from kube32.kubelet import Kubelet, KubeletOptions
    kl = Kubelet(client, KubeletOptions(node_name="sim-1", port=0, heap_bytes=8 << 20))
    await kl.start(); ...; await kl.stop()

``kl.port`` is the endpoint's port once started.  The parts - one PodWorker per pod
(pods.py), the move prefetch (prefetch.py), restores (restore.py), NodePorts
(nodeports.py), the endpoint (server.py, migration.py) - take the node as the protocols
of nodeapi.py and agent.py, never the Kubelet; kubelet.py imports them all.
"""
from .kubelet import Kubelet, KubeletOptions

__all__ = ["Kubelet", "KubeletOptions"]
