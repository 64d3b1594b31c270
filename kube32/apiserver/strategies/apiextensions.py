"""apiextensions.k8s.io/v1 CustomResourceDefinitions, and the strategy of the custom
resources each one defines (as apiextensions-apiserver's ``customresourcedefinition``
and ``customresource`` strategies).

A CRD's spec is checked here whole (group, names, scope, versions with exactly one
storage version, structural schemas through :mod:`..schemavalidation`, subresources,
printer columns); whether its names clash with a built-in kind or another CRD needs the
cluster's view and is kube32.apiserver.crds's.  Its status is the server's: created
with ``NamesAccepted`` True and ``Established`` False (the catalog of every API server
sets it True once it serves the CRD), ``acceptedNames`` and ``storedVersions``; every
CRD carries the finalizer ``customresourcecleanup.apiextensions.k8s.io``, removed once
its custom resources are gone.

A :func:`custom_strategy` is made per served version: defaults, pruning and validation
by the version's schema (its CEL rules by :mod:`..celrules`, on every write of the object,
its status or its scale), status only through ``/status`` when the version has that
subresource (then ``metadata.generation`` counts changes of everything but metadata and
status; without it, of everything but metadata), and the table of its
``additionalPrinterColumns``.
"""
from __future__ import annotations

import copy
import json
import re
from typing import Any

from ... import objects
from ...terms import Condition
from .. import celrules, errors, meta, schemavalidation
from ..strategy import AGE_COLUMN, METADATA_FIELDS, NAME_COLUMN, Column, Strategy, get_path

