"""A test-side Kubernetes API emulator (kmock 0.8 subclass) plus sync harnesses for kubectl and kopf.

``FaithfulEmulator`` keeps kmock's discovery (``resources``), request records and object storage
(``objects``: ``kmock.Object`` histories keyed by ``(resource, namespace, name)``), but serves every
object endpoint (``/api/v1/...``, ``/apis/g/v/...``) itself, with what kopf 1.45 and kubectl 1.32
rely on: uid / resourceVersion / creationTimestamp / generation; 409 AlreadyExists and Conflict
(stale resourceVersion in PUT or merge patch); 422 when a JSON-patch ``test`` op fails (as the
real apiserver does; kopf catches exactly that); a separate ``/status`` subresource; merge,
JSON and strategic-merge (as merge) patches; PUT; finalizers; graceful deletion of pods (a bound, unfinished
pod is kept Terminating with a ``deletionTimestamp`` until a DELETE with ``gracePeriodSeconds=0``, as
a kubelet sends once its containers stopped); label/field selectors; watches that
resume from a resourceVersion (an event log), ``timeoutSeconds``, ``sendInitialEvents``; Tables for
``kubectl get`` (with a CRD's printer columns); CRDs (from YAML or created at runtime) both served as resources and stored.
Hooks into kmock: ``__call__`` (kmock 0.8's path parser crashes on ``/api/v1/namespaces``; discovery
GETs go straight to the scaffold's handlers, since kmock's dispatch scans every request served so
far), the ``ResourcesArray``/``ResourceInfo`` discovery model and the ``ObjectsArray`` store.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import importlib
import importlib.util
import json
import math
import re
import secrets
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version as _dist_version
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import aiohttp.test_utils
import aiohttp.web
import attrs
import yaml
from kmock import KubernetesEmulator, KubernetesError, ResourceInfo, resource
from kmock._internal import rendering

from tests.support.yaml_docs import file_docs

assert _dist_version("kmock") == "0.8", "FaithfulEmulator subclasses kmock 0.8 internals; re-check on upgrade"

KUBECTL = "/usr/bin/kubectl"
CRDS = resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
CRD_VERBS = {"list", "watch", "get", "create", "patch", "update", "delete", "deletecollection"}


class ApiError(Exception):
    """Rendered as a Kubernetes ``Status`` object, e.g. ``ApiError(404, 'NotFound', '... not found')``."""

    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(code, reason, message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def response(self) -> aiohttp.web.Response:
        details = {k: v for k, v in self.details.items() if k != "retry_after"}
        headers = {"Retry-After": str(self.details["retry_after"])} if "retry_after" in self.details else None
        return aiohttp.web.json_response({
            "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": self.code,
            "reason": self.reason, "message": self.message, "details": details}, status=self.code, headers=headers)


@attrs.frozen
class Slow:
    """A fault's answer: serve the request only after ``seconds`` (a slow or overloaded server)."""

    seconds: float


@attrs.frozen
class CutWatch:
    """A fault's answer for a watch: end the stream after ``after`` seconds, with the last chunk as a
    server ending it does (``abrupt=False``) or by dropping the connection (``abrupt=True``, as a
    restarting server or a load balancer does). Ignored for other requests."""

    after: float
    abrupt: bool = False


# The harness's own requests (``Cluster.request``/``watch``: the test playing users, kubelet and other
# controllers) carry this User-Agent; faults are played on every other client only.
HARNESS_AGENT = "solar-test-harness"
# discovery paths -> the kmock scaffold handler that serves them (the routes kmock 0.8 registers)
DISCOVERY = [(re.compile(p), attr) for p, attr in (
    (r"/apis/[^/]+/[^/]+/?", "_serve_version"), (r"/apis/[^/]+/?", "_serve_group"), (r"/api/[^/]+/?", "_serve_version"),
    (r"/version/?", "_serve_server_version"), (r"/apis/?", "_serve_apis"), (r"/api/?", "_serve_api"),
    (r"/", "_serve_root"))]


class Target(NamedTuple):
    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None


