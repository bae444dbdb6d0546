"""Authentication by bearer token and authorization by Kubernetes RBAC, for the emulated API server.

`ApiServer(access=Access())` turns both on: a request without a known token is 401, a request the
RBAC objects in the store (Role, ClusterRole, RoleBinding, ClusterRoleBinding) do not allow is 403,
with the real server's message. Members of `system:masters` may do anything, as on a real cluster.
Every authorized resource request is recorded (`Access.calls`), so tests can list what a client
really called. Tokens can be replaced (`rotate`) or given an expiry, to test credential refresh.

Rules are evaluated as Kubernetes' RBAC authorizer does: verbs, apiGroups, resources (with
`resource/subresource`, `*/subresource`, and `*`, which covers subresources too), resourceNames (they
never match a create, nor a list or a watch unless its fieldSelector is `metadata.name=NAME`), a Role
or a ClusterRole bound by a RoleBinding grants only in the binding's namespace (and never a
cluster-scoped resource), a ClusterRoleBinding grants everywhere and on cluster-scoped resources. Subjects: User,
Group, ServiceAccount (with the groups `system:serviceaccounts` and `system:serviceaccounts:<ns>`
every service account has, and `system:authenticated`).

Not reproduced: aggregated ClusterRoles (`aggregationRule`), the escalation check on creating or
binding roles, impersonation, `nonResourceURLs` rules (discovery, `/version` and `/openapi` are open
to every authenticated user, as the default `system:discovery` binding makes them), client
certificates and the TokenReview/SubjectAccessReview APIs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fsdp_operator.local.server.resources import Obj, ResourceType
from fsdp_operator.local.server.store import ApiError, Store

RBAC_GROUP = "rbac.authorization.k8s.io"
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"


def rbac_types() -> list[ResourceType]:
    """The four RBAC kinds, served under rbac.authorization.k8s.io/v1."""

    def kind(kind: str, plural: str, namespaced: bool) -> ResourceType:
        return ResourceType(
            group=RBAC_GROUP, versions=("v1",), kind=kind, plural=plural, singular=kind.lower(), namespaced=namespaced
        )

    return [
        kind("Role", "roles", True),
        kind("RoleBinding", "rolebindings", True),
        kind("ClusterRole", "clusterroles", False),
        kind("ClusterRoleBinding", "clusterrolebindings", False),
    ]


@dataclass(frozen=True, slots=True)
class User:
    name: str
    groups: tuple[str, ...] = ()


def service_account(namespace: str, name: str) -> User:
    """The user a service account's token authenticates as."""
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
    )


@dataclass(frozen=True, slots=True)
class Attributes:
    """What a resource request asks: which verb, on what. `namespace` is "" at cluster scope."""

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Call(Attributes):
    """One resource request as recorded: what it asked, and who asked."""

    user: str


@dataclass
class _Token:
    user: User
    expires: float | None


@dataclass
class Access:
    """Who may call: tokens -> users, and RBAC read from the store at each request (so changes apply at once)."""

    tokens: dict[str, _Token] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    denied: list[Call] = field(default_factory=list)
    anonymous: User | None = None
    """Who a request without an `Authorization` header is (a real server with `--anonymous-auth` calls it
    `system:anonymous`); None: such a request is 401. kubectl sends a kubeconfig's token only over TLS, so a test
    that runs kubectl against this server over plain HTTP names the user it acts as here."""
    unauthorized: int = 0
    """Requests refused with 401 (no token, an unknown one, or one that was rotated away or expired)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    # --- tokens ---
    def add_token(self, token: str, user: User, *, ttl: float | None = None) -> None:
        with self.lock:
            self.tokens[token] = _Token(user, None if ttl is None else time.monotonic() + ttl)

    def rotate(self, user: str, new_token: str, *, ttl: float | None = None) -> None:
        """Accept `new_token` for `user` and no token it had before (a rotated or expired credential)."""
        with self.lock:
            found = [t for t in self.tokens.values() if t.user.name == user]
            if not found:
                raise KeyError(f"no token for {user}")
            self.tokens = {k: v for k, v in self.tokens.items() if v.user.name != user}
            self.tokens[new_token] = _Token(found[0].user, None if ttl is None else time.monotonic() + ttl)

    def authenticate(self, authorization: str) -> User:
        """The user a request's `Authorization` header names; 401 when there is none or it is not accepted."""
        if not authorization and self.anonymous is not None:
            return User(self.anonymous.name, (*self.anonymous.groups, "system:unauthenticated"))
        scheme, _, token = authorization.partition(" ")
        with self.lock:
            entry = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
            if entry is not None and entry.expires is not None and time.monotonic() >= entry.expires:
                entry = None
            if entry is None:
                self.unauthorized += 1
        if entry is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return User(entry.user.name, (*entry.user.groups, AUTHENTICATED))

    # --- authorization ---
    def authorize(self, store: Store, user: User, attrs: Attributes) -> None:
        """Record the call; 403 with the real server's wording when RBAC does not allow it."""
        call = Call(**asdict(attrs), user=user.name)
        if MASTERS in user.groups or allowed(store, user, attrs):
            with self.lock:
                self.calls.append(call)
            return
        with self.lock:
            self.denied.append(call)
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        group_resource = f"{resource}.{attrs.group}" if attrs.group else resource
        target = group_resource + (f' "{attrs.name}"' if attrs.name else "")
        scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        where = f'in API group "{attrs.group}" {scope}'
        raise ApiError(
            403,
            "Forbidden",
            f'{target} is forbidden: User "{user.name}" cannot {attrs.verb} resource "{resource}" {where}',
            details={"name": attrs.name, "group": attrs.group, "kind": attrs.resource},
        )

    def calls_by(self, user: str) -> set[tuple[str, str, str, str]]:
        """(verb, group, resource[/subresource], scope) for every call `user` made; scope "namespace" or "cluster"."""
        with self.lock:
            return {
                (
                    c.verb,
                    c.group,
                    f"{c.resource}/{c.subresource}" if c.subresource else c.resource,
                    "namespace" if c.namespace else "cluster",
                )
                for c in self.calls
                if c.user == user
            }


