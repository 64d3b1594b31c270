"""Vendor Kubernetes' OpenAPI schemas for the kinds Kube32 serves.

The source is the ``kubernetes-validate`` wheel (PyPI; 1.37.0 ships the schemas of
every Kubernetes release since 1.19 as JSON Schema, converted from kube-apiserver's own
``/openapi/v2``).  This script reads the release Kube32's ``/version`` names (v1.32),
keeps the definitions of the kinds of kube32.apiserver.resources (their lists, the
kinds of their subresources and the meta types the API answers), with everything they
refer to, turns the JSON Schema spellings back into OpenAPI's (``type: [string, null]``
is ``type: string``; int-or-string and quantity), and writes them gzipped to
kube32/apiserver/openapi/definitions.json.gz, which kube32.apiserver.openapi serves.

    pip download --no-deps kubernetes-validate==1.37.0 -d /tmp/kv
    python tools/vendor_openapi.py /tmp/kv/kubernetes_validate-1.37.0-py3-none-any.whl

Run it again for a newer release (``--release``); the Checkpoint schema is Kube32's
own (kube32/apiserver/schema.py).
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kube32.apiserver.resources import RESOURCES  # noqa: E402

OUT = ROOT / "kube32" / "apiserver" / "openapi" / "definitions.json.gz"
REF = "#/$defs/"
# Kinds the API answers besides the resources' own (subresources, Status, options).
EXTRA_KINDS = [("", "v1", "Status"), ("", "v1", "DeleteOptions"), ("", "v1", "WatchEvent"),
               ("", "v1", "APIResourceList"), ("", "v1", "APIGroupList"), ("", "v1", "APIGroup"),
               ("", "v1", "APIVersions"), ("policy", "v1", "Eviction"), ("autoscaling", "v1", "Scale"),
               ("", "v1", "Binding"), ("authentication.k8s.io", "v1", "TokenRequest")]
# JSON Schema's spellings of two Kubernetes formats, back in OpenAPI's.
FORMATS = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
}


def load(wheel: Path, release: str) -> dict[str, Any]:
    name = f"kubernetes_validate/kubernetes-json-schema/{release}-local/_definitions.json"
    with zipfile.ZipFile(wheel) as z:
        return json.loads(z.read(name))["$defs"]


def openapi_form(node: Any) -> Any:
    """A JSON Schema node in OpenAPI v2's spelling (refs to ``#/definitions/``)."""
    if isinstance(node, list):
        return [openapi_form(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref":
            out[key] = "#/definitions/" + value[len(REF):]
        elif key == "type" and isinstance(value, list):
            kinds = [t for t in value if t != "null"]
            out[key] = kinds[0] if len(kinds) == 1 else kinds
        elif key == "properties":
            out[key] = {k: openapi_form(v) for k, v in value.items()}
        else:
            out[key] = openapi_form(value)
    return out


def served_kinds() -> set[tuple[str, str, str]]:
    kinds = set(EXTRA_KINDS)
    for r in RESOURCES:
        kinds.add((r.group, r.version, r.kind))
        if "list" in r.verbs:
            kinds.add((r.group, r.version, r.list_kind))
    return kinds


def refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"][len(REF):]} if isinstance(node.get("$ref"), str) else set()
        for v in node.values():
            found |= refs(v)
        return found
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node)) if node else set()
    return set()


def select(defs: dict[str, Any]) -> dict[str, Any]:
    wanted = served_kinds()
    roots = [name for name, d in defs.items()
             if any((g["group"], g["version"], g["kind"]) in wanted
                    for g in d.get("x-kubernetes-group-version-kind", []))]
    keep: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep.add(name)
        todo.extend(refs(defs[name]) - keep)
    out = {}
    for name in sorted(keep):
        d = FORMATS.get(name) or openapi_form(defs[name])
        if name in FORMATS and "description" in defs[name]:
            d = {"description": defs[name]["description"], **d}
        if d.get("x-kubernetes-group-version-kind"):   # the converter pinned kind and apiVersion
            for field in ("kind", "apiVersion"):
                d.get("properties", {}).get(field, {}).pop("enum", None)
        out[name] = d
    missing = {k for k in wanted if k[0] != "kube32.io"} - {
        (g["group"], g["version"], g["kind"]) for n in roots for g in defs[n]["x-kubernetes-group-version-kind"]}
    if missing:
        raise SystemExit(f"no schema in the release for {sorted(missing)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path, help="the kubernetes-validate wheel")
    ap.add_argument("--release", default="v1.32.0", help="the Kubernetes release's schemas (default v1.32.0)")
    args = ap.parse_args()
    out = select(load(args.wheel, args.release))
    doc = {"source": f"kubernetes-validate {args.wheel.name}, {args.release}", "definitions": out}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(gzip.compress(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), 9, mtime=0))
    print(f"{len(out)} definitions, {OUT.stat().st_size} bytes -> {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