def parse_path(path: str) -> Target | None:
    """An object/collection path -> Target; None for discovery and non-Kubernetes paths."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None  # /namespaces/NS/plural/..., but not /namespaces/NAME/{status,finalize}
    if rest[0] == "namespaces" and len(rest) >= 3 and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
        namespace, rest = rest[1], rest[2:]
    return Target(group, version, rest[0], namespace, rest[1] if len(rest) > 1 else None, "/".join(rest[2:]) or None)


# --- patches ------------------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (``None`` deletes a key; lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strip_smp_directives(patch: Any) -> Any:
    """Strategic-merge patch -> merge patch: drop ``$...`` directives; ``$patch: delete`` -> null."""
    if isinstance(patch, dict):
        if patch.get("$patch") == "delete":
            return None
        return {k: strip_smp_directives(v) for k, v in patch.items() if not k.startswith("$")}
    return [strip_smp_directives(v) for v in patch] if isinstance(patch, list) else patch


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 JSON patch; any failing op (incl. ``test``) is a 422, as in kube-apiserver."""
    def fail(msg: str) -> ApiError:
        return ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: {msg}")

    def tokens(ptr: str) -> list[str]:
        return [t.replace("~1", "/").replace("~0", "~") for t in ptr.split("/")[1:]] if ptr else []

    def get(d: Any, toks: list[str]) -> Any:
        try:
            for t in toks:
                d = d[int(t)] if isinstance(d, list) else d[t]
            return d
        except (KeyError, IndexError, ValueError, TypeError):
            raise fail(f"path /{'/'.join(toks)} not found") from None

    def add(d: Any, toks: list[str], value: Any) -> Any:
        if not toks:
            return value
        parent, last = get(d, toks[:-1]), toks[-1]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if not 0 <= index <= len(parent):
                raise fail(f"index {last} out of range")
            parent.insert(index, value)
        elif isinstance(parent, dict):
            parent[last] = value
        else:
            raise fail(f"cannot add to /{'/'.join(toks)}")
        return d

    def remove(d: Any, toks: list[str]) -> Any:
        parent, last = get(d, toks[:-1]), toks[-1]
        get(parent, [last])  # must exist
        return parent.pop(int(last)) if isinstance(parent, list) else parent.pop(last)

    doc = copy.deepcopy(doc)
    for op in ops if isinstance(ops, list) else []:
        kind, path = op.get("op"), tokens(op.get("path", ""))
        if kind == "test":
            if get(doc, path) != op.get("value"):
                raise fail(f"testing value {op.get('path')} failed")
        elif kind == "add":
            doc = add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            remove(doc, path)
        elif kind == "replace":
            remove(doc, path) if path else None
            doc = add(doc, path, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            source = tokens(op.get("from", ""))
            value = remove(doc, source) if kind == "move" else copy.deepcopy(get(doc, source))
            doc = add(doc, path, value)
        else:
            raise fail(f"unsupported op {kind!r}")
    return doc


# --- selectors ----------------------------------------------------------------------------------

def _terms(selector: str) -> list[str]:
    return [t.strip() for t in re.split(r",(?![^()]*\))", selector or "") if t.strip()]


def labels_match(labels: dict[str, str], selector: str) -> bool:
    """Equality (``=``, ``==``, ``!=``), set (``in``, ``notin``) and existence (``k``, ``!k``) terms."""
    for term in _terms(selector):
        if m := re.fullmatch(r"([^\s!=]+)\s*(==|=|!=)\s*(\S*)", term):
            key, op, value = m.groups()
            if (labels.get(key) == value) != (op != "!="):
                return False
        elif m := re.fullmatch(r"([^\s!=]+)\s+(in|notin)\s*\((.*)\)", term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (labels.get(key) in values) != (op == "in"):
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def fields_match(obj: dict[str, Any], selector: str) -> bool:
    """``metadata.name=x``, ``status.phase!=y``... on any dotted path (values compared as strings)."""
    for term in _terms(selector):
        m = re.fullmatch(r"([^\s!=]+)\s*(==|=|!=)\s*(.*)", term)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
        path, op, value = m.groups()
        found: Any = obj
        for part in path.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        if (("" if found is None else str(found)) == value) != (op != "!="):
            return False
    return True


def _now(later: float = 0) -> str:
    """Now (plus ``later`` seconds), as the API writes times: RFC 3339, whole seconds, UTC."""
    when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=later)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the emulator -------------------------------------------------------------------------------

@attrs.define(kw_only=True)
class FaithfulEmulator(KubernetesEmulator):
    """kmock's emulator with apiserver semantics for object endpoints (see the module docstring)."""

    _rv: int = attrs.field(default=0, init=False)
    _log: list[tuple[int, resource, str, dict[str, Any], dict[str, Any] | None]] = attrs.field(factory=list, init=False)
    _tick: asyncio.Event | None = attrs.field(default=None, init=False)  # replaced on every event
    _storage: dict[tuple[str, str], str] = attrs.field(factory=dict, init=False)  # (group, plural) -> version
    _printers: dict[resource, list[dict[str, Any]]] = attrs.field(factory=dict, init=False)  # additionalPrinterColumns
    closing: bool = attrs.field(default=False, init=False)
    internal_errors: list[str] = attrs.field(factory=list, init=False)
    # API faults a test plays on every client but the harness (HARNESS_AGENT): each callable gets
    # (method, path with its query string; and the request's JSON body when the callable's ``with_body`` is
    # true: a create's name is only there) and returns None, an ApiError to answer instead of serving the request (with
    # ``retry_after``: a Retry-After header), Slow(seconds) to serve it late, or CutWatch(after) to end
    # a watch stream early
    faults: list = attrs.field(factory=list, init=False)
    # admission webhooks a test plays: each callable gets (resource, namespace, body) of a create before
    # it is stored; it may change the body (mutating) or raise an ApiError (validating)
    webhooks: list = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        with warnings.catch_warnings():  # kmock 0.8 uses the deprecated importlib.resources.read_binary
            warnings.simplefilter("ignore", DeprecationWarning)
            self.resources.load_bundled()  # the built-in resources of a recent K3s
        # kubectl's probe for server-side field validation (else it wants /openapi/v2 schemas): every
        # group-version's PATCH operations declare ``fieldValidation``. No schemas are served.
        self.fallback["get /openapi/v3"] << self._serve_openapi_root
        self.fallback["get", re.compile(r"/openapi/v3/.+")] << self._serve_openapi_gv
        for ns in ("default", "kube-system"):
            self._write(resource("", "v1", "namespaces"), None, {"metadata": {"name": ns}})

    # -- discovery --------------------------------------------------------------------------------
    def load_crd(self, crd: dict[str, Any], *, store: bool = True) -> None:
        """Serve an ``apiextensions.k8s.io/v1`` CRD's versions (and store the CRD object itself)."""
        if store and self._current((CRDS, None, crd["metadata"]["name"])) is None:
            self._write(CRDS, None, copy.deepcopy(crd))  # which calls back here with store=False
            return
        spec, names = crd["spec"], crd["spec"]["names"]
        versions = [v for v in spec["versions"] if v.get("served", True)]
        self._storage[spec["group"], names["plural"]] = next(
            (v["name"] for v in versions if v.get("storage")), versions[0]["name"])
        for v in versions:
            self._printers[resource(spec["group"], v["name"], names["plural"])] = v.get("additionalPrinterColumns", [])
            self.resources[resource(spec["group"], v["name"], names["plural"])] = ResourceInfo(
                kind=names["kind"], singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced", verbs=CRD_VERBS,
                shortnames=names.get("shortNames", []), categories=names.get("categories", []),
                subresources={s for s in (v.get("subresources") or {}) if s in ("status", "scale")})

    async def _serve_version(self, request: rendering.Request) -> Any:
        doc = await super()._serve_version(request)  # kmock 0.8 says "/v1" and copies shortNames to subresources
        doc["groupVersion"] = doc["groupVersion"].lstrip("/")
        for entry in doc["resources"]:
            if "/" in entry["name"]:
                entry.update(shortNames=[], categories=[], singularName="", verbs=["get", "patch", "update"])
        return doc

    async def _serve_openapi_root(self) -> Any:
        gvs = {_gv_path(r) for r in self.resources}
        return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}"} for gv in gvs}}

    async def _serve_openapi_gv(self, request: rendering.Request) -> Any:
        gv, param = request.url.path.removeprefix("/openapi/v3/"), {"name": "fieldValidation", "in": "query"}
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1"}, "paths": {
            f"/{gv}/{'namespaces/{namespace}/' if info.namespaced else ''}{res.plural}/{{name}}": {"patch": {
                "x-kubernetes-group-version-kind": {"group": res.group, "version": res.version, "kind": info.kind},
                "parameters": [param], "responses": {}}}
            for res in self.resources if _gv_path(res) == gv for info in [self.resources[res]]}}

    def _info(self, t: Target) -> tuple[resource, ResourceInfo]:
        res = resource(t.group, t.version, t.plural)
        if res not in self.resources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return res, self.resources[res]

    def _key(self, res: resource, namespace: str | None, name: str) -> tuple[resource, str | None, str]:
        """All served versions of a CRD share one storage (keyed by the storage version)."""
        version = self._storage.get((res.group, res.plural), res.version)
        return resource(res.group, version, res.plural), namespace, name

    # -- storage & events (synchronous: atomic within the event loop) ------------------------------
    def _current(self, key: tuple[resource, str | None, str]) -> dict[str, Any] | None:
        obj = self.objects._objects.get(key)  # noqa: SLF001 (kmock ObjectsArray internals)
        return None if obj is None or obj.deleted else copy.deepcopy(obj.raw)

    def _emit(self, key_res: resource, kind: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
        self._log.append((self._rv, key_res, kind, copy.deepcopy(obj), old))
        if self._tick is not None:
            self._tick.set()
        self._tick = None

    def _write(self, res: resource, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """Create: fill in the system metadata, store, emit ADDED."""
        info = self.resources[res]
        meta = body.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", "name or generateName is required")
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        key = self._key(res, namespace if info.namespaced else None, meta["name"])
        if self._current(key) is not None:
            raise ApiError(409, "AlreadyExists", f'{_gr(res)} "{meta["name"]}" already exists',
                           name=meta["name"], group=res.group, kind=res.plural)
        if info.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
            nskey = (resource("", "v1", "namespaces"), None, meta["namespace"])
            if self._current(nskey) is None:  # lenient: namespaces spring into existence on use
                self._write(nskey[0], None, {"metadata": {"name": meta["namespace"]}})
        else:
            meta.pop("namespace", None)
        if "status" in info.subresources:
            body.pop("status", None)  # the main endpoint never writes status
            if res == resource("", "v1", "namespaces"):
                body["status"] = {"phase": "Active"}
            elif res == CRDS:  # established at once (`kubectl wait --for=condition=Established` works)
                body["status"] = {
                    "acceptedNames": body["spec"]["names"],
                    "storedVersions": [v["name"] for v in body["spec"]["versions"] if v.get("storage")],
                    "conditions": [{"type": t, "status": "True", "lastTransitionTime": _now()}
                                   for t in ("NamesAccepted", "Established")]}
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        self._rv += 1
        body["apiVersion"], body["kind"] = f"{res.group}/{res.version}".lstrip("/"), info.kind
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1, resourceVersion=str(self._rv))
        _normalize(meta)
        if key in self.objects:
            self.objects[key].create(copy.deepcopy(body))  # a new life after a soft-deletion: kmock keeps history
        else:
            self.objects[key] = copy.deepcopy(body)
        self._emit(key[0], "ADDED", body)
        if res == CRDS:
            self.load_crd(body, store=False)
        return body

    def _update(self, res: resource, key: tuple, old: dict[str, Any], new: dict[str, Any],
                sub: str | None) -> dict[str, Any]:
        """Update (PUT/PATCH): status separation, preconditions, generation, finalizers, events."""
        info = self.resources[res]
        has_status = "status" in info.subresources
        stale = (new.get("metadata") or {}).get("resourceVersion")
        if stale and stale != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {_gr(res)} "{key[2]}": the object '
                           "has been modified; please apply your changes to the latest version and try again",
                           name=key[2], group=res.group, kind=res.plural)
        if sub == "status":  # only status changes through /status
            result = copy.deepcopy(old)
            result.pop("status", None)
            if "status" in new:
                result["status"] = new["status"]
        else:
            result = new
            if has_status:
                result.pop("status", None)
                if "status" in old:
                    result["status"] = old["status"]
            meta, old_meta = result.setdefault("metadata", {}), old["metadata"]
            for field in ("name", "namespace", "uid", "creationTimestamp", "generation",
                          "deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(field, None)
                if field in old_meta:
                    meta[field] = old_meta[field]
            added = set(meta.get("finalizers", [])) - set(old_meta.get("finalizers", []))
            if old_meta.get("deletionTimestamp") and added:
                raise ApiError(422, "Invalid", "Forbidden: no new finalizers can be added if the object is being deleted")
            _normalize(meta)
        result["apiVersion"], result["kind"] = old["apiVersion"], old["kind"]
        result["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if result == old:
            return old  # no-op: no new resourceVersion, no event (kopf relies on this)
        skip = {"metadata", "apiVersion", "kind"} | ({"status"} if has_status else set())
        if {k: v for k, v in result.items() if k not in skip} != {k: v for k, v in old.items() if k not in skip}:
            result["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        self._rv += 1
        result["metadata"]["resourceVersion"] = str(self._rv)
        self.objects[key].create(copy.deepcopy(result))
        self._emit(key[0], "MODIFIED", result, old)
        if result["metadata"].get("deletionTimestamp") and not result["metadata"].get("finalizers") \
                and not result["metadata"].get("deletionGracePeriodSeconds"):  # a pod in its grace stays
            self._remove(key, result)
        if res == CRDS:
            self.load_crd(result, store=False)
        return result

    def _remove(self, key: tuple, obj: dict[str, Any]) -> dict[str, Any]:
        self._rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self.objects[key].delete()
        self._emit(key[0], "DELETED", obj)
        return obj

    def _delete(self, res: resource, key: tuple, obj: dict[str, Any], options: dict[str, Any],
                query: Any = None) -> dict[str, Any]:
        """DELETE: preconditions, then graceful deletion for pods (``_grace``), finalizers, removal.

        An object that ends up with a ``deletionTimestamp`` stays (a MODIFIED event) until its grace ends
        (a DELETE with a shorter grace, down to 0: what a kubelet sends once the containers stopped) and
        its finalizers are gone; the apiserver's own rule (``rest.BeforeDelete``): the
        ``deletionTimestamp`` of a graceful deletion is the time the grace ends (now + grace), a second
        DELETE may only shorten the grace, never lengthen it."""
        options = options if isinstance(options, dict) else {}
        pre = options.get("preconditions") or {}
        for field in ("uid", "resourceVersion"):
            if pre.get(field) and pre[field] != obj["metadata"].get(field):
                raise ApiError(409, "Conflict", f"Precondition failed: {field} mismatch", name=key[2], kind=res.plural)
        meta = obj["metadata"]
        grace = self._grace(res, obj, options, query or {})
        if meta.get("deletionTimestamp"):
            current = meta.get("deletionGracePeriodSeconds")
            if current is None or grace >= current:
                return obj  # already being deleted, and no shorter grace asked for
            new = copy.deepcopy(obj)
            new["metadata"].update(deletionTimestamp=_now(grace), deletionGracePeriodSeconds=grace)
        elif grace > 0 or meta.get("finalizers"):
            new = copy.deepcopy(obj)
            new["metadata"].update(deletionTimestamp=_now(grace), deletionGracePeriodSeconds=grace)
            new["metadata"]["generation"] = meta.get("generation", 1) + 1
        else:
            return self._remove(key, obj)
        if grace == 0 and not new["metadata"].get("finalizers"):
            return self._remove(key, obj)
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        self.objects[key].create(new)
        self._emit(key[0], "MODIFIED", new, obj)
        return new

    @staticmethod
    def _grace(res: resource, obj: dict[str, Any], options: dict[str, Any], query: Any) -> int:
        """The grace period of a DELETE, in seconds. Pods only (the pod strategy's ``CheckGracefulDelete``,
        https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination): the request's
        ``gracePeriodSeconds`` (query or DeleteOptions body; 0 is a force deletion), else the pod's
        ``spec.terminationGracePeriodSeconds``, else 30; 0 for a pod no node runs (unbound) or one that
        has finished (phase Succeeded or Failed), which no kubelet needs to stop. Every other kind: 0."""
        if (res.group, res.plural) != ("", "pods"):
            return 0
        asked = query.get("gracePeriodSeconds") if query.get("gracePeriodSeconds") not in (None, "") else \
            options.get("gracePeriodSeconds")
        if asked is None:
            asked = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        try:
            grace = max(0, int(float(asked)))
        except (TypeError, ValueError):
            raise ApiError(400, "BadRequest", f"invalid gracePeriodSeconds {asked!r}") from None
        if not (obj.get("spec") or {}).get("nodeName") or \
                (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return 0
        return grace

    # -- HTTP --------------------------------------------------------------------------------------
    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        t = parse_path(raw.path)
        if t is None:  # discovery, /version and the like: kmock's scaffold serves them
            return await self._discovery(raw)
        body = await raw.read()
        if body and "protobuf" in raw.content_type:  # e.g. `kubectl create configmap NAME` (typed clients)
            return ApiError(415, "UnsupportedMediaType", "the emulator speaks JSON only; "
                            "use `kubectl apply/create -f MANIFEST` instead of generator commands").response()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        request = rendering.Request(
            id=len(self._requests), raw_request=raw, url=raw.url, method=raw.method, params=dict(raw.query),
            headers=dict(raw.headers), body=body, text=body.decode("utf-8", "replace"), data=data,
            resource=resource(t.group, t.version, t.plural), namespace=t.namespace, name=t.name,
            subresource=t.subresource)
        self._requests.append(request)
        cut = None
        for fault in list(self.faults) if raw.headers.get("User-Agent") != HARNESS_AGENT else []:
            outcome = fault(raw.method, raw.path_qs, data) if getattr(fault, "with_body", False) \
                else fault(raw.method, raw.path_qs)
            if isinstance(outcome, ApiError):
                return outcome.response()
            if isinstance(outcome, Slow):
                await asyncio.sleep(outcome.seconds)
            elif isinstance(outcome, CutWatch):
                cut = outcome
        try:
            return await self._serve(raw, t, data, cut)
        except ApiError as e:
            return e.response()
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as e:  # an emulator bug: answer 500 and remember it for the harness
            self.internal_errors.append(traceback.format_exc())
            return ApiError(500, "InternalError", repr(e)).response()

    async def _discovery(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Discovery GETs go straight to kmock's scaffold handlers (recorded like every request).
        kmock's own dispatch finds the handler by testing each reaction's filter against every
        request ever served (``request in payload._source``), so one discovery answer cost time in
        proportion to the emulator's history: 0.6 s at 100,000 requests, 3 s for ``/apis``, the event
        loop blocked all the while (what stalled a long chaos bench's operator restarts)."""
        serve = next((getattr(self, attr) for pattern, attr in DISCOVERY if pattern.fullmatch(raw.path)), None) \
            if raw.method == "GET" else None
        if serve is None:  # /openapi/... (kubectl) and anything unusual: kmock's general path
            return await super().__call__(raw)
        request = await rendering.Request._parse(raw, id=len(self._requests))  # noqa: SLF001 (kmock 0.8)
        self._requests.append(request)
        try:
            return aiohttp.web.json_response(await serve(request))
        except KubernetesError as exc:
            return await self._render_error(exc)

    async def _serve(self, raw: aiohttp.web.BaseRequest, t: Target, data: Any,
                     cut: CutWatch | None = None) -> aiohttp.web.StreamResponse:
        res, info = self._info(t)
        ns = t.namespace if info.namespaced else None
        params, method = raw.query, raw.method
        if t.subresource is not None and (t.subresource not in info.subresources or t.subresource != "status"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method == "GET" and params.get("watch") in ("true", "1"):
            return await self._watch(raw, res, ns, t.name, cut)
        if t.name is None:
            if method == "GET":
                items = self._select(res, ns, params.get("labelSelector", ""), params.get("fieldSelector", ""))
                return self._respond(raw, res, info, {"metadata": {"resourceVersion": str(self._rv)}, "items": items})
            if method == "POST":
                if not isinstance(data, dict):
                    raise ApiError(400, "BadRequest", "the request body must be a JSON object")
                for webhook in list(self.webhooks):
                    webhook(res, ns, data)
                return self._respond(raw, res, info, self._write(res, ns, data), status=201)
            if method == "DELETE":  # deletecollection
                for obj in self._select(res, ns, params.get("labelSelector", ""), params.get("fieldSelector", "")):
                    key = self._key(res, obj["metadata"].get("namespace"), obj["metadata"]["name"])
                    self._delete(res, key, self._current(key), data, params)
                return self._respond(raw, res, info, {"metadata": {"resourceVersion": str(self._rv)}, "items": []})
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on collections")
        key = self._key(res, ns, t.name)
        old = self._current(key)
        if old is None:
            raise ApiError(404, "NotFound", f'{_gr(res)} "{t.name}" not found',
                           name=t.name, group=res.group, kind=res.plural)
        if method == "GET":
            return self._respond(raw, res, info, old)
        if method == "DELETE" and t.subresource is None:
            return self._respond(raw, res, info, self._delete(res, key, old, data, params))
        if method == "PUT":
            if not isinstance(data, dict):
                raise ApiError(400, "BadRequest", "the request body must be a JSON object")
            return self._respond(raw, res, info, self._update(res, key, old, data, t.subresource))
        if method == "PATCH":
            ctype = raw.content_type
            if ctype == "application/json-patch+json":
                new = json_patch(old, data)
            elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                new = merge_patch(old, strip_smp_directives(data))
            else:
                raise ApiError(415, "UnsupportedMediaType", f"unsupported patch format: {ctype}")
            return self._respond(raw, res, info, self._update(res, key, old, new, t.subresource))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _select(self, res: resource, ns: str | None, labels: str, fields: str) -> list[dict[str, Any]]:
        key_res = self._key(res, None, "")[0]
        found = [o.raw for (r, _, _), o in self.objects.items() if r == key_res and not o.deleted]
        return [copy.deepcopy(raw) for raw in found if _matches(raw, ns, None, labels, fields)]  # copy what is sent

    def _respond(self, raw: aiohttp.web.BaseRequest, res: resource, info: ResourceInfo, obj: dict[str, Any],
                 status: int = 200) -> aiohttp.web.Response:
        api_version = f"{res.group}/{res.version}".lstrip("/")
        items = obj.get("items", [])
        for item in [obj, *items]:  # served versions share storage: show the requested one
            if "apiVersion" in item:
                item["apiVersion"] = api_version
        if "items" in obj:
            obj = {"apiVersion": api_version, "kind": f"{info.kind}List", **obj}
        else:
            items = [obj]
        if raw.method == "GET" and "as=Table" in raw.headers.get("Accept", ""):  # kubectl get's tables
            # a CRD's additionalPrinterColumns (simple .a.b paths), else the apiserver's default columns
            columns = self._printers.get(res) or [{"name": "Created At", "type": "date",
                                                   "jsonPath": ".metadata.creationTimestamp"}]
            obj = {"apiVersion": "meta.k8s.io/v1", "kind": "Table", "metadata": {"resourceVersion": str(self._rv)},
                   "columnDefinitions": [{"name": "Name", "type": "string", "format": "name"}] + [
                       {"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", "")}
                       for c in columns],
                   "rows": [{"cells": [i["metadata"]["name"]] + [_json_path(i, c["jsonPath"]) for c in columns],
                             "object": i} for i in items]}
        return aiohttp.web.json_response(obj, status=status)

    async def _watch(self, raw: aiohttp.web.BaseRequest, res: resource, ns: str | None,
                     name: str | None, cut: CutWatch | None = None) -> aiohttp.web.StreamResponse:
        q = raw.query
        labels, fields, since = q.get("labelSelector", ""), q.get("fieldSelector", ""), q.get("resourceVersion", "")
        deadline = time.monotonic() + float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        if cut is not None:
            deadline = min(deadline or math.inf, time.monotonic() + cut.after)
        key_res, api_version = self._key(res, None, "")[0], f"{res.group}/{res.version}".lstrip("/")
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            obj = copy.deepcopy(obj)
            obj["apiVersion"] = api_version if kind != "BOOKMARK" else obj.get("apiVersion")
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        pos = next((i for i, entry in enumerate(self._log) if entry[0] > int(since)), len(self._log)) \
            if since.isdigit() and since != "0" else len(self._log)
        replay = q.get("sendInitialEvents") == "true" or since in ("", "0")
        initial = self._select(res, ns, labels, fields) if replay else []
        try:
            for obj in initial:  # "get state and start at most recent": synthetic ADDED events
                if name is None or obj["metadata"]["name"] == name:
                    await send("ADDED", obj)
            if q.get("sendInitialEvents") == "true":
                await send("BOOKMARK", {"kind": res.plural, "metadata": {"resourceVersion": str(self._rv),
                                        "annotations": {"k8s.io/initial-events-end": "true"}}})
            while not self.closing:
                while pos < len(self._log):
                    rv, r, kind, obj, old = self._log[pos]
                    pos += 1
                    if r != key_res:
                        continue
                    now_in = _matches(obj, ns, name, labels, fields)
                    was_in = old is not None and _matches(old, ns, name, labels, fields)
                    if kind == "MODIFIED" and now_in != was_in:  # moved in/out of a selector's scope
                        kind = "ADDED" if now_in else "DELETED"
                    if now_in or was_in:
                        await send(kind, obj)
                if self._tick is None:
                    self._tick = asyncio.Event()
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                if timeout == 0.0:
                    break
                try:
                    await asyncio.wait_for(self._tick.wait(), timeout)
                except TimeoutError:
                    break
            if cut is not None and cut.abrupt and not self.closing and raw.transport is not None:
                raw.transport.abort()  # no last chunk: the client sees the connection drop mid-stream
                return response
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away
        return response

    def wake_watchers(self) -> None:
        self.closing = True
        if self._tick is not None:
            self._tick.set()


def _json_path(obj: Any, path: str) -> Any:
    """A printer column's value for a dotted path like ``.status.phase`` (None when absent)."""
    for part in path.strip(".").split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _gv_path(res: resource) -> str:
    return f"apis/{res.group}/{res.version}" if res.group else f"api/{res.version}"


def _gr(res: resource) -> str:
    return f"{res.plural}.{res.group}" if res.group else res.plural


def _normalize(meta: dict[str, Any]) -> None:
    for field in ("finalizers", "labels", "annotations", "ownerReferences"):  # apiserver omits empties
        if field in meta and not meta[field]:
            del meta[field]


def _matches(obj: dict[str, Any], ns: str | None, name: str | None, labels: str, fields: str) -> bool:
    meta = obj.get("metadata", {})
    return ((ns is None or meta.get("namespace") == ns) and (name is None or meta.get("name") == name)
            and labels_match(meta.get("labels") or {}, labels) and fields_match(obj, fields))


# --- the harness --------------------------------------------------------------------------------

class KubeHTTPError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.output}\nstderr: {self.stderr}"


class Cluster:
    """A running emulator: ``url``, ``kubeconfig``, ``kubectl(...)``, sync JSON helpers, ``objects(...)``."""

    def __init__(self, emulator: FaithfulEmulator, url: str, kubeconfig: Path, loop: asyncio.AbstractEventLoop) -> None:
        self.emulator, self.url, self.kubeconfig, self._loop = emulator, url, kubeconfig, loop

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cache = self.kubeconfig.parent / "kube-cache"  # per cluster: no stale discovery from a reused port
        cmd = [KUBECTL, "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(cache), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                params: dict[str, str] | None = None) -> Any:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": content_type, "User-Agent": HARNESS_AGENT})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = raw.decode("utf-8", "replace")
            raise KubeHTTPError(e.code, payload) from None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def list(self, path: str, **params: str) -> Any:
        return self.request("GET", path, params=params or None)

    def create(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, body)

    def replace(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("PUT", path, body)

    def patch(self, path: str, body: Any, *, content_type: str = "application/merge-patch+json") -> Any:
        return self.request("PATCH", path, body, content_type=content_type)

    def delete(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("DELETE", path, body)

    def watch(self, path: str, *, timeout: float = 1, **params: str) -> list[dict[str, Any]]:
        """The events of one watch request, which the server ends after ``timeout`` seconds."""
        query = urllib.parse.urlencode({"watch": "true", "timeoutSeconds": str(timeout), **params})
        req = urllib.request.Request(f"{self.url}{path}?{query}", headers={"User-Agent": HARNESS_AGENT})
        with urllib.request.urlopen(req, timeout=timeout + 30) as resp:
            return [json.loads(line) for line in resp if line.strip()]

    def objects(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Current stored objects of a resource (``'widgets'`` or ``'widgets.example.test'``)."""
        name, _, group = plural.partition(".")

        async def snapshot() -> list[dict[str, Any]]:
            return [copy.deepcopy(o.raw) for (r, ns, _), o in self.emulator.objects.items()
                    if r.plural == name and (not group or r.group == group) and not o.deleted
                    and (namespace is None or ns == namespace)]
        return asyncio.run_coroutine_threadsafe(snapshot(), self._loop).result(10)


def _load_yaml_docs(paths: list[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        yield from (d for d in file_docs(path) if d.get("kind") == "CustomResourceDefinition")


@contextmanager
def emulated_cluster(crd_paths: list[Path], tmp_path: Path) -> Iterator[Cluster]:
    """Serve a FaithfulEmulator on 127.0.0.1:<free port> from a background thread and event loop."""
    emulator = FaithfulEmulator()
    for crd in _load_yaml_docs(crd_paths):
        emulator.load_crd(crd)  # discovery must be complete before anyone connects
    loop = asyncio.new_event_loop()
    started, stop = threading.Event(), asyncio.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        try:
            async with emulator:
                server = aiohttp.test_utils.RawTestServer(emulator, host="127.0.0.1", port=0)
                await server.start_server()
                box["url"] = f"http://127.0.0.1:{server.port}"
                started.set()
                try:
                    await stop.wait()
                finally:
                    emulator.wake_watchers()
                    await server.close()
        except BaseException as e:
            box["error"] = e
            started.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), name="kube-emulator", daemon=True)
    thread.start()
    started.wait(30)
    if "url" not in box:
        raise RuntimeError(f"the emulator did not start: {box.get('error')!r}")
    kubeconfig = Path(tmp_path) / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": box["url"]}}],
        "users": [{"name": "emulator", "user": {}}],
        "contexts": [{"name": "emulator",
                      "context": {"cluster": "emulator", "user": "emulator", "namespace": "default"}}]}))
    try:
        yield Cluster(emulator, box["url"], kubeconfig, loop)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        if not thread.is_alive():
            loop.close()
    if emulator.internal_errors:
        raise AssertionError("the emulator failed internally:\n" + "\n".join(emulator.internal_errors))


class Operator(NamedTuple):
    registry: Any
    thread: threading.Thread
    stop_flag: threading.Event
    ready_flag: threading.Event


_SOURCES: dict[str, Any] = {}  # module name or path -> the registry its handlers were declared into


def _source_registry(what: ModuleType | str | Path) -> Any:
    """Declare a module's handlers once into a private registry (cached; copied into every run's registry).

    A dotted name not imported yet is imported normally (its submodules register there too). A ``.py``
    path, or a module already imported elsewhere, is executed afresh, within its package when it has one.
    """
    import kopf
    key = what.__name__ if isinstance(what, ModuleType) else str(what)
    if key not in _SOURCES:
        registry, previous = kopf.OperatorRegistry(), kopf.get_default_registry()
        kopf.set_default_registry(registry)
        try:
            if isinstance(what, str) and not what.endswith(".py") and what not in sys.modules:
                importlib.import_module(what)
            else:
                if isinstance(what, ModuleType) or not str(what).endswith(".py"):
                    spec = what.__spec__ if isinstance(what, ModuleType) else importlib.util.find_spec(what)
                    path, package = spec.origin, spec.parent
                else:
                    path, package = str(what), ""
                name = f"{package}._kopf_run_{uuid.uuid4().hex}".lstrip(".")
                spec = importlib.util.spec_from_file_location(name, path)
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
        finally:
            kopf.set_default_registry(previous)
        _SOURCES[key] = registry
    return _SOURCES[key]


def _copy_handlers(source: Any, target: Any) -> None:
    for part in ("_activities", "_indexing", "_watching", "_spawning", "_changing", "_webhooks"):  # kopf 1.45
        for handler in getattr(source, part).get_all_handlers():
            getattr(target, part).append(handler)


@contextmanager
def run_kopf_operator(module_or_path: Any, cluster: Cluster, *, stop_after: float | None = None,
                      ready_timeout: float = 15, stop_timeout: float = 15, memo: Any = None) -> Iterator[Operator]:
    """Run ``kopf.operator(standalone=True, clusterwide=True)`` in its own thread and loop against ``cluster``.

    ``module_or_path``: a callable taking the registry (handlers declared with ``registry=...``), a module,
    a dotted module name or a ``.py`` path (see ``_source_registry``). Every run gets a fresh registry and
    a fresh event loop, so an operator can be restarted within one test. ``stop_after``: stop by itself.
    ``memo``: the operator-level ``kopf.Memo`` handlers receive (shallow-copied per object).
    """
    import kopf
    registry = kopf.OperatorRegistry()  # not the "smart" one: no fallback logins via ~/.kube/config

    @kopf.on.login(registry=registry)
    def _login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=cluster.url, insecure=True, default_namespace="default")

    @kopf.on.startup(registry=registry)
    def _tune(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.process.ultimate_exiting_timeout = None  # never SIGKILL the pytest process
        settings.networking.request_timeout = 30
        settings.queueing.exit_timeout = 1.0
        settings.watching.server_timeout = 60

    # The operator's own startup handlers run after ours and can override these settings.
    if callable(module_or_path) and not isinstance(module_or_path, ModuleType):
        module_or_path(registry)
    else:
        _copy_handlers(_source_registry(module_or_path), registry)
    stop_flag, ready_flag, failure = threading.Event(), threading.Event(), []

    def main() -> None:
        try:
            asyncio.run(kopf.operator(registry=registry, standalone=True, clusterwide=True,
                                      stop_flag=stop_flag, ready_flag=ready_flag, memo=memo))
        except BaseException as e:  # noqa: BLE001 (reported by the harness)
            failure.append(e)
            ready_flag.set()

    thread = threading.Thread(target=main, name="kopf-operator", daemon=True)
    timer = threading.Timer(stop_after, stop_flag.set) if stop_after is not None else None
    thread.start()
    timer.start() if timer else None
    try:
        if not ready_flag.wait(ready_timeout) or failure:
            raise RuntimeError(f"kopf did not start: {failure[0] if failure else 'timeout'!r}")
        yield Operator(registry, thread, stop_flag, ready_flag)
    finally:
        timer.cancel() if timer else None
        stop_flag.set()
        thread.join(stop_timeout)
    if thread.is_alive() or failure:
        raise RuntimeError("kopf did not stop in time" if not failure else f"kopf failed: {failure[0]!r}")


def wait_for(predicate: Callable[[], Any], timeout: float = 10, interval: float = 0.05, message: str = "") -> Any:
    """Poll until ``predicate()`` is truthy (returns it) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")
        time.sleep(interval)


__all__ = ["HARNESS_AGENT", "ApiError", "Cluster", "CutWatch", "FaithfulEmulator", "KubeHTTPError", "KubectlError",
           "Slow", "emulated_cluster", "json_patch", "labels_match", "merge_patch", "parse_path", "run_kopf_operator",
           "wait_for"]
