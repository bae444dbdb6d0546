"""Validating admission of the emulated API server: the `OwnerReferencesPermissionEnforcement` plugin.

Kubernetes documentation, "Admission Controllers Reference", section OwnerReferencesPermissionEnforcement
(on by default in OpenShift): "This admission controller protects the access to the
`metadata.ownerReferences` of an object so that only users with **delete** permission to the object can
change it. This admission controller also protects the access to
`metadata.ownerReferences[x].blockOwnerDeletion` of an object, so that only users with **update**
permission to the `finalizers` subresource of the referenced *owner* can change it."

Reproduced as the plugin's code (`plugin/pkg/admission/gc`) does it, on create and update (a patch is an
update): nothing is checked unless the ownerReferences change (any on a create; on an update, a list that
differs); an update that changes them needs `delete` on the object itself (a create never does: whoever may
create an object may give it any owner); each reference whose `blockOwnerDeletion` turns true (new, or
false before, matched by uid) needs `update` on `<owner resource>/finalizers`, by the owner's name, in the
object's namespace, unless the user may update `*/finalizers` of everything. `pods/status` is exempt. The
refusals are 403s with the real messages.

Not reproduced: other admission plugins (quotas, LimitRanger, PodSecurity, webhooks, ...); a kind that
maps to several resources (here a kind maps to at most one served resource).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fsdp_operator.local.server import rbac
from fsdp_operator.local.server.resources import Obj, ResourceType
from fsdp_operator.local.server.store import ApiError, Store

# The plugin's whitelist: writes to these (resource, subresource) never set owners.
_EXEMPT = {("", "pods", "status")}


@dataclass
class OwnerReferencesPermissionEnforcement:
    """The plugin; `checks` records each authorization it asked (verb, group, resource/subresource, name,
    allowed), so tests can see which permission a write needed."""

    checks: list[tuple[str, str, str, str, bool]] = field(default_factory=list)

    def validate(
        self,
        store: Store,
        user: rbac.User,
        rtype: ResourceType,
        subresource: str,
        namespace: str,
        new: Obj,
        old: Obj | None,
    ) -> None:
        """Raise the real server's 403 when `user` may not set the owners `new` has (`old` None on a create)."""
        if (rtype.group, rtype.plural, subresource) in _EXEMPT:
            return
        new_refs = _references(new)
        old_refs = _references(old) if old is not None else []
        if new_refs == old_refs:  # on a create: no owners at all
            return
        name = str((new.get("metadata") or {}).get("name") or "")
        if old is not None:
            delete = rbac.Attributes("delete", rtype.group, rtype.plural, subresource, namespace, name)
            if not self._allowed(store, user, delete):
                raise _forbidden(rtype, name, "cannot set an ownerRef on a resource you can't delete: , <nil>")
        old_blocking = {str(r.get("uid")) for r in old_refs if r.get("blockOwnerDeletion") is True}
        newly_blocking = [
            r for r in new_refs if r.get("blockOwnerDeletion") is True and str(r.get("uid")) not in old_blocking
        ]
        if not newly_blocking:
            return
        finalize_anything = rbac.Attributes("update", "*", "*", "finalizers", "", "*")
        if self._allowed(store, user, finalize_anything):
            return
        for ref in newly_blocking:
            owner = _owner_type(store, ref)
            if owner is None:
                raise _forbidden(
                    rtype,
                    name,
                    "cannot set blockOwnerDeletion in this case because cannot find RESTMapping for "
                    f"APIVersion {ref.get('apiVersion')} Kind {ref.get('kind')}: no matches for kind "
                    f'"{ref.get("kind")}" in version "{ref.get("apiVersion")}"',
                )
            finalize = rbac.Attributes(
                "update", owner.group, owner.plural, "finalizers", namespace, str(ref.get("name") or "")
            )
            if not self._allowed(store, user, finalize):
                raise _forbidden(
                    rtype,
                    name,
                    "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set "
                    "finalizers on: , <nil>",
                )

    def _allowed(self, store: Store, user: rbac.User, attrs: rbac.Attributes) -> bool:
        allowed = rbac.MASTERS in user.groups or rbac.allowed(store, user, attrs)
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        self.checks.append((attrs.verb, attrs.group, resource, attrs.name, allowed))
        return allowed


def _references(obj: Mapping[str, Any] | None) -> list[Any]:
    refs = ((obj or {}).get("metadata") or {}).get("ownerReferences")
    return list(refs) if isinstance(refs, list) else []


def _owner_type(store: Store, ref: Mapping[str, Any]) -> ResourceType | None:
    """The served resource of an ownerReference's apiVersion and kind (the plugin's RESTMapper)."""
    group, _, version = str(ref.get("apiVersion") or "").rpartition("/")
    kind = ref.get("kind")
    with store.lock:
        for rtype in store.types.values():
            if rtype.group == group and version in rtype.versions and rtype.kind == kind:
                return rtype
    return None


def _forbidden(rtype: ResourceType, name: str, reason: str) -> ApiError:
    # admission.NewForbidden: `<resource>.<group> "<name>" is forbidden: <reason>`
    return ApiError(
        403,
        "Forbidden",
        f'{rtype.group_resource} "{name}" is forbidden: {reason}',
        details={"name": name, "group": rtype.group, "kind": rtype.plural},
    )
