"""The job backend: where stage jobs live. Small on purpose, so a Kubeflow Trainer v2 ``TrainJob``
backend can sit beside the PyTorchJob one."""

from __future__ import annotations

from typing import Protocol

from solar_operator import pytorchjob


class JobBackend(Protocol):
    def jobs(self, namespace: str, run: str) -> dict[str, object]:
        """The run's jobs by stage name (``solar.run.machine.JobState``)."""

    def create(self, manifest: dict) -> bool:
        """Create a job; False when it already exists (a repeated reconcile)."""

    def delete(self, namespace: str, name: str) -> bool:
        """Delete a job the run owns; False when it is already gone."""


class PyTorchJobs:
    """``kubeflow.org/v1`` PyTorchJobs through the Kubernetes API (the ``kubernetes`` client)."""

    def __init__(self, api_client) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)

    def _list(self, namespace: str, run: str) -> list[dict]:
        result = self.api.list_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, namespace,
                                                        pytorchjob.PLURAL,
                                                        label_selector=f"{pytorchjob.RUN_LABEL}={run}")
        return [j for j in result.get("items", []) if j["metadata"].get("labels", {}).get(pytorchjob.RUN_LABEL) == run]

    def jobs(self, namespace: str, run: str) -> dict[str, object]:
        out = {}
        for job in self._list(namespace, run):
            stage = job["metadata"]["labels"].get(pytorchjob.STAGE_LABEL)
            if stage:
                out[stage] = pytorchjob.state(job)
        return out

    def create(self, manifest: dict) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.create_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION,
                                                     manifest["metadata"]["namespace"], pytorchjob.PLURAL, manifest)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    def delete(self, namespace: str, name: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            job = self.api.get_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, namespace,
                                                        pytorchjob.PLURAL, name)
            if pytorchjob.RUN_LABEL not in job["metadata"].get("labels", {}):
                raise RuntimeError(f"refusing to delete {namespace}/{name}: not a job the operator created")
            self.api.delete_namespaced_custom_object(pytorchjob.GROUP, pytorchjob.VERSION, namespace,
                                                     pytorchjob.PLURAL, name,
                                                     body={"propagationPolicy": "Background"})
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