GROUP = "apiextensions.k8s.io"
CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
ESTABLISHED = Condition.CRD_ESTABLISHED
NAMES_ACCEPTED = Condition.CRD_NAMES_ACCEPTED
TERMINATING = Condition.CRD_TERMINATING
SCOPES = ("Namespaced", "Cluster")
MAX_VERSIONS = 16
MAX_COLUMNS = 32
MAX_SHORT_NAMES = 16
KIND_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*\Z")
VERSION_RE = re.compile(r"^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?\Z|^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
COLUMN_TYPES = ("integer", "number", "string", "boolean", "date")
SPEC_FIELDS = {"group", "names", "scope", "versions", "conversion", "preserveUnknownFields"}

Obj = dict[str, Any]
Errors = list[tuple[str, str]]


def condition_entry(ctype: str, status: str, reason: str, message: str) -> Obj:
    return {"type": ctype, "status": status, "lastTransitionTime": objects.rfc3339(),
            "reason": reason, "message": message}


def set_condition(obj: Obj, ctype: str, status: str, reason: str, message: str) -> bool:
    """Set a condition of ``obj``'s status; whether anything changed."""
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    for c in conditions:
        if c.get("type") == ctype:
            if c.get("status") == status and c.get("reason") == reason:
                return False
            c.update(condition_entry(ctype, status, reason, message))
            return True
    conditions.append(condition_entry(ctype, status, reason, message))
    return True


def storage_version(crd: Obj) -> str | None:
    for v in get_path(crd, "spec", "versions", default=[]) or []:
        if isinstance(v, dict) and v.get("storage") is True:
            return v.get("name")
    return None


class CustomResourceDefinitionStrategy(Strategy):
    kind = "CustomResourceDefinition"
    delete_finalizers = (CLEANUP_FINALIZER,)   # its objects go with it, whatever an update did
    top_fields = {"spec", "status"}
    columns = [NAME_COLUMN, Column("Created At", type="date", description="creation time")]
    spec_fields = ("spec",)

    def prepare_for_create(self, obj: Obj) -> None:
        super().prepare_for_create(obj)
        md = obj.setdefault("metadata", {})
        finalizers = md.get("finalizers")
        if finalizers is None:
            md["finalizers"] = [CLEANUP_FINALIZER]
        elif isinstance(finalizers, list) and CLEANUP_FINALIZER not in finalizers:
            md["finalizers"] = [*finalizers, CLEANUP_FINALIZER]
        stored = storage_version(obj)
        obj["status"] = {"acceptedNames": copy.deepcopy(objects.spec(obj).get("names") or {}),
                         "storedVersions": [stored] if stored else [],
                         "conditions": [condition_entry(NAMES_ACCEPTED, "True", "NoConflicts",
                                                        "no conflicts found"),
                                        condition_entry(ESTABLISHED, "False", "Installing",
                                                        "the initial names have been accepted")]}

    def prepare_for_update(self, new: Obj, old: Obj) -> None:
        super().prepare_for_update(new, old)
        status = new.setdefault("status", {})
        status["acceptedNames"] = copy.deepcopy(objects.spec(new).get("names") or {})
        stored = storage_version(new)
        versions = list(status.get("storedVersions") or [])
        if stored and stored not in versions:
            versions.append(stored)
        status["storedVersions"] = versions

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        names = spec.get("names")
        if isinstance(names, dict) and isinstance(names.get("kind"), str):
            names.setdefault("singular", names["kind"].lower())
            names.setdefault("listKind", f"{names['kind']}List")
        spec.setdefault("conversion", {"strategy": "None"})

    def unknown_nested(self, obj: Obj) -> list[str]:
        spec = obj.get("spec")
        return [f"spec.{k}" for k in spec if k not in SPEC_FIELDS] if isinstance(spec, dict) else []

    def validate(self, obj: Obj) -> Errors:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return [("spec", "Required value")]
        errs: Errors = []
        group = spec.get("group")
        if not isinstance(group, str) or not group:
            errs.append(("spec.group", "Required value"))
        elif meta.subdomain_problem(group) or "." not in group:
            errs.append(("spec.group", f'Invalid value: "{group}": should be a domain with at least one dot'))
        errs += _validate_names(spec.get("names"))
        plural = get_path(spec, "names", "plural")
        name = objects.name(obj)
        if isinstance(group, str) and isinstance(plural, str) and name != f"{plural}.{group}":
            errs.append(("metadata.name", f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group'))
        if spec.get("scope") not in SCOPES:
            errs.append(("spec.scope", f'Unsupported value: {spec.get("scope")!r}: supported values: '
                                       '"Cluster", "Namespaced"'))
        errs += _validate_versions(spec.get("versions"))
        conversion = spec.get("conversion")
        if isinstance(conversion, dict) and conversion.get("strategy", "None") != "None":
            # Every version reads and writes the same stored objects: nothing to convert, and
            # no webhook of the user's is called by the API server.
            errs.append(("spec.conversion.strategy", f"Unsupported value: {json.dumps(conversion.get('strategy'))}: "
                                                     "Kube32 serves no conversion webhook: supported values: "
                                                     '"None"'))
        return errs

    async def validate_async(self, new: Obj, old: Obj | None) -> Errors:
        """The versions' CEL rules, compiled on a CEL thread (slow), once the spec passed
        ``validate`` (so every schema is structural: the rules' walk trusts its shape)."""
        if old is not None and objects.spec(new) == objects.spec(old):
            return []
        errs: Errors = []
        for i, v in enumerate(objects.spec(new).get("versions") or []):
            schema = get_path(v, "schema", "openAPIV3Schema")
            if isinstance(schema, dict) and "x-kubernetes-validations" in json.dumps(schema):
                errs += await celrules.check_off_loop(schema, f"spec.versions[{i}].schema.openAPIV3Schema")
        return errs

    def validate_update(self, new: Obj, old: Obj) -> Errors:
        errs = self.validate(new)
        for field in ("group", "scope"):
            if objects.spec(new).get(field) != objects.spec(old).get(field):
                errs.append((f"spec.{field}", "Invalid value: field is immutable"))
        if get_path(new, "spec", "names", "plural") != get_path(old, "spec", "names", "plural"):
            errs.append(("spec.names.plural", "Invalid value: field is immutable"))
        return errs

    def row(self, obj: Obj) -> list[Any]:
        return [objects.name(obj), objects.meta(obj).get("creationTimestamp", "")]


def _validate_names(names: Any) -> Errors:
    if not isinstance(names, dict):
        return [("spec.names", "Required value")]
    errs: Errors = []
    for field in ("plural", "singular"):
        value = names.get(field)
        if not value and field == "plural":
            errs.append(("spec.names.plural", "Required value"))
        elif value and (not isinstance(value, str) or len(value) > 63 or not meta.DNS1123_LABEL.match(value)):
            errs.append((f"spec.names.{field}", f'Invalid value: "{value}": {meta.LABEL_MSG}'))
    for field in ("kind", "listKind"):
        value = names.get(field)
        if not value and field == "kind":
            errs.append(("spec.names.kind", "Required value"))
        elif value and (not isinstance(value, str) or not KIND_RE.match(value)):
            errs.append((f"spec.names.{field}", f'Invalid value: "{value}": may have mixed case, but should '
                                                'otherwise match: [a-z]([-a-z0-9]*[a-z0-9])?'))
    if names.get("kind") and names.get("kind") == names.get("listKind"):
        errs.append(("spec.names.listKind", "Invalid value: kind and listKind may not be the same"))
    for field, bound in (("shortNames", MAX_SHORT_NAMES), ("categories", MAX_SHORT_NAMES)):
        values = names.get(field)
        if values is None:
            continue
        if not isinstance(values, list) or len(values) > bound:
            errs.append((f"spec.names.{field}", f"Invalid value: must be a list of at most {bound} names"))
            continue
        for i, value in enumerate(values):
            if not isinstance(value, str) or len(value) > 63 or not meta.DNS1123_LABEL.match(value):
                errs.append((f"spec.names.{field}[{i}]", f'Invalid value: "{value}": {meta.LABEL_MSG}'))
    return errs


def _validate_versions(versions: Any) -> Errors:
    if not isinstance(versions, list) or not versions:
        return [("spec.versions", "Invalid value: must have at least one version")]
    if len(versions) > MAX_VERSIONS:
        return [("spec.versions", f"Too many: {len(versions)}: must have at most {MAX_VERSIONS} items")]
    errs: Errors = []
    seen: set[str] = set()
    storage = 0
    for i, v in enumerate(versions):
        path = f"spec.versions[{i}]"
        if not isinstance(v, dict):
            errs.append((path, "Invalid value: must be an object"))
            continue
        name = v.get("name")
        if not isinstance(name, str) or len(name) > 63 or not VERSION_RE.match(name):
            errs.append((f"{path}.name", f'Invalid value: "{name}": {meta.LABEL_MSG}'))
        elif name in seen:
            errs.append((f"{path}.name", f'Duplicate value: "{name}"'))
        else:
            seen.add(name)
        for flag in ("served", "storage"):
            if not isinstance(v.get(flag), bool):
                errs.append((f"{path}.{flag}", "Required value: must be true or false"))
        storage += v.get("storage") is True
        errs += _validate_version_parts(v, path)
    if storage != 1:
        errs.append(("spec.versions", "Invalid value: must have exactly one version marked as storage version"))
    if not any(isinstance(v, dict) and v.get("served") is True for v in versions):
        errs.append(("spec.versions", "Invalid value: must have at least one version served"))
    return errs


def _validate_version_parts(v: Obj, path: str) -> Errors:
    errs: Errors = []
    schema = get_path(v, "schema", "openAPIV3Schema")
    if schema is None:
        errs.append((f"{path}.schema.openAPIV3Schema", "Required value: schemas are required"))
    else:
        errs += schemavalidation.check_schema(schema, f"{path}.schema.openAPIV3Schema")
    subs = v.get("subresources")
    if subs is not None:
        if not isinstance(subs, dict):
            errs.append((f"{path}.subresources", "Invalid value: must be an object"))
        else:
            errs += _validate_scale(subs.get("scale"), f"{path}.subresources.scale")
    cols = v.get("additionalPrinterColumns")
    if cols is not None:
        if not isinstance(cols, list) or len(cols) > MAX_COLUMNS:
            errs.append((f"{path}.additionalPrinterColumns", f"Invalid value: must be a list of at most "
                                                             f"{MAX_COLUMNS} columns"))
        else:
            for j, col in enumerate(cols):
                errs += _validate_column(col, f"{path}.additionalPrinterColumns[{j}]")
    return errs


def _validate_scale(scale: Any, path: str) -> Errors:
    if scale is None:
        return []
    if not isinstance(scale, dict):
        return [(path, "Invalid value: must be an object")]
    errs: Errors = []
    for field in ("specReplicasPath", "statusReplicasPath"):
        value = scale.get(field)
        if not isinstance(value, str) or not value.startswith("."):
            errs.append((f"{path}.{field}", "Invalid value: must be a simple json path starting with ."))
    if scale.get("specReplicasPath") and not str(scale["specReplicasPath"]).startswith(".spec."):
        errs.append((f"{path}.specReplicasPath", "Invalid value: should be a json path under .spec"))
    if scale.get("statusReplicasPath") and not str(scale["statusReplicasPath"]).startswith(".status."):
        errs.append((f"{path}.statusReplicasPath", "Invalid value: should be a json path under .status"))
    return errs


def _validate_column(col: Any, path: str) -> Errors:
    if not isinstance(col, dict):
        return [(path, "Invalid value: must be an object")]
    errs: Errors = []
    if not isinstance(col.get("name"), str) or not col["name"]:
        errs.append((f"{path}.name", "Required value"))
    if col.get("type") not in COLUMN_TYPES:
        errs.append((f"{path}.type", f'Unsupported value: {col.get("type")!r}: supported values: '
                                     + ", ".join(f'"{t}"' for t in COLUMN_TYPES)))
    json_path = col.get("jsonPath")
    if not isinstance(json_path, str) or simple_path(json_path) is None:
        errs.append((f"{path}.jsonPath", f"Invalid value: {json_path!r}: must be a simple JSON path "
                                         "such as .spec.replicas or .status.conditions[0].type"))
    return errs


# --- the custom resources' strategy ------------------------------------------------
_STEP = re.compile(r"\.([A-Za-z0-9_\-]+)|\[(\d+)\]|\['([^']+)'\]")


def simple_path(text: str) -> list[str | int] | None:
    """``.spec.replicas`` / ``.status.conditions[0].type`` as steps; None if not such a path."""
    if not text.startswith(".") and not text.startswith("["):
        return None
    steps: list[str | int] = []
    pos = 0
    while pos < len(text):
        m = _STEP.match(text, pos)
        if m is None:
            return None
        steps.append(int(m.group(2)) if m.group(2) is not None else (m.group(1) or m.group(3)))
        pos = m.end()
    return steps if steps else None


def cell(obj: Obj, column: Obj) -> Any:
    steps = simple_path(column.get("jsonPath", "")) or []
    value = get_path(obj, *steps) if steps else None
    if value is None:
        return None
    if column.get("type") == "date":
        return meta.age(obj, value) if isinstance(value, str) else None
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return value


class CustomResourceStrategy(Strategy):
    """One served version of a CRD; made by :func:`custom_strategy`, never directly."""
    # Every custom resource has a generation, whether or not it has a spec: spec_fields
    # names a field every stored object has (the registry sets apiVersion first).
    spec_fields = ("apiVersion",)
    name_rule = "subdomain"
    typed = False                # its nulls are the schema's to judge (nullable)
    schema: Obj = {}
    printer_columns: list[Obj] = []
    scale: Obj | None = None     # the version's scale subresource (specReplicasPath...), if any
    has_rules = False            # the schema has x-kubernetes-validations (compiled when first used)
    group = ""

    def __init__(self) -> None:
        self.terminating = False   # its CRD is being deleted: no new objects

    def prepare_for_create(self, obj: Obj) -> None:
        if self.terminating:
            raise errors.method_not_allowed("create not allowed while custom resource definition "
                                            "is terminating")
        super().prepare_for_create(obj)

    def default(self, obj: Obj) -> None:
        schemavalidation.prune(obj, self.schema)
        schemavalidation.apply_defaults(obj, self.schema)

    def prepare_for_status_update(self, new: Obj, old: Obj) -> None:
        """A /status write is pruned, defaulted and checked by the schema too (the registry
        checks only whole-object writes): a 422 names the status field."""
        super().prepare_for_status_update(new, old)
        schemavalidation.prune(new, self.schema)
        schemavalidation.apply_defaults(new, self.schema)
        errs = [e for e in self.validate_update(new, old) if e[0].startswith("status")]
        if errs:
            raise errors.invalid(self.kind, objects.name(new), errs, self.group)

    def spec_changed(self, new: Obj, old: Obj) -> bool:
        skip = {"metadata", "status"} if self.has_status else {"metadata"}
        return ({k: v for k, v in new.items() if k not in skip} != {k: v for k, v in old.items() if k not in skip})

    def unknown_fields(self, obj: Obj) -> list[str]:
        probe = copy.deepcopy(obj)
        dropped = schemavalidation.prune(probe, self.schema)
        md = obj.get("metadata")
        if isinstance(md, dict):
            dropped += [f"metadata.{k}" for k in md if k not in METADATA_FIELDS]
        return dropped

    def validate(self, obj: Obj) -> Errors:
        return schemavalidation.validate(obj, self.schema)

    def validate_update(self, new: Obj, old: Obj) -> Errors:
        """As apiextensions-apiserver: the x-kubernetes-list-type rules bind an update only
        when the old object kept them (one stored before its CRD made a list a map list
        stays writable, its duplicates and all)."""
        errs = self.validate(new)
        if any(schemavalidation.is_list_type_error(e) for e in errs) and any(
                schemavalidation.is_list_type_error(e) for e in self.validate(old)):
            errs = [e for e in errs if not schemavalidation.is_list_type_error(e)]
        return errs

    async def validate_async(self, new: Obj, old: Obj | None) -> Errors:
        """The schema's x-kubernetes-validations (CEL), off the event loop, once the schema holds."""
        if not self.has_rules:
            return []
        return await celrules.evaluate_off_loop(self.schema, new, old if old is not None else celrules.ABSENT)

    def row(self, obj: Obj) -> list[Any]:
        if not self.printer_columns:
            return [objects.name(obj), meta.age(obj)]
        return [objects.name(obj), *(cell(obj, c) for c in self.printer_columns)]


def custom_strategy(crd: Obj, version: Obj) -> CustomResourceStrategy:
    """The strategy of ``crd``'s served ``version`` (both checked by the CRD strategy)."""
    kind = get_path(crd, "spec", "names", "kind", default="")
    columns_spec = [c for c in version.get("additionalPrinterColumns") or [] if isinstance(c, dict)]
    columns = [NAME_COLUMN, AGE_COLUMN] if not columns_spec else [NAME_COLUMN] + [
        Column(c["name"], type="string" if c.get("type") == "date" else c.get("type", "string"),
               format=c.get("format", ""), priority=int(c.get("priority") or 0),
               description=c.get("description", "")) for c in columns_spec]
    has_status = isinstance(get_path(version, "subresources", "status"), dict)
    schema = copy.deepcopy(get_path(version, "schema", "openAPIV3Schema", default={}) or {})
    cls = type(f"{kind}Strategy", (CustomResourceStrategy,),
               {"kind": kind, "group": get_path(crd, "spec", "group", default=""), "has_status": has_status,
                "columns": columns, "schema": schema,
                "has_rules": "x-kubernetes-validations" in json.dumps(schema),
                "printer_columns": columns_spec,
                "scale": copy.deepcopy(get_path(version, "subresources", "scale"))})
    return cls()