def _subject_matches(subject: Mapping[str, Any], user: User, binding_namespace: str) -> bool:
    kind = subject.get("kind")
    name = str(subject.get("name") or "")
    if kind == "User":
        return name == user.name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = str(subject.get("namespace") or binding_namespace)
        return user.name == f"system:serviceaccount:{namespace}:{name}"
    return False


def _rule_matches(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    groups = rule.get("apiGroups") or []
    if "*" not in groups and attrs.group not in groups:
        return False
    # As Kubernetes' RuleAllows: `*` is every resource and every subresource, `pods/status` one subresource,
    # `*/status` that subresource of every resource; `pods` alone grants no subresource, and there is no
    # `pods/*` (it matches only a subresource literally named `*`).
    resources = set(rule.get("resources") or [])
    wanted = {"*", f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource}
    if attrs.subresource:
        wanted.add(f"*/{attrs.subresource}")
    if not wanted & resources:
        return False
    names = rule.get("resourceNames") or []
    return not names or (bool(attrs.name) and attrs.name in names)


def _role_rules(store: Store, ref: Mapping[str, Any], namespace: str) -> Iterable[Mapping[str, Any]]:
    kind, name = ref.get("kind"), str(ref.get("name") or "")
    plural = "clusterroles" if kind == "ClusterRole" else "roles" if kind == "Role" else ""
    if not plural:
        return []
    role = store.peek(store.resource(plural, RBAC_GROUP), name, namespace if kind == "Role" else None)
    if role is None:
        return []  # a binding to a role that does not exist grants nothing
    return [r for r in role.get("rules") or [] if isinstance(r, Mapping)]


def _bindings(store: Store, plural: str) -> list[Obj]:
    return store.project(store.resource(plural, RBAC_GROUP), lambda binding: binding)


def allowed(store: Store, user: User, attrs: Attributes) -> bool:
    """Whether any binding of `user` grants `attrs` (RBAC only allows; there are no deny rules).

    Every request is authorized, so the bindings and roles are read as stored, under the store's lock, not copied
    (copying them was a tenth of the emulated server's CPU with many jobs at once); nothing read is changed."""
    with store.lock:
        for binding in _bindings(store, "clusterrolebindings"):
            if not any(_subject_matches(s, user, "") for s in binding.get("subjects") or []):
                continue
            if any(_rule_matches(r, attrs) for r in _role_rules(store, binding.get("roleRef") or {}, "")):
                return True
        if not attrs.namespace:
            return False  # cluster-scoped requests (and lists across all namespaces) need a ClusterRoleBinding
        for binding in _bindings(store, "rolebindings"):
            namespace = str((binding.get("metadata") or {}).get("namespace") or "")
            if namespace != attrs.namespace:
                continue
            if not any(_subject_matches(s, user, namespace) for s in binding.get("subjects") or []):
                continue
            if any(_rule_matches(r, attrs) for r in _role_rules(store, binding.get("roleRef") or {}, namespace)):
                return True
        return False


def name_from_field_selector(field_selector: str) -> str:
    """The name a list or watch asks for with `fieldSelector=metadata.name=NAME`: the real server authorizes
    such a request against `resourceNames` as if it named that object (RequestInfo's name); '' otherwise."""
    for term in field_selector.split(","):
        key, sep, value = term.partition("==") if "==" in term else term.partition("=")
        if sep and key.strip() == "metadata.name" and not key.endswith("!"):
            return value.strip()
    return ""


def verb_of(method: str, has_name: bool, watch: bool) -> str:
    """The RBAC verb of an HTTP request on a resource path."""
    if method == "GET":
        return "get" if has_name else ("watch" if watch else "list")
    if method == "DELETE":
        return "delete" if has_name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
