"""rbac.authorization.k8s.io/v1 kinds and core/v1 ServiceAccounts.

Roles and ClusterRoles hold ``rules``; bindings hold ``roleRef`` (immutable, as
Kubernetes) and ``subjects``.  None has a status.  Validation names the field
at fault, as Kubernetes' does, so ``kubectl create rolebinding`` errors read the
same.
"""
from __future__ import annotations

from typing import Any

from ... import objects
from .. import meta
from ..strategy import AGE_COLUMN, NAME_COLUMN, Column, Strategy

RBAC_GROUP = "rbac.authorization.k8s.io"
SUBJECT_KINDS = ("User", "Group", "ServiceAccount")


def _validate_rules(rules: Any) -> list[tuple[str, str]]:
    if rules is None:
        return []
    if not isinstance(rules, list):
        return [("rules", "Invalid value: must be a list")]
    errs: list[tuple[str, str]] = []
    for i, r in enumerate(rules):
        f = f"rules[{i}]"
        if not isinstance(r, dict):
            errs.append((f, "Invalid value: must be an object"))
            continue
        for key in ("verbs", "apiGroups", "resources", "resourceNames", "nonResourceURLs"):
            v = r.get(key)
            if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
                errs.append((f"{f}.{key}", "Invalid value: must be a list of strings"))
        if not r.get("verbs"):
            errs.append((f"{f}.verbs", "Required value: verbs must contain at least one value"))
        if r.get("nonResourceURLs") and (r.get("resources") or r.get("apiGroups")):
            errs.append((f"{f}.nonResourceURLs", "Invalid value: rules cannot apply to both regular "
                                                 "resources and non-resource URLs"))
        if not r.get("nonResourceURLs") and not r.get("resources"):
            errs.append((f"{f}.resources", "Required value: resource rules must supply at least one resource"))
    return errs


def _path_segment(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """RBAC names are path segments (Kubernetes' ValidatePathSegmentName): "system:x" is fine."""
    name = str(objects.meta(obj).get("name", ""))
    if name in (".", "..") or "/" in name or "%" in name:
        return [("metadata.name", f'Invalid value: "{name}": may not be \'.\' or \'..\' '
                                  "and may not contain '/' or '%'")]
    return []


class RoleStrategy(Strategy):
    kind = "Role"
    has_status = False
    name_rule = "any"
    top_fields = {"rules"}

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        errs = _path_segment(obj) + _validate_rules(obj.get("rules"))
        for i, r in enumerate(obj.get("rules") or []):
            if isinstance(r, dict) and r.get("nonResourceURLs"):
                errs.append((f"rules[{i}].nonResourceURLs", "Invalid value: namespaced rules cannot "
                                                            "apply to non-resource URLs"))
        return errs


class ClusterRoleStrategy(Strategy):
    kind = "ClusterRole"
    has_status = False
    name_rule = "any"
    top_fields = {"rules", "aggregationRule"}

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        return _path_segment(obj) + _validate_rules(obj.get("rules"))


class _BindingStrategy(Strategy):
    has_status = False
    name_rule = "any"
    top_fields = {"roleRef", "subjects"}
    namespaced_subjects = True
    role_kinds: tuple[str, ...] = ("Role", "ClusterRole")
    columns = [NAME_COLUMN, Column("Role"), AGE_COLUMN]

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        errs: list[tuple[str, str]] = _path_segment(obj)
        ref = obj.get("roleRef")
        if not isinstance(ref, dict):
            return errs + [("roleRef", "Required value")]
        if ref.get("kind") not in self.role_kinds:
            errs.append(("roleRef.kind", f'Unsupported value: "{ref.get("kind")}": supported values: '
                                         + ", ".join(f'"{k}"' for k in self.role_kinds)))
        if not ref.get("name"):
            errs.append(("roleRef.name", "Required value"))
        if ref.get("apiGroup", RBAC_GROUP) != RBAC_GROUP:
            errs.append(("roleRef.apiGroup", f'Unsupported value: "{ref.get("apiGroup")}": '
                                             f'supported values: "{RBAC_GROUP}"'))
        subjects = obj.get("subjects") or []
        if not isinstance(subjects, list):
            return errs + [("subjects", "Invalid value: must be a list")]
        for i, s in enumerate(subjects):
            f = f"subjects[{i}]"
            if not isinstance(s, dict):
                errs.append((f, "Invalid value: must be an object"))
                continue
            if s.get("kind") not in SUBJECT_KINDS:
                errs.append((f"{f}.kind", f'Unsupported value: "{s.get("kind")}": supported values: '
                                          '"ServiceAccount", "User", "Group"'))
            if not s.get("name"):
                errs.append((f"{f}.name", "Required value"))
            if s.get("kind") == "ServiceAccount" and not s.get("namespace") and not self.namespaced_subjects:
                errs.append((f"{f}.namespace", "Required value"))
        return errs

    def validate_update(self, new: dict[str, Any], old: dict[str, Any]) -> list[tuple[str, str]]:
        errs = self.validate(new)
        if new.get("roleRef") != old.get("roleRef"):
            errs.append(("roleRef", "Invalid value: cannot change roleRef"))
        return errs

    def row(self, obj: dict[str, Any]) -> list[Any]:
        ref = obj.get("roleRef") or {}
        return [objects.name(obj), f"{ref.get('kind', '')}/{ref.get('name', '')}", meta.age(obj)]


class RoleBindingStrategy(_BindingStrategy):
    kind = "RoleBinding"


class ClusterRoleBindingStrategy(_BindingStrategy):
    kind = "ClusterRoleBinding"
    namespaced_subjects = False
    role_kinds = ("ClusterRole",)


class ServiceAccountStrategy(Strategy):
    kind = "ServiceAccount"
    has_status = False
    top_fields = {"secrets", "imagePullSecrets", "automountServiceAccountToken"}
    columns = [NAME_COLUMN, Column("Secrets", type="integer"), AGE_COLUMN]

    def row(self, obj: dict[str, Any]) -> list[Any]:
        return [objects.name(obj), len(obj.get("secrets") or []), meta.age(obj)]


class ReviewStrategy(Strategy):
    """Access reviews are answered, never stored; the strategy only feeds discovery."""
    kind = "SubjectAccessReview"
    has_status = True
