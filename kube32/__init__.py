"""Kube32: Kubernetes for microcontroller-class nodes running WebAssembly pods."""
