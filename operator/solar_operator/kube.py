"""The operator's whole conversation with the API server: SolarRuns, their PyTorchJobs, Events.

Synchronous (kopf runs sync handlers in its thread pool), through the official ``kubernetes``
client; credentials from the in-cluster service account or ``$KUBECONFIG``. Every
``ApiException`` is translated here (``errors.translate``); 404 means "gone" and 409 on create
means "already there", so repeated reconciles are harmless.

The status is written with a JSON merge patch on the ``/status`` subresource and no
resourceVersion precondition: the operator is the only writer of ``.status`` (one replica,
``Recreate``) and serialises reconciles of a run, so a precondition would only turn kopf's own
annotation patches into spurious conflicts.

Every call has a deadline (``REQUEST_TIMEOUT``: connect, read): an API server that accepts a
connection and never answers must not hold a handler thread, and with it the run's reconcile, for
ever; a call that runs out of time is an ``ApiUnavailable`` like a 503, retried later.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket

from solar.run.spec import GROUP as RUN_GROUP
from solar.run.spec import PLURAL as RUN_PLURAL
from solar.run.spec import VERSION as RUN_VERSION
from solar_operator import errors

JOB_GROUP, JOB_VERSION, JOB_PLURAL = "kubeflow.org", "v1", "pytorchjobs"
COMPONENT = "solar-operator"
REQUEST_TIMEOUT = (5.0, 30.0)  # seconds to connect, seconds to wait for the answer
log = logging.getLogger("solar_operator")


def api_client(url: str | None = None):
    """A ``kubernetes`` ApiClient: ``url`` (tests), else in-cluster config, else ``$KUBECONFIG``."""
    from kubernetes import client, config
    from urllib3.util import Retry

    if url is not None:
        configuration = client.Configuration()
        configuration.host = url
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        configuration = client.Configuration.get_default_copy()
    # A connection that could not be made is tried again at once; a request sent and not answered in
    # time is not (urllib3 would send a GET three more times, four deadlines in all): that failure is
    # the handler's, retried by kopf after its delay.
    configuration.retries = Retry(total=None, connect=3, read=0, redirect=0, status=0)
    return client.ApiClient(configuration)


class Kube:
    def __init__(self, api, *, timeout: tuple[float, float] = REQUEST_TIMEOUT) -> None:
        import urllib3
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self._exc = client.exceptions.ApiException
        self._down = (OSError, urllib3.exceptions.HTTPError)  # refused, reset, timed out
        self._instance = os.environ.get("POD_NAME") or socket.gethostname()
        self.timeout = timeout

    def _call(self, what: str, fn, *args, missing=None, answers: dict | None = None, **kwargs):
        """``fn`` within the deadline; a 404 returns ``missing`` (``answers``: other statuses that
        return a value instead of raising); any other refusal or no answer raises ``errors``' kind."""
        answers = {404: missing} if answers is None else answers
        try:
            return fn(*args, _request_timeout=self.timeout, **kwargs)
        except self._exc as exc:
            if exc.status in answers:
                return answers[exc.status]
            raise errors.translate(exc, what) from None
        except self._down as exc:
            raise errors.translate(exc, what) from None

    # -- SolarRuns ------------------------------------------------------------------------------
    def get_run(self, namespace: str, name: str) -> dict | None:
        return self._call(f"get solarrun {namespace}/{name}", self.custom.get_namespaced_custom_object,
                          RUN_GROUP, RUN_VERSION, namespace, RUN_PLURAL, name)

    def patch_run(self, namespace: str, name: str, patch: dict) -> dict | None:
        """A JSON merge patch of the run (its metadata: the operator's finalizer); None when it is gone."""
        return self._call(f"patch solarrun {namespace}/{name}", self.custom.patch_namespaced_custom_object,
                          RUN_GROUP, RUN_VERSION, namespace, RUN_PLURAL, name, patch)

    def patch_run_status(self, namespace: str, name: str, status_patch: dict) -> dict | None:
        return self._call(f"patch solarrun {namespace}/{name} status",
                          self.custom.patch_namespaced_custom_object_status, RUN_GROUP, RUN_VERSION, namespace,
                          RUN_PLURAL, name, {"status": status_patch})

    # -- Events ---------------------------------------------------------------------------------
    def post_event(self, run: dict, kind: str, reason: str, message: str) -> None:
        """A core/v1 Event on the SolarRun; the ``errors`` kind when the server refuses it or does not
        answer (the reconciler retries the temporary ones later; an Event never fails a reconcile)."""
        from kubernetes import client

        meta = run["metadata"]
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = client.CoreV1Event.from_dict({
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": run.get("apiVersion"), "kind": run.get("kind"), "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "reason": reason, "message": message[:1024], "type": kind, "count": 1,
            "firstTimestamp": now, "lastTimestamp": now, "source": {"component": COMPONENT},
            "reportingComponent": f"{RUN_GROUP}/operator", "reportingInstance": self._instance[:128]})
        self._call(f"post event {reason} on {meta['namespace']}/{meta['name']}", self.core.create_namespaced_event,
                   meta["namespace"], body)  # a 404: the namespace or run is gone, nobody to tell

    # -- any job kind (PyTorchJob, TrainJob), runtimes and discovery ----------------------------------
    # ``res`` is (group, version, plural); messages name one object of it (the plural without its "s").
    def list_objects(self, res: tuple[str, str, str], namespace: str, selector: str) -> list[dict]:
        result = self._call(f"list {res[2]} in {namespace}", self.custom.list_namespaced_custom_object,
                            *res[:2], namespace, res[2], label_selector=selector, missing={"items": []})
        return result.get("items", [])

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        """Pods by label selector, as plain documents (a failed stage job's: their termination messages)."""
        import json

        result = self._call(f"list pods in {namespace}", self.core.list_namespaced_pod, namespace,
                            label_selector=selector, _preload_content=False, missing=None)
        return json.loads(result.data).get("items", []) if result is not None else []

    def list_nodes(self) -> list[dict]:
        """Every node, as plain documents (elastic stages: what the cluster can hold; --read-nodes)."""
        import json

        result = self._call("list nodes", self.core.list_node, _preload_content=False, missing=None)
        return json.loads(result.data).get("items", []) if result is not None else []

    def list_all_pods(self) -> list[dict]:
        """Every pod of every namespace, as plain documents (the GPUs requested on each node; --read-nodes)."""
        import json

        result = self._call("list pods", self.core.list_pod_for_all_namespaces, _preload_content=False, missing=None)
        return json.loads(result.data).get("items", []) if result is not None else []

    def get_object(self, res: tuple[str, str, str], namespace: str, name: str) -> dict | None:
        return self._call(f"get {res[2][:-1]} {namespace}/{name}", self.custom.get_namespaced_custom_object,
                          *res[:2], namespace, res[2], name)

    def create_object(self, res: tuple[str, str, str], manifest: dict) -> str | None:
        """Create; the new object's resourceVersion ("" when the answer has none), or None when an
        object of that name already exists (409 on create means just that)."""
        meta = manifest["metadata"]
        created = self._call(f"create {res[2][:-1]} {meta['namespace']}/{meta['name']}",
                             self.custom.create_namespaced_custom_object, *res[:2], meta["namespace"], res[2],
                             manifest, answers={409: None})
        if created is None:
            return None
        return str(((created.get("metadata") if isinstance(created, dict) else None) or {}).get("resourceVersion")
                   or "")

    def patch_object(self, res: tuple[str, str, str], namespace: str, name: str, patch: dict) -> dict | None:
        """A JSON merge patch; None when the object is gone."""
        return self._call(f"patch {res[2][:-1]} {namespace}/{name}", self.custom.patch_namespaced_custom_object,
                          *res[:2], namespace, res[2], name, patch)

    def delete_object(self, res: tuple[str, str, str], namespace: str, name: str, uid: str) -> bool:
        """Delete that very object (a uid precondition); False when it is already gone."""
        from kubernetes import client

        options = client.V1DeleteOptions(propagation_policy="Background",
                                         preconditions=client.V1Preconditions(uid=uid))
        result = self._call(f"delete {res[2][:-1]} {namespace}/{name}", self.custom.delete_namespaced_custom_object,
                            *res[:2], namespace, res[2], name, body=options, missing=False)
        return result is not False

    def get_cluster_object(self, res: tuple[str, str, str], name: str) -> dict | None:
        return self._call(f"get {res[2][:-1]} {name}", self.custom.get_cluster_custom_object, *res[:2], res[2],
                          name)

    def served(self, res: tuple[str, str, str]) -> bool:
        """Whether the API server serves that resource (discovery of its group-version)."""
        found = self._call(f"discover {res[0]}/{res[1]}", self.custom.get_api_resources, res[0], res[1])
        if found is None:
            return False
        listed = found.get("resources") if isinstance(found, dict) else found.resources
        return any((r.get("name") if isinstance(r, dict) else r.name) == res[2] for r in listed or [])
