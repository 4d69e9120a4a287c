"""Fidelity of the test-side Kubernetes API emulator (tests/support/kube.py) for kubectl and kopf."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from tests.support.kube import (
    ApiError,
    Cluster,
    CutWatch,
    KubeHTTPError,
    Slow,
    emulated_cluster,
    run_kopf_operator,
    wait_for,
)

pytestmark = pytest.mark.timeout(60)

WIDGET_CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.test
spec:
  group: example.test
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""
WIDGETS = "/apis/example.test/v1/namespaces/default/widgets"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
def cluster(tmp_path: Path):
    crd = tmp_path / "widget-crd.yaml"
    crd.write_text(WIDGET_CRD)
    with emulated_cluster([crd], tmp_path) as running:
        yield running


def widget(name: str, **spec) -> dict:
    return {"apiVersion": "example.test/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def http_error(fn, *args, **kwargs) -> KubeHTTPError:
    with pytest.raises(KubeHTTPError) as info:
        fn(*args, **kwargs)
    return info.value


def test_system_metadata_and_generation(cluster: Cluster):
    created = cluster.create(WIDGETS, widget("w1", size=1))
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    rv = int(meta["resourceVersion"])

    spec = cluster.patch(f"{WIDGETS}/w1", {"spec": {"size": 2}})
    assert spec["metadata"]["generation"] == 2 and int(spec["metadata"]["resourceVersion"]) > rv
    labels = cluster.patch(f"{WIDGETS}/w1", {"metadata": {"labels": {"a": "b"}}})
    status = cluster.patch(f"{WIDGETS}/w1/status", {"status": {"phase": "Running"}})
    assert labels["metadata"]["generation"] == status["metadata"]["generation"] == 2
    assert int(status["metadata"]["resourceVersion"]) > int(labels["metadata"]["resourceVersion"])
    assert status["metadata"]["uid"] == meta["uid"]

    # A no-op patch keeps the resourceVersion (and emits no event), as the apiserver does.
    again = cluster.patch(f"{WIDGETS}/w1", {"spec": {"size": 2}})
    assert again["metadata"]["resourceVersion"] == status["metadata"]["resourceVersion"]


def test_status_subresource_separation(cluster: Cluster):
    body = widget("w1", size=1)
    body["status"] = {"phase": "Ignored"}
    assert "status" not in cluster.create(WIDGETS, body)  # POST to the main endpoint drops status

    cluster.patch(f"{WIDGETS}/w1/status", {"status": {"phase": "Running"}, "spec": {"size": 99}})
    assert cluster.get(f"{WIDGETS}/w1")["spec"] == {"size": 1}  # /status changes status only

    main = cluster.patch(f"{WIDGETS}/w1", {"status": {"phase": "Hacked"}, "spec": {"size": 3}})
    assert main["status"] == {"phase": "Running"} and main["spec"] == {"size": 3}

    # Without a status subresource (ConfigMap), status is a plain field and /status does not exist.
    cluster.create(CONFIGMAPS, {"metadata": {"name": "c1"}, "data": {"k": "v"}})
    assert http_error(cluster.patch, f"{CONFIGMAPS}/c1/status", {"status": {}}).status == 404


def test_stale_resource_version_conflicts(cluster: Cluster):
    old = cluster.create(WIDGETS, widget("w1", size=1))
    fresh = cluster.patch(f"{WIDGETS}/w1", {"spec": {"size": 2}})
    stale_rv = old["metadata"]["resourceVersion"]

    # JSON patch with a failing `test` op: 422, exactly as kube-apiserver answers and kopf 1.45 expects
    # (kopf treats 422 as "newer changes pending, retry next cycle"; a 409 here would be an error to it).
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": stale_rv},
           {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]}]
    err = http_error(cluster.patch, f"{WIDGETS}/w1", ops, content_type="application/json-patch+json")
    assert err.status == 422 and err.body["kind"] == "Status" and err.body["reason"] == "Invalid"
    ops[0]["value"] = fresh["metadata"]["resourceVersion"]
    patched = cluster.patch(f"{WIDGETS}/w1", ops, content_type="application/json-patch+json")
    assert patched["metadata"]["finalizers"] == ["x/y"]

    # Optimistic concurrency with 409 Conflict: a stale resourceVersion in a merge patch or a PUT.
    err = http_error(cluster.patch, f"{WIDGETS}/w1", {"metadata": {"resourceVersion": stale_rv}, "spec": {"size": 5}})
    assert (err.status, err.body["reason"]) == (409, "Conflict")
    err = http_error(cluster.replace, f"{WIDGETS}/w1", old)
    assert (err.status, err.body["reason"], err.body["code"]) == (409, "Conflict", 409)

    # PUT with the current resourceVersion replaces (spec bumps generation; status is kept).
    cluster.patch(f"{WIDGETS}/w1/status", {"status": {"phase": "Running"}})
    current = cluster.get(f"{WIDGETS}/w1")
    current["spec"] = {"colour": "red"}
    current["status"] = {"phase": "Ignored"}
    replaced = cluster.replace(f"{WIDGETS}/w1", current)
    assert replaced["spec"] == {"colour": "red"} and replaced["status"] == {"phase": "Running"}
    assert replaced["metadata"]["generation"] == current["metadata"]["generation"] + 1


def test_already_exists_and_not_found(cluster: Cluster):
    cluster.create(WIDGETS, widget("w1"))
    err = http_error(cluster.create, WIDGETS, widget("w1"))
    assert err.status == 409 and err.body == {**err.body, "kind": "Status", "reason": "AlreadyExists", "code": 409}
    err = http_error(cluster.get, f"{WIDGETS}/missing")
    assert err.status == 404 and err.body["reason"] == "NotFound" and err.body["details"]["name"] == "missing"
    # generateName gives unique names.
    names = {cluster.create(CONFIGMAPS, {"metadata": {"generateName": "gen-"}})["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3 and all(n.startswith("gen-") for n in names)


def test_label_and_field_selectors(cluster: Cluster):
    for name, labels in [("a", {"app": "x", "tier": "web"}), ("b", {"app": "x"}), ("c", {"app": "y"})]:
        cluster.create(CONFIGMAPS, {"metadata": {"name": name, "labels": labels}})

    def names(**params) -> list[str]:
        return sorted(i["metadata"]["name"] for i in cluster.list(CONFIGMAPS, **params)["items"])

    assert names() == ["a", "b", "c"]
    assert names(labelSelector="app=x") == ["a", "b"]
    assert names(labelSelector="app=x,tier") == ["a"]
    assert names(labelSelector="app!=x") == ["c"]
    assert names(labelSelector="app in (y, z)") == ["c"]
    assert names(labelSelector="app notin (y),!tier") == ["b"]
    assert names(fieldSelector="metadata.name=b") == ["b"]
    listed = cluster.list(CONFIGMAPS)
    assert listed["kind"] == "ConfigMapList" and listed["metadata"]["resourceVersion"].isdigit()


def test_watch_resumes_from_resource_version(cluster: Cluster):
    cluster.create(CONFIGMAPS, {"metadata": {"name": "old", "labels": {"app": "x"}}})
    since = cluster.list(CONFIGMAPS)["metadata"]["resourceVersion"]
    cluster.create(CONFIGMAPS, {"metadata": {"name": "new", "labels": {"app": "x"}}})
    cluster.patch(f"{CONFIGMAPS}/old", {"data": {"k": "v"}})
    cluster.patch(f"{CONFIGMAPS}/new", {"metadata": {"labels": {"app": "gone"}}})

    events = cluster.watch(CONFIGMAPS, timeout=0.5, resourceVersion=since)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "new"), ("MODIFIED", "old"), ("MODIFIED", "new")]
    assert all(int(e["object"]["metadata"]["resourceVersion"]) > int(since) for e in events)
    # With a selector, leaving its scope is seen as DELETED; without a version, the state is replayed.
    events = cluster.watch(CONFIGMAPS, timeout=0.5, resourceVersion=since, labelSelector="app=x")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "new"), ("MODIFIED", "old"), ("DELETED", "new")]
    events = cluster.watch(CONFIGMAPS, timeout=0.5, labelSelector="app=x")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "old")]


def test_faults_refuse_delay_and_cut_watches_of_other_clients_only(cluster: Cluster):
    """Faults are played on the system under test, never on the harness's own requests; a 429 carries
    its Retry-After, a slow answer comes late, and a cut watch ends early, cleanly or mid-stream."""
    import http.client
    import json
    import time
    import urllib.error
    import urllib.request

    plan = {"GET": ApiError(429, "TooManyRequests", "slow down", retry_after=3), "PUT": Slow(0.6)}
    cluster.emulator.faults.append(lambda method, path: plan.get(method))
    cluster.create(CONFIGMAPS, {"metadata": {"name": "a"}})
    assert cluster.get(f"{CONFIGMAPS}/a")["metadata"]["name"] == "a"  # the harness is exempt

    def other(method: str, path: str, body: dict | None = None, timeout: float = 10):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(cluster.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "User-Agent": "operator/1"})
        return urllib.request.urlopen(req, timeout=timeout)

    with pytest.raises(urllib.error.HTTPError) as refused:
        other("GET", f"{CONFIGMAPS}/a")
    assert refused.value.code == 429 and refused.value.headers["Retry-After"] == "3"
    started = time.monotonic()
    current = cluster.get(f"{CONFIGMAPS}/a")
    with other("PUT", f"{CONFIGMAPS}/a", {**current, "data": {"k": "v"}}) as resp:
        assert resp.status == 200
    assert time.monotonic() - started >= 0.6 and cluster.get(f"{CONFIGMAPS}/a")["data"] == {"k": "v"}

    for abrupt in (False, True):
        plan["GET"] = CutWatch(0.3, abrupt=abrupt)
        started = time.monotonic()
        try:
            with other("GET", f"{CONFIGMAPS}?watch=true&timeoutSeconds=30") as resp:
                body, dropped = resp.read(), False
        except http.client.IncompleteRead as exc:  # the last chunk never came
            body, dropped = exc.partial, True
        assert time.monotonic() - started < 5  # ended long before its own timeout
        assert dropped == abrupt and json.loads(body.splitlines()[0])["object"]["metadata"]["name"] == "a"


def test_finalizers_block_deletion(cluster: Cluster):
    body = widget("w1")
    body["metadata"]["finalizers"] = ["example.test/guard"]
    cluster.create(WIDGETS, body)
    marked = cluster.delete(f"{WIDGETS}/w1")
    assert marked["metadata"]["deletionTimestamp"] and cluster.get(f"{WIDGETS}/w1")["metadata"]["deletionTimestamp"]
    err = http_error(cluster.patch, f"{WIDGETS}/w1", {"metadata": {"finalizers": ["example.test/guard", "new/one"]}})
    assert err.status == 422  # no new finalizers once deleting
    cluster.patch(f"{WIDGETS}/w1", {"metadata": {"finalizers": None}})
    assert http_error(cluster.get, f"{WIDGETS}/w1").status == 404
    assert cluster.watch(WIDGETS, timeout=0.5, resourceVersion="1")[-1]["type"] == "DELETED"
    # Without finalizers, deletion is immediate; a re-created object gets a new uid.
    first = cluster.create(WIDGETS, widget("w2"))
    cluster.delete(f"{WIDGETS}/w2")
    assert cluster.create(WIDGETS, widget("w2"))["metadata"]["uid"] != first["metadata"]["uid"]


PODS = "/api/v1/namespaces/default/pods"


def pod(name: str, node: str | None = None, grace: int | None = None) -> dict:
    spec = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def running_pod(cluster: Cluster, name: str, node: str = "n1", grace: int | None = None) -> dict:
    cluster.create(PODS, pod(name, node, grace))
    return cluster.patch(f"{PODS}/{name}/status", {"status": {"phase": "Running"}})


def test_pod_graceful_deletion(cluster: Cluster):
    """A bound pod that has not finished is kept Terminating (deletionTimestamp = now + grace), until a
    DELETE with gracePeriodSeconds=0; an unbound or finished pod goes at once; a second DELETE only
    shortens the grace. Other kinds are not graceful."""
    import datetime as dt

    def at(text: str) -> float:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()

    cluster.create(PODS, pod("unbound"))
    assert cluster.delete(f"{PODS}/unbound")["metadata"]["name"] == "unbound"
    assert http_error(cluster.get, f"{PODS}/unbound").status == 404

    created = running_pod(cluster, "p")
    rv = created["metadata"]["resourceVersion"]
    now = dt.datetime.now(dt.UTC).timestamp()
    marked = cluster.delete(f"{PODS}/p")
    meta = marked["metadata"]
    assert meta["deletionGracePeriodSeconds"] == 30                        # no spec value: 30
    assert now + 28 <= at(meta["deletionTimestamp"]) <= now + 32           # when the grace ends
    kept = cluster.get(f"{PODS}/p")
    assert kept["metadata"]["deletionTimestamp"] == meta["deletionTimestamp"] and kept["status"]["phase"] == "Running"
    events = cluster.watch(PODS, timeout=0.5, resourceVersion=rv)
    assert [e["type"] for e in events] == ["MODIFIED"] and events[0]["object"]["metadata"]["deletionTimestamp"]
    # status goes on changing (a kubelet reports), the pod stays; a longer grace changes nothing
    cluster.patch(f"{PODS}/p/status", {"status": {"phase": "Running", "conditions": [{"type": "Ready",
                                                                                      "status": "False"}]}})
    assert cluster.delete(f"{PODS}/p", {"gracePeriodSeconds": 60})["metadata"]["deletionGracePeriodSeconds"] == 30
    shorter = cluster.delete(f"{PODS}/p", {"gracePeriodSeconds": 5})["metadata"]
    assert shorter["deletionGracePeriodSeconds"] == 5 and at(shorter["deletionTimestamp"]) <= now + 7
    # the kubelet's confirmation (uid precondition, grace 0) removes it: a DELETED event
    err = http_error(cluster.delete, f"{PODS}/p", {"gracePeriodSeconds": 0, "preconditions": {"uid": "other"}})
    assert err.status == 409
    cluster.delete(f"{PODS}/p", {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
    assert http_error(cluster.get, f"{PODS}/p").status == 404
    assert cluster.watch(PODS, timeout=0.5, resourceVersion=rv)[-1]["type"] == "DELETED"

    running_pod(cluster, "short", grace=3)       # the pod's own terminationGracePeriodSeconds
    assert cluster.delete(f"{PODS}/short")["metadata"]["deletionGracePeriodSeconds"] == 3
    running_pod(cluster, "asked")                # the query's gracePeriodSeconds wins over the body's
    marked = cluster.request("DELETE", f"{PODS}/asked", {"gracePeriodSeconds": 9}, params={"gracePeriodSeconds": "4"})
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 4
    running_pod(cluster, "forced")               # force: gracePeriodSeconds=0 in the query
    cluster.request("DELETE", f"{PODS}/forced", params={"gracePeriodSeconds": "0"})
    assert http_error(cluster.get, f"{PODS}/forced").status == 404
    running_pod(cluster, "done")                 # finished: nothing to stop
    cluster.patch(f"{PODS}/done/status", {"status": {"phase": "Succeeded"}})
    cluster.delete(f"{PODS}/done")
    assert http_error(cluster.get, f"{PODS}/done").status == 404
    cluster.create(PODS, pod("never"))           # deletecollection: each pod by the same rule
    running_pod(cluster, "bound")
    cluster.request("DELETE", PODS, params={"labelSelector": ""})
    left = {p["metadata"]["name"]: p["metadata"].get("deletionTimestamp") for p in cluster.list(PODS)["items"]}
    assert "never" not in left and left["bound"] and left["short"] and left["asked"]
    # a graceful pod with a finalizer: gone once the grace is over (grace 0) and the finalizer removed
    running_pod(cluster, "guarded")
    cluster.patch(f"{PODS}/guarded", {"metadata": {"finalizers": ["example.test/guard"]}})
    cluster.delete(f"{PODS}/guarded")
    cluster.delete(f"{PODS}/guarded", {"gracePeriodSeconds": 0})
    assert cluster.get(f"{PODS}/guarded")["metadata"]["deletionGracePeriodSeconds"] == 0
    cluster.patch(f"{PODS}/guarded", {"metadata": {"finalizers": None}})
    assert http_error(cluster.get, f"{PODS}/guarded").status == 404
    # not a pod: no grace
    cluster.create(CONFIGMAPS, {"metadata": {"name": "c"}})
    cluster.delete(f"{CONFIGMAPS}/c", {"gracePeriodSeconds": 30})
    assert http_error(cluster.get, f"{CONFIGMAPS}/c").status == 404


def test_pod_deletion_by_kubectl_and_the_kubernetes_client(cluster: Cluster):
    """kubectl waits for a Terminating pod (times out: nobody confirms), ``--wait=false`` leaves it
    Terminating, ``--force --grace-period=0`` removes it; the kubernetes client's
    ``delete_namespaced_pod`` (query and body) likewise."""
    from kubernetes import client

    cluster.create(PODS, pod("unbound"))
    assert "deleted" in cluster.kubectl("delete", "pod", "unbound").stdout
    running_pod(cluster, "p")
    waited = cluster.kubectl("delete", "pod", "p", "--timeout=1s", check=False)
    assert waited.returncode != 0 and "timed out" in waited.stderr
    assert cluster.get(f"{PODS}/p")["metadata"]["deletionTimestamp"]
    assert cluster.kubectl("get", "pod", "p", "-o", "jsonpath={.metadata.deletionGracePeriodSeconds}").stdout == "30"
    running_pod(cluster, "q")
    assert "deleted" in cluster.kubectl("delete", "pod", "q", "--wait=false").stdout
    assert cluster.get(f"{PODS}/q")["metadata"]["deletionGracePeriodSeconds"] == 30
    forced = cluster.kubectl("delete", "pod", "p", "q", "--force", "--grace-period=0")
    assert forced.stdout.count("force deleted") == 2
    assert cluster.list(PODS)["items"] == []

    config = client.Configuration()
    config.host = cluster.url
    core = client.CoreV1Api(client.ApiClient(config))
    running_pod(cluster, "r")
    running_pod(cluster, "s")
    core.delete_namespaced_pod("r", "default")
    assert cluster.get(f"{PODS}/r")["metadata"]["deletionGracePeriodSeconds"] == 30
    core.delete_namespaced_pod("r", "default", grace_period_seconds=0)
    core.delete_namespaced_pod("s", "default", body=client.V1DeleteOptions(grace_period_seconds=0))
    assert cluster.list(PODS)["items"] == []


def test_namespaces_crds_and_events_are_served(cluster: Cluster):
    names = {i["metadata"]["name"] for i in cluster.list("/api/v1/namespaces")["items"]}
    assert {"default", "kube-system"} <= names
    cluster.create("/api/v1/namespaces/team-a/configmaps", {"metadata": {"name": "c"}})  # springs the namespace
    assert cluster.get("/api/v1/namespaces/team-a")["status"]["phase"] == "Active"
    crds = cluster.list("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
    assert [c["metadata"]["name"] for c in crds] == ["widgets.example.test"]
    cluster.create("/api/v1/namespaces/default/events", {"metadata": {"generateName": "e-"}, "reason": "Test"})
    cluster.create("/apis/events.k8s.io/v1/namespaces/default/events", {"metadata": {"name": "e2"}, "reason": "Test"})
    assert len(cluster.objects("events")) == 2
    assert "team-a" in cluster.kubectl("get", "ns").stdout


def test_kubectl_workflow(cluster: Cluster, tmp_path: Path):
    manifest = tmp_path / "w.yaml"
    manifest.write_text("apiVersion: example.test/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 1}\n")
    assert "created" in cluster.kubectl("apply", "-f", str(manifest)).stdout
    manifest.write_text(manifest.read_text().replace("size: 1", "size: 2"))
    assert "configured" in cluster.kubectl("apply", "-f", str(manifest)).stdout
    assert cluster.kubectl("get", "widget", "w1", "-o", "jsonpath={.spec.size}/{.metadata.generation}").stdout == "2/2"
    table = cluster.kubectl("get", "wd").stdout.splitlines()  # a table, by short name, with printer columns
    assert table[0].split() == ["NAME", "SIZE", "AGE"] and table[1].split()[:2] == ["w1", "2"]

    cluster.kubectl("patch", "widget", "w1", "--subresource=status", "--type=merge", "-p", '{"status":{"phase":"Running"}}')
    assert cluster.get(f"{WIDGETS}/w1")["status"] == {"phase": "Running"}

    timer = threading.Timer(0.3, cluster.patch, (f"{WIDGETS}/w1/status", {"status": {"phase": "Done"}}))
    timer.start()
    try:
        cluster.kubectl("wait", "--for=jsonpath={.status.phase}=Done", "widget/w1", "--timeout=10s")
    finally:
        timer.join()
    cluster.patch(f"{WIDGETS}/w1/status", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    cluster.kubectl("wait", "--for=condition=Ready", "widget/w1", "--timeout=10s")

    assert "deleted" in cluster.kubectl("delete", "widget", "w1").stdout
    result = cluster.kubectl("get", "widget", "w1", check=False)
    assert result.returncode == 1 and "NotFound" in result.stderr


def make_widget_operator(cluster: Cluster, calls: list[str]):
    """A tiny operator over Widgets, declared into the registry that the harness gives it."""
    import kopf

    def register(registry: kopf.OperatorRegistry) -> None:
        @kopf.on.create("example.test", "v1", "widgets", id="provision", registry=registry)
        def provision(body, patch, **_):
            calls.append(f"create:{body.metadata.name}")
            child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{body.metadata.name}-child"},
                     "data": {"size": str(body.spec["size"])}}
            kopf.adopt(child, owner=body, strict=True)
            cluster.create(f"/api/v1/namespaces/{child['metadata']['namespace']}/configmaps", child)
            kopf.info(body, reason="Provisioned", message="child created")
            patch.status["phase"] = "Provisioned"

        @kopf.on.update("example.test", "v1", "widgets", id="resize", field="spec.size", registry=registry)
        def resize(new, **_):
            calls.append(f"resize:{new}")

        @kopf.on.delete("example.test", "v1", "widgets", id="cleanup", registry=registry)
        def cleanup(body, **_):
            calls.append(f"delete:{body.metadata.name}")

    return register


def test_kopf_operator_end_to_end(cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG, logger="kopf")
    calls: list[str] = []
    operator = make_widget_operator(cluster, calls)
    with run_kopf_operator(operator, cluster):
        cluster.create(WIDGETS, widget("w1", size=1))
        wait_for(lambda: cluster.get(f"{WIDGETS}/w1").get("status", {}).get("phase") == "Provisioned", message="status")
        owned = wait_for(lambda: cluster.objects("configmaps", "default"), message="child")
        owner = cluster.get(f"{WIDGETS}/w1")
        assert owned[0]["metadata"]["ownerReferences"] == [{
            "apiVersion": "example.test/v1", "kind": "Widget", "name": "w1", "uid": owner["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}]
        assert "kopf.zalando.org/KopfFinalizerMarker" in owner["metadata"]["finalizers"]  # JSON patch + test op
        wait_for(lambda: any(e.get("reason") == "Provisioned" for e in cluster.objects("events")), message="event")

    with run_kopf_operator(operator, cluster):  # a restart: the finished create handler must not re-run
        cluster.patch(f"{WIDGETS}/w1", {"spec": {"size": 2}})
        wait_for(lambda: "resize:2" in calls, message="the update handler after the restart")
        cluster.kubectl("delete", "widget", "w1", "--timeout=10s")  # waits for kopf to release the finalizer
        assert calls == ["create:w1", "resize:2", "delete:w1"]

    problems = [r.getMessage() for r in caplog.records if r.name.startswith("kopf") and r.levelno >= logging.WARNING
                and "OS signals are ignored" not in r.getMessage()]
    assert not problems


class _CountedHistory(list):
    """The emulator's request records, counting every full scan of them."""

    scans = 0

    def __iter__(self):
        self.scans += 1
        return super().__iter__()


def test_discovery_answers_without_scanning_the_request_history(cluster: Cluster):
    """kmock's own dispatch tests each reaction's filter against every request served so far, so a
    discovery answer took time in proportion to the history (seconds in a long bench, the event loop
    blocked). The emulator serves discovery directly: the same documents, recorded, never a scan."""
    history = cluster.emulator._requests = _CountedHistory(cluster.emulator._requests)
    before = len(history)
    assert [r["name"] for r in cluster.get("/apis/example.test/v1")["resources"]] == ["widgets", "widgets/status"]
    assert {"example.test", "apps"} <= {g["name"] for g in cluster.get("/apis")["groups"]}
    assert cluster.get("/apis/example.test")["preferredVersion"]["version"] == "v1"
    assert cluster.get("/api")["versions"] == ["v1"]
    assert "namespaces" in {r["name"] for r in cluster.get("/api/v1")["resources"]}
    assert "/apis/example.test/v1" in cluster.get("/")["paths"]
    assert cluster.get("/version")["major"] == "1"
    assert http_error(cluster.get, "/apis/nope.test/v1").status == 404
    assert history.scans == 0 and len(history) == before + 8
