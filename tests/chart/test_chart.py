"""The Helm chart, checked with the real helm (lint --strict, template) and rendered objects validated
offline with kubernetes-validate --strict; CRD, RBAC, monitors and values schema against what the
operator and the trainer pods really are."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from solar.run import crd
from solar.run.spec import SolarRun
from solar_operator import jobs
from solar_operator.main import build_parser
from tests.support.crd_schema import crd_validator_schema
from tests.support.tools import CHART, helm, render, values_args

K8S_VERSION = "1.32"
MONITORING_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}  # Prometheus Operator CRDs, not core
MONITORING_ON = {"monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
                                "trainerPodMonitor": {"enabled": True},
                                "prometheusRule": {"enabled": True},
                                "grafanaDashboard": {"enabled": True, "namespace": "grafana"}}}
VALUE_SETS = {
    "defaults": None,
    "monitoring": MONITORING_ON,
    "service-monitor": {"monitoring": {"serviceMonitor": {"enabled": True, "interval": "1m"}}},
    "namespace-scoped": {"watch": {"namespaces": ["team-a", "team-b"]},
                         "monitoring": {"trainerPodMonitor": {"enabled": True}}},
    "read-nodes": {"elastic": {"readNodes": True}, "watch": {"namespaces": ["team-a"]}},
    "tensorboard": {"tensorboard": {"enabled": True, "path": "team-a", "image": {"digest": "sha256:" + "cd" * 32}},
                    "monitoring": {"serviceMonitor": {"enabled": True}}},
    "custom-storage": {"storage": {"volume": {"nfs": {"server": "nfs.example", "path": "/export/runs"}},
                                   "mountPath": "/mnt/solar"},
                       "image": {"digest": "sha256:" + "ab" * 32},
                       "operator": {"logLevel": "debug", "logFormat": "json", "pollSeconds": 2.5},
                       "crds": {"keep": False}, "serviceAccount": {"create": False, "name": "ops"}},
}


def _by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def _only(docs, kind: str) -> dict:
    found = _by_kind(docs).get(kind, [])
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_strict_and_every_rendered_object_validates(name, tmp_path):
    values = VALUE_SETS[name]
    helm("lint", "--strict", str(CHART), *values_args(values, tmp_path), tmp=tmp_path)
    docs = render(tmp_path, values, monitoring_api=True)
    unknown = set()
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            unknown.add(doc["kind"])
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at "
                                 f"{'.'.join(map(str, exc.path))}") from None
    assert unknown <= MONITORING_KINDS, f"no schema for {unknown - MONITORING_KINDS}"
    for doc in docs:  # what every object of ours carries
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "solar"
        assert len(doc["metadata"]["name"]) <= 63


def test_validation_itself_rejects_a_bad_object(tmp_path):
    deployment = _only(render(tmp_path), "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_the_deployment_runs_the_real_operator_cli_safely(tmp_path):
    docs = render(tmp_path, VALUE_SETS["custom-storage"])
    deployment = _only(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/solarwm/solar-operator@sha256:" + "ab" * 32
    args = build_parser().parse_args(container["args"])  # the operator's own parser accepts them
    assert args.standalone and args.all_namespaces and args.debug and args.log_format == "json"
    assert args.storage_root == "/mnt/solar"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["runs"] == {"name": "runs", "mountPath": "/mnt/solar", "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["runs"]["nfs"] == {"server": "nfs.example", "path": "/export/runs"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": args.metrics_port, "health": 8081}
    assert args.liveness == "http://0.0.0.0:8081/healthz"
    # both probes read /healthz (the process and its event loop answer); readiness waits for nothing more
    assert container["livenessProbe"] == {"httpGet": {"path": "/healthz", "port": "health"}, "initialDelaySeconds": 10,
                                          "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3}
    assert container["readinessProbe"] == {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 10,
                                           "timeoutSeconds": 5, "failureThreshold": 3}
    assert {e["name"]: e["value"] for e in container["env"]}["SOLAR_OPERATOR_POLL_SECONDS"] == "2.5"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert pod["serviceAccountName"] == "ops" and "ServiceAccount" not in _by_kind(docs)


def test_probe_timings_come_from_the_values(tmp_path):
    values = {"operator": {"livenessProbe": {"initialDelaySeconds": 30, "periodSeconds": 10, "timeoutSeconds": 2,
                                             "failureThreshold": 6},
                           "readinessProbe": {"periodSeconds": 5, "timeoutSeconds": 1, "failureThreshold": 1}}}
    (container,) = _only(render(tmp_path, values), "Deployment")["spec"]["template"]["spec"]["containers"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe] == {"httpGet": {"path": "/healthz", "port": "health"},
                                    **values["operator"][probe]}


def test_namespace_scoped_mode_watches_only_its_namespaces(tmp_path):
    docs = render(tmp_path, VALUE_SETS["namespace-scoped"], monitoring_api=True)
    container = _only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert args.namespace == ["team-a", "team-b"] and not args.all_namespaces
    kinds = _by_kind(docs)
    assert sorted(r["metadata"]["namespace"] for r in kinds["Role"]) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in kinds["RoleBinding"]) == ["team-a", "team-b"]
    trainer = next(m for m in kinds["PodMonitor"] if m["metadata"]["name"].endswith("-trainer"))
    assert trainer["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


# What the operator does through the API: kopf (watch SolarRuns and PyTorchJobs, its finalizer and
# annotations by patch, discovery of CRDs and namespaces) and solar_operator.kube (get runs, patch
# status, get/list/create/delete jobs, create events, list a failed job's pods for the trainer's refusal).
PYTORCHJOB_RULES = {("kubeflow.org", "pytorchjobs", v) for v in ("get", "list", "watch", "create", "delete")}
# TrainJobs are patched too (SolarRun suspend sets spec.suspend); their runtime is read before any job
TRAINJOB_RULES = {("trainer.kubeflow.org", "trainjobs", v) for v in ("get", "list", "watch", "create", "delete",
                                                                     "patch")}
RUNTIME_RULES = {("trainer.kubeflow.org", "clustertrainingruntimes", "get")}
RUN_RULES = {("solarwm.io", "solarruns", v) for v in ("get", "list", "watch", "patch")} \
    | {("solarwm.io", "solarruns/status", v) for v in ("get", "patch")} \
    | PYTORCHJOB_RULES | TRAINJOB_RULES \
    | {("", "events", "create"), ("events.k8s.io", "events", "create"), ("", "pods", "list")}
DISCOVERY_RULES = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")} \
    | {("", "namespaces", v) for v in ("list", "watch")} | RUNTIME_RULES
# elastic.readNodes (--read-nodes): capacity.View lists every node and every pod of the cluster (the GPUs
# requested on each node), cluster-scope in both modes
NODE_RULES = {("", "nodes", v) for v in ("get", "list", "watch")} | {("", "pods", "list")}


def _grants(role: dict) -> set[tuple[str, str, str]]:
    out = set()
    for rule in role["rules"]:
        for text in (*rule["apiGroups"], *rule["resources"], *rule["verbs"]):
            assert "*" not in text, f"wildcard in {role['kind']} {role['metadata']['name']}: {rule}"
        out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


@pytest.mark.parametrize("read_nodes", [False, True], ids=["", "read-nodes"])
@pytest.mark.parametrize("scoped", [False, True], ids=["cluster-wide", "namespace-scoped"])
def test_rbac_grants_exactly_what_the_operator_uses(scoped, read_nodes, tmp_path):
    values = copy.deepcopy(VALUE_SETS["namespace-scoped"]) if scoped else {}
    if read_nodes:
        values["elastic"] = {"readNodes": True}
    docs = render(tmp_path, values)
    kinds = _by_kind(docs)
    account = _only(docs, "ServiceAccount")["metadata"]
    cluster = _grants(_only(docs, "ClusterRole"))
    nodes = NODE_RULES if read_nodes else set()
    if scoped:
        assert cluster == DISCOVERY_RULES | nodes
        for role in kinds["Role"]:
            assert _grants(role) == RUN_RULES
    else:
        assert cluster == DISCOVERY_RULES | RUN_RULES | nodes and "Role" not in kinds
    for binding in kinds["ClusterRoleBinding"] + kinds.get("RoleBinding", []):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"],
                                        "namespace": account["namespace"]}]
        assert binding["roleRef"]["kind"] == ("Role" if binding["kind"] == "RoleBinding" else "ClusterRole")


def _node_rules(docs: list[dict]) -> list[dict]:
    kinds = _by_kind(docs)
    return [rule for role in kinds["ClusterRole"] + kinds.get("Role", []) for rule in role["rules"]
            if "nodes" in rule["resources"]]


def _operator_args(docs: list[dict]) -> list[str]:
    (container,) = _only(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container["args"]


@pytest.mark.parametrize("scoped", [False, True], ids=["cluster-wide", "namespace-scoped"])
def test_nodes_are_not_read_by_default(scoped, tmp_path, monkeypatch):
    """Without elastic.readNodes no role mentions nodes and the operator is not told to read them."""
    monkeypatch.delenv("SOLAR_OPERATOR_READ_NODES", raising=False)
    docs = render(tmp_path, VALUE_SETS["namespace-scoped"] if scoped else None)
    assert _node_rules(docs) == []
    args = _operator_args(docs)
    assert "--read-nodes" not in args and not build_parser().parse_args(args).read_nodes
    env = {e["name"] for e in _only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "SOLAR_OPERATOR_READ_NODES" not in env


@pytest.mark.parametrize("scoped", [False, True], ids=["cluster-wide", "namespace-scoped"])
def test_read_nodes_grants_nodes_cluster_wide_and_tells_the_operator(scoped, tmp_path, monkeypatch):
    """elastic.readNodes: one ClusterRole rule for nodes (get, list, watch) in both modes, and --read-nodes."""
    monkeypatch.delenv("SOLAR_OPERATOR_READ_NODES", raising=False)
    values = copy.deepcopy(VALUE_SETS["namespace-scoped"]) if scoped else {}
    values["elastic"] = {"readNodes": True}
    docs = render(tmp_path, values)
    assert _node_rules(docs) == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    assert all("nodes" not in rule["resources"] for role in _by_kind(docs).get("Role", []) for rule in role["rules"])
    cluster = _only(docs, "ClusterRole")["rules"]
    pods = [rule for rule in cluster if "pods" in rule["resources"]]  # every namespace's, once
    assert pods == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    args = _operator_args(docs)
    assert args.count("--read-nodes") == 1 and build_parser().parse_args(args).read_nodes


@pytest.mark.parametrize("backends, default", [(["pytorchjob"], "pytorchjob"), (["trainjob"], "trainjob"),
                                               (["pytorchjob", "trainjob"], "trainjob")])
def test_rbac_covers_the_enabled_backends_only_and_the_operator_is_told_them(backends, default, tmp_path):
    docs = render(tmp_path, {"backends": backends, "defaultBackend": default})
    granted = _grants(_only(docs, "ClusterRole"))
    assert (PYTORCHJOB_RULES <= granted) == ("pytorchjob" in backends)
    assert not (PYTORCHJOB_RULES & granted) or "pytorchjob" in backends
    assert (TRAINJOB_RULES | RUNTIME_RULES <= granted) == ("trainjob" in backends)
    assert not ((TRAINJOB_RULES | RUNTIME_RULES) & granted) or "trainjob" in backends
    (container,) = _only(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SOLAR_OPERATOR_BACKENDS"] == ",".join(backends) and env["SOLAR_OPERATOR_DEFAULT_BACKEND"] == default
    from solar_operator.backends import backend_name
    assert [backend_name(b) for b in env["SOLAR_OPERATOR_BACKENDS"].split(",")]  # the operator parses them


def test_the_crd_is_the_generated_one_and_kept_on_uninstall(tmp_path):
    generated = yaml.safe_load(crd.render())
    rendered = _only(render(tmp_path), "CustomResourceDefinition")
    assert rendered["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert rendered["spec"] == generated["spec"] and rendered["metadata"]["name"] == generated["metadata"]["name"]
    loose = _only(render(tmp_path, {"crds": {"keep": False}}), "CustomResourceDefinition")
    assert "annotations" not in loose["metadata"]
    assert "CustomResourceDefinition" not in _by_kind(render(tmp_path, {"crds": {"enabled": False}}))


def test_the_trainer_pod_monitor_selects_rank_zero_pods_of_stage_jobs(tmp_path):
    docs = render(tmp_path, MONITORING_ON, monitoring_api=True)
    monitor = next(m for m in _by_kind(docs)["PodMonitor"] if m["metadata"]["name"].endswith("-trainer"))
    selector = monitor["spec"]["selector"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    doc = yaml.safe_load((CHART.parents[1] / "examples" / "solarrun-wan22-ti2v-5b.yaml").read_text())
    from tests.unit.operator.test_jobs import _jobs

    job = next(iter(_jobs("examples/solarrun-wan22-ti2v-5b.yaml")))
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}, doc["metadata"]["name"]

    def selected(template: dict) -> bool:
        labels = template["metadata"]["labels"]
        return (all(labels.get(k) == v for k, v in selector["matchLabels"].items())
                and all(e["key"] in labels for e in selector["matchExpressions"] if e["operator"] == "Exists"))

    master, worker = replicas["Master"]["template"], replicas["Worker"]["template"]
    assert selected(master) and not selected(worker)
    ports = {p["name"]: p["containerPort"] for p in master["spec"]["containers"][0]["ports"]}
    assert endpoint["port"] in ports and ports[endpoint["port"]] == jobs.METRICS_PORT
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert relabel["job"]["replacement"] == "solar-trainer"
    for target, pod_label in (("run", jobs.RUN_LABEL), ("stage", jobs.STAGE_LABEL)):
        meta = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)
        assert relabel[target]["sourceLabels"] == [meta] and pod_label in master["metadata"]["labels"]
    assert monitor["spec"]["namespaceSelector"] == {"any": True}


def test_operator_monitors_scrape_its_metrics_port_under_a_fixed_job(tmp_path):
    docs = render(tmp_path, MONITORING_ON, monitoring_api=True)
    deployment = _only(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    monitor = next(m for m in _by_kind(docs)["PodMonitor"] if not m["metadata"]["name"].endswith("-trainer"))
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert all(pod_labels[k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True  # the runs' own namespace label wins
    assert endpoint["relabelings"][0]["replacement"] == "solar-operator"
    service_docs = render(tmp_path, VALUE_SETS["service-monitor"], monitoring_api=True)
    service_monitor, service = _only(service_docs, "ServiceMonitor"), _only(service_docs, "Service")
    assert all(service["metadata"]["labels"][k] == v for k, v in service_monitor["spec"]["selector"]["matchLabels"].items())
    assert service_monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_monitoring_objects_need_the_prometheus_operator_api_and_say_so(tmp_path):
    docs = render(tmp_path, MONITORING_ON, monitoring_api=False)
    assert not MONITORING_KINDS & set(_by_kind(docs))
    notes = helm("install", "solar", str(CHART), "--dry-run=client", "--namespace", "solar-system",
                 *values_args(MONITORING_ON, tmp_path), tmp=tmp_path).stdout
    assert ("nothing was created for: monitoring.podMonitor.enabled, monitoring.trainerPodMonitor.enabled, "
            "monitoring.prometheusRule.enabled") in notes


def test_rules_and_dashboard_are_shipped_verbatim(tmp_path):
    docs = render(tmp_path, MONITORING_ON, monitoring_api=True)
    rule = _only(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    dashboard = _only(docs, "ConfigMap")
    assert dashboard["metadata"]["namespace"] == "grafana"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["solar-runs.json"]) == json.loads(
        (CHART / "dashboards" / "solar-runs.json").read_text())


def test_notes_give_a_first_solarrun_that_the_crd_and_the_models_accept(tmp_path):
    out = helm("install", "solar", str(CHART), "--dry-run=client", "--namespace", "solar-system", tmp=tmp_path).stdout
    notes = out.split("NOTES:", 1)[1]
    assert "kubectl get solarruns" in notes and "solar-system" in notes
    block = notes.split("cat <<'YAML' | kubectl apply -f -\n", 1)[1].split("\n  YAML\n", 1)[0]
    run = yaml.safe_load("\n".join(line[2:] for line in block.splitlines()))
    jsonschema.validate(run, crd_validator_schema(crd.CRD_PATH))
    spec = SolarRun.model_validate(run).spec
    assert all((CHART.parents[1] / s.config).is_file() for s in spec.stages)


def test_helm_test_pod_checks_health_and_metrics_through_the_service(tmp_path):
    docs = render(tmp_path)
    pod = next(d for d in _by_kind(docs)["Pod"] if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test")
    script = pod["spec"]["containers"][0]["args"][0]
    service = _only(docs, "Service")
    host = f"http://{service['metadata']['name']}.solar-system.svc"
    assert f"{host}\"" in script and ":8081/healthz" in script and ":8080/metrics" in script
    compile(script, "helm-test", "exec")  # the script the pod runs is valid Python


BAD_VALUES = [
    ({"replicas": 2}, "additional properties 'replicas' not allowed"),
    ({"operator": {"logLevel": "loud"}}, "/operator/logLevel"),
    ({"operator": {"metricsPort": 0}}, "/operator/metricsPort"),
    ({"operator": {"pollSeconds": 0}}, "/operator/pollSeconds"),
    ({"operator": {"livenessProbe": {"periodSeconds": 0}}}, "/operator/livenessProbe/periodSeconds"),
    ({"operator": {"readinessProbe": {"path": "/ready"}}}, "additional properties 'path' not allowed"),
    ({"watch": {"namespaces": ["Team_A"]}}, "/watch/namespaces/0"),
    ({"storage": {"volume": {"nfs": {"server": "a", "path": "/"}, "hostPath": {"path": "/x"}}}}, "/storage/volume"),
    ({"storage": {"claimName": ""}}, "storage.claimName or storage.volume must name the run storage"),
    ({"storage": {"mountPath": "runs"}}, "/storage/mountPath"),
    ({"image": {"digest": "latest"}}, "/image/digest"),
    ({"monitoring": {"podMonitor": {"interval": "often"}}}, "/monitoring/podMonitor/interval"),
    ({"monitoring": {"grafanaDashboard": {"enabled": "yes"}}}, "/monitoring/grafanaDashboard/enabled"),
    ({"monitoring": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}}},
     "enable one of them"),
    ({"elastic": {"readNodes": "yes"}}, "/elastic/readNodes"),
    ({"elastic": {"readNode": True}}, "additional properties 'readNode' not allowed"),
    ({"backends": ["mpijob"]}, "/backends/0"),
    ({"backends": []}, "/backends"),
    ({"backends": ["trainjob"]}, "defaultBackend pytorchjob is not in backends"),
    ({"tensorboard": {"enabled": "yes"}}, "/tensorboard/enabled"),
    ({"tensorboard": {"port": 80}}, "/tensorboard/port"),
    ({"tensorboard": {"path": "../other"}}, "/tensorboard/path"),
    ({"tensorboard": {"enabled": True}, "storage": {"claimName": ""}},
     "storage.claimName or storage.volume must name the run storage"),
]


@pytest.mark.parametrize("values, message", BAD_VALUES, ids=[m for _, m in BAD_VALUES])
def test_bad_values_are_rejected_with_the_key_named(values, message, tmp_path):
    result = helm("template", "solar", str(CHART), *values_args(values, tmp_path), "--api-versions",
                  "monitoring.coreos.com/v1", tmp=tmp_path, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def _values_paths(node, prefix=""):
    for key, value in node.items():
        path = f"{prefix}{key}"
        yield path, value
        if isinstance(value, dict) and value:
            yield from _values_paths(value, path + ".")


def _schema_node(schema, path):
    node = schema
    for part in path.split("."):
        props = node.get("properties")
        if props is None:  # a free-form Kubernetes object (resources, securityContext, a volume source)
            return None
        node = props[part] if part in props else pytest.fail(f"values.yaml key {path} is not in values.schema.json")
    return node


def test_every_value_is_declared_and_described_and_every_declaration_has_a_default():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(values, schema)
    for path, _ in _values_paths(values):
        node = _schema_node(schema, path)
        if node is not None:
            assert node.get("description"), f"{path} has no description in values.schema.json"

    def walk(node, path):
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path or 'root'} admits unknown keys"
            for key, child in node["properties"].items():
                if key == "global":
                    continue
                where = f"{path}.{key}" if path else key
                here = values
                for part in where.split("."):
                    assert isinstance(here, dict) and part in here, f"schema key {where} has no default in values.yaml"
                    here = here[part]
                walk(child, where)

    walk(schema, "")


def _documented_paths(schema, prefix=""):
    """Keys documented in place: leaves and free-form objects (not groups like image: or monitoring:)."""
    for key, node in schema.get("properties", {}).items():
        if key == "global":
            continue
        path = f"{prefix}{key}"
        if "properties" in node:
            yield from _documented_paths(node, path + ".")
        else:
            yield path


def test_every_value_has_a_doc_comment_and_the_readme_is_generated_from_them():
    import importlib.util

    spec = importlib.util.spec_from_file_location("chart_readme", CHART.parents[1] / "scripts" / "chart_readme.py")
    chart_readme = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chart_readme)
    schema = json.loads((CHART / "values.schema.json").read_text())
    documented = dict(chart_readme.documented_values((CHART / "values.yaml").read_text()))
    assert set(documented) == set(_documented_paths(schema))
    assert all(len(comment) > 10 for comment in documented.values())
    assert (CHART / "README.md").read_text() == chart_readme.render(), "run `python scripts/chart_readme.py`"


def _tensorboard(docs: list[dict]) -> tuple[dict, dict]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-tensorboard")]
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-tensorboard")]
    return deployment, service


def test_tensorboard_is_off_by_default_and_serves_the_run_volume_read_only(tmp_path):
    assert not [d for d in render(tmp_path) if "tensorboard" in d["metadata"]["name"]]
    docs = render(tmp_path, VALUE_SETS["tensorboard"], monitoring_api=True)
    deployment, service = _tensorboard(docs)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/solarwm/solar-trainer@sha256:" + "cd" * 32
    assert container["command"] == ["tensorboard"] and "--logdir=/runs/team-a" in container["args"]
    assert "--bind_all" in container["args"] and "--port=6006" in container["args"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["runs"] == {"name": "runs", "mountPath": "/runs", "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["runs"]["persistentVolumeClaim"] == {"claimName": "solar-runs", "readOnly": True}
    assert mounts["tmp"]["mountPath"] == "/tmp" and "emptyDir" in volumes["tmp"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in service["spec"]["selector"].items())
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"http": 6006}
    # the operator's own selectors (its Deployment, Service, monitors) match none of TensorBoard's objects
    operator = next(d for d in docs if d["kind"] == "Deployment" and d is not deployment)
    for selector in (operator["spec"]["selector"]["matchLabels"], _only(docs, "ServiceMonitor")["spec"]["selector"]
                     ["matchLabels"]):
        for theirs in (labels, service["metadata"]["labels"], deployment["metadata"]["labels"]):
            assert not all(theirs.get(k) == v for k, v in selector.items()), (selector, theirs)
    custom = render(tmp_path, {"tensorboard": {"enabled": True}, **VALUE_SETS["custom-storage"]})
    deployment, _ = _tensorboard(custom)
    pod = deployment["spec"]["template"]["spec"]
    assert "--logdir=/mnt/solar" in pod["containers"][0]["args"]
    assert {v["name"]: v for v in pod["volumes"]}["runs"]["nfs"] == {"server": "nfs.example", "path": "/export/runs"}


def test_the_tensorboard_command_serves_each_stage_with_one_value_per_step(tmp_path):
    """The rendered container's own command and arguments (its log directory moved to a local folder)
    serve a stage's series, where a resumed launch replaced the steps an earlier one wrote after its
    checkpoint, as TensorBoard's HTTP API answers."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from solar.train.tracking import TensorBoardSink
    from tests.e2e.conftest import free_port

    for start, values in ((0, {1: 1.0, 2: 2.0, 3: 3.0}), (1, {2: 20.0, 3: 30.0, 4: 40.0})):
        sink = TensorBoardSink(tmp_path / "runs" / "team-a" / "fm", start)
        for step, value in values.items():
            sink.scalars(step, {"train/loss": value})
        sink.finish("complete")
    port = free_port()
    deployment, _ = _tensorboard(render(tmp_path, {"tensorboard": {"enabled": True, "path": "team-a",
                                                                   "port": port, "reloadInterval": 1}}))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [a.replace("--logdir=/runs", f"--logdir={tmp_path / 'runs'}") for a in container["args"]]
    program = Path(sys.executable).with_name(container["command"][0])
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.Popen([str(program), *args], env={**os.environ, "HOME": str(home), "TMPDIR": str(home)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run=fm/tensorboard&tag=train/loss"
    try:
        deadline, got = time.monotonic() + 90, None
        while got is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    got = json.loads(resp.read()) or None
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "tensorboard did not serve the run"
                time.sleep(0.5)
        assert [(step, value) for _, step, value in got] == [(1, 1.0), (2, 20.0), (3, 30.0), (4, 40.0)]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
