"""The Grafana dashboard shipped with the Helm chart (charts/solar-operator/dashboards/solar-runs.json).

The chart embeds the file verbatim into a ConfigMap for Grafana's dashboard sidecar, so nothing checks
it before someone opens it in Grafana. These tests do: the JSON is a well-formed dashboard (unique
panel ids, a layout without overlaps, every query on the ``$datasource`` variable, no undefined
variables), every series it queries is one the operator or the trainer really exports (read from their
live ``prometheus_client`` registries, not from a copied list), and each topic the dashboard is for has
a panel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "charts" / "solar-operator" / "dashboards" / "solar-runs.json"

PANEL_TYPES = {"timeseries", "stat", "table", "state-timeline", "gauge", "row"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms",
                    "__all", "__from", "__to", "__dashboard", "__org", "__user", "timeFilter"}
# Series Prometheus makes itself for every target.
PROMETHEUS_SERIES = {"up": "gauge", "scrape_duration_seconds": "gauge", "scrape_samples_scraped": "gauge"}
# The operator's per-run gauges and everything the trainer exports carry namespace/run labels.
PER_RUN_PREFIXES = ("solar_train_", "solar_checkpoint_")
PER_RUN_OPERATOR = {"solar_run_phase", "solar_run_checkpoint_step", "solar_run_checkpoint_timestamp_seconds",
                    "solar_run_validation_step"}


# ---------------------------------------------------------------------------------------- helpers


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"duplicate JSON keys: {dupes}")
    return dict(pairs)


def load_strict(text: str) -> dict:
    return json.loads(text, object_pairs_hook=_no_duplicates)


def all_panels(dashboard: dict) -> list[dict]:
    """Top-level panels plus those folded into collapsed rows."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels") or [])
    return out


def variable_query(var: dict) -> str:
    query = var.get("query")
    if isinstance(query, dict):
        query = query.get("query", "")
    return query or var.get("definition", "")


def all_exprs(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    exprs = [(f"panel {p.get('id')} {p.get('title')!r} target {t.get('refId')}", t.get("expr", ""))
             for p in all_panels(dashboard) for t in p.get("targets") or []]
    exprs += [(f"variable {v['name']}", variable_query(v))
              for v in dashboard["templating"]["list"] if v.get("type") == "query"]
    return exprs


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-zA-Z$_]+")
_VARIABLE = re.compile(r"\$\{?\w+(?::\w+)?\}?|\[\[\w+\]\]")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)(?:[smhdwy]|ms)?(?![\w:])")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
             "unless", "atan2", "inf", "nan", "start", "end"}
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.S)


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression (or a ``label_values(series, label)`` variable query) reads."""
    m = _LABEL_VALUES.match(expr)
    if m:
        expr = m.group(1)
    text = _STRING.sub(" ", expr)          # label values first: they may look like identifiers or hold braces
    text = _MATCHERS.sub(" ", text)        # {label="..."}: label names are not series
    text = _RANGE.sub(" ", text)           # [5m], [$__rate_interval], [1h:5m]
    text = _GROUPING.sub(" ", text)        # by (namespace, le) ...: label names again
    text = _OFFSET.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for ident in _IDENT.finditer(text):
        rest = text[ident.end():].lstrip()
        if rest.startswith("("):         # a function call: rate(, histogram_quantile(, time(
            continue
        if ident.group().lower() in _KEYWORDS:
            continue
        names.add(ident.group())
    return names


def exposed_names(families) -> dict[str, str]:
    """Series name -> type, as Prometheus will store them, for ``prometheus_client`` metric families.

    ``collect()`` names a Counter's family without ``_total`` (the OpenMetrics convention) while its
    series is ``<name>_total``; a histogram's family name is the base of its ``_bucket``/``_sum``/``_count``
    series. Families appear even when a labelled metric has no children yet; sample names are added too.
    """
    names: dict[str, str] = {}
    for family in families:
        if family.type == "counter":
            names[family.name + "_total"] = "counter"
        else:
            names[family.name] = family.type
        for sample in family.samples:
            names.setdefault(sample.name, "sample")
    return names


def resolve(name: str, exported: dict[str, str]) -> str:
    """Map ``x_bucket``/``x_sum``/``x_count`` to ``x`` when ``x`` is an exported histogram/summary."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if exported.get(base) in ("histogram", "summary", "gaugehistogram") and (
                    suffix != "_bucket" or exported[base] != "summary"):
                return base
    return name


def unknown_metrics(exprs, exported: dict[str, str]) -> dict[str, set[str]]:
    """{where: names not exported} for (where, expr) pairs; empty when every name is known."""
    out = {}
    for where, expr in exprs:
        missing = {n for n in metric_names(expr) if resolve(n, exported) not in exported}
        if missing:
            out[where] = missing
    return out


def used_metrics(dashboard: dict, exported: dict[str, str]) -> set[str]:
    return {resolve(n, exported) for _, expr in all_exprs(dashboard) for n in metric_names(expr)}


# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return load_strict(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def operator_names() -> dict[str, str]:
    from solar_operator import metrics

    return exposed_names(metrics.REGISTRY.collect())


@pytest.fixture(scope="module")
def trainer_names() -> dict[str, str]:
    from solar.train.metrics import TrainMetrics

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOLAR_METRICS_PORT", "0")  # a free port: the constructor starts an HTTP server
        train = TrainMetrics()
    try:
        return exposed_names(train.registry.collect())
    finally:
        train.close()
        train.server.server_close()


@pytest.fixture(scope="module")
def exported(operator_names, trainer_names) -> dict[str, str]:
    return {**PROMETHEUS_SERIES, **operator_names, **trainer_names}


# ---------------------------------------------------------------------------------------- structure


def test_strict_loader_rejects_duplicate_keys():
    with pytest.raises(ValueError, match="duplicate JSON keys"):
        load_strict('{"uid": "a", "panels": [], "uid": "b"}')


def test_top_level(dashboard):
    for key in ("uid", "title", "id", "editable", "schemaVersion", "time", "refresh", "templating", "panels"):
        assert key in dashboard, key
    assert dashboard["uid"] == "solar-runs"
    assert dashboard["title"] == "Solar runs"
    assert dashboard["id"] is None
    assert dashboard["editable"] is True
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert set(dashboard["time"]) >= {"from", "to"}
    assert isinstance(dashboard["templating"]["list"], list)
    assert dashboard["panels"], "no panels"


def test_template_variables(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert len(variables) == len(dashboard["templating"]["list"]), "duplicate variable names"
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for name in ("namespace", "run"):
        var = variables[name]
        assert var["type"] == "query", name
        assert var["multi"] is True and var["includeAll"] is True, name
        assert variable_query(var).startswith("label_values("), name
        assert var["datasource"] == DATASOURCE, name
    # run is scoped to the chosen namespaces
    assert "$namespace" in variable_query(variables["run"])


def test_panel_ids_unique_and_types_known(dashboard):
    panels = all_panels(dashboard)
    ids = [p.get("id") for p in panels]
    assert all(isinstance(i, int) for i in ids), ids
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    for p in panels:
        assert p.get("type") in PANEL_TYPES, (p.get("id"), p.get("type"))
        assert p.get("title"), p.get("id")


def test_layout_fits_and_does_not_overlap(dashboard):
    boxes = []
    for p in dashboard["panels"]:  # collapsed rows' children are laid out when expanded, not here
        g = p["gridPos"]
        assert set(g) >= {"h", "w", "x", "y"}, p["id"]
        assert all(isinstance(g[k], int) for k in "hwxy"), p["id"]
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] >= 0 and g["y"] >= 0, p["id"]
        assert g["x"] + g["w"] <= 24, f"panel {p['id']} is wider than the 24-column grid"
        boxes.append((p["id"], g))
    for i, (a, ga) in enumerate(boxes):
        for b, gb in boxes[i + 1:]:
            apart = (ga["x"] + ga["w"] <= gb["x"] or gb["x"] + gb["w"] <= ga["x"]
                     or ga["y"] + ga["h"] <= gb["y"] or gb["y"] + gb["h"] <= ga["y"])
            assert apart, f"panels {a} and {b} overlap: {ga} {gb}"


def test_targets_and_datasources(dashboard):
    for p in all_panels(dashboard):
        targets = p.get("targets") or []
        if p["type"] == "row":
            assert not targets, f"row {p['id']} has queries"
            continue
        assert targets, f"panel {p['id']} {p['title']!r} has no queries"
        assert p.get("datasource") == DATASOURCE, p["id"]
        refs = [t.get("refId") for t in targets]
        assert len(refs) == len(set(refs)), f"panel {p['id']}: duplicate refIds {refs}"
        for t in targets:
            assert t.get("refId") and t.get("expr", "").strip(), (p["id"], t)
            assert t.get("datasource", DATASOURCE) == DATASOURCE, (p["id"], t.get("refId"))


def _datasource_refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            else:
                yield from _datasource_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _datasource_refs(item)


def test_every_datasource_is_the_variable(dashboard):
    for ref in _datasource_refs({"panels": dashboard["panels"], "templating": dashboard["templating"]}):
        assert ref == DATASOURCE, ref


def test_variables_used_are_defined(dashboard):
    defined = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_BUILTINS
    used = set()
    for where, expr in all_exprs(dashboard):
        for m in re.finditer(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", expr):
            name = next(g for g in m.groups() if g)
            assert name in defined, f"{where}: ${name} is not a dashboard variable"
            used.add(name)
    assert {"namespace", "run", "__rate_interval"} <= used


_SELECTOR = re.compile(r"""([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\{(?:[^{}"'`]|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')*\})?""")


def test_per_run_series_are_filtered_by_namespace_and_run(dashboard):
    checked = 0
    for where, expr in all_exprs(dashboard):
        if where.startswith("variable"):
            continue
        for m in _SELECTOR.finditer(expr):  # a matcher block is consumed with its series name
            name, block = m.group(1), m.group(2) or ""
            if name.startswith(PER_RUN_PREFIXES) or name in PER_RUN_OPERATOR:
                checked += 1
                assert 'namespace=~"$namespace"' in block, f"{where}: {name} not filtered by namespace"
                assert 'run=~"$run"' in block, f"{where}: {name} not filtered by run"
    assert checked


# ---------------------------------------------------------------------------------------- metric names


def test_metric_name_extraction():
    expr = ('histogram_quantile(0.99, sum by (handler, le) (rate(solar_operator_reconcile_duration_seconds_bucket'
            '{job="solar-operator", handler=~"create|rate(x)"}[$__rate_interval]))) '
            '+ on (namespace) group_left(stage) (time() - max without (pod) (solar_run_checkpoint_timestamp_seconds'
            '{namespace=~"$namespace"} offset 5m)) > bool 1e3')
    assert metric_names(expr) == {"solar_operator_reconcile_duration_seconds_bucket",
                                  "solar_run_checkpoint_timestamp_seconds"}
    assert metric_names('label_values(solar_run_phase{namespace=~"$namespace"}, run)') == {"solar_run_phase"}
    assert metric_names("up{job='x'} and solar_train_step") == {"up", "solar_train_step"}


def test_registries_are_read(operator_names, trainer_names):
    # The sets the dashboard is checked against come from the code, and handle counters and histograms.
    assert operator_names.get("solar_operator_reconcile_total") == "counter"
    assert operator_names.get("solar_operator_reconcile_duration_seconds") == "histogram"
    assert trainer_names.get("solar_train_samples_total") == "counter"
    assert trainer_names.get("solar_train_step_seconds") == "histogram"


def test_unknown_metric_is_reported(exported):
    assert unknown_metrics([("synthetic", "rate(solar_train_bogus[5m])")], exported) == {
        "synthetic": {"solar_train_bogus"}}
    # A suffix only resolves on a real histogram, and a counter needs its _total.
    assert unknown_metrics([("s", "solar_train_step_bucket + solar_train_samples + "
                                  "solar_train_step_seconds_count")], exported) == {
        "s": {"solar_train_step_bucket", "solar_train_samples"}}


def test_dashboard_uses_only_exported_metrics(dashboard, exported):
    assert used_metrics(dashboard, exported), "no metric names found in the dashboard"
    missing = unknown_metrics(all_exprs(dashboard), exported)
    assert not missing, f"series the code does not export: {missing}"


# ---------------------------------------------------------------------------------------- coverage

TOPICS = {
    # topic: (a series one panel must read, a regex that panel's queries must also match)
    "run phase and stage": ("solar_run_phase", r"\bstage\b"),
    "runs by phase": ("solar_runs", r"\bphase\b"),
    "loss": ("solar_train_loss", r""),
    "grad norm": ("solar_train_grad_norm", r""),
    "step time": ("solar_train_step_seconds", r"solar_train_step_seconds_bucket"),
    "samples/s": ("solar_train_samples_total", r"\brate\(solar_train_samples_total"),
    "mfu": ("solar_train_mfu_ratio", r""),
    "checkpoint age": ("solar_run_checkpoint_timestamp_seconds", r"\btime\(\)\s*-"),
    "validation progress": ("solar_run_validation_step", r""),
    "operator up": ("up", r'job="solar-operator"'),
    "reconcile rate by result": ("solar_operator_reconcile_total", r"\bby\s*\([^)]*\bresult\b"),
    "reconcile latency p99": ("solar_operator_reconcile_duration_seconds", r"histogram_quantile\(0\.99,"),
    "stage transitions": ("solar_run_stage_transitions_total", r""),
    "stage failures": ("solar_run_stage_failures_total", r"\bby\s*\([^)]*\berror_type\b"),
    "elastic shape changes": ("solar_stage_shape_changes_total", r"\bby\s*\([^)]*\bdirection\b"),
    "elastic disruption time": ("solar_stage_disruption_seconds_total", r""),
}


@pytest.mark.parametrize("topic", sorted(TOPICS))
def test_topic_has_a_panel(dashboard, exported, topic):
    series, pattern = TOPICS[topic]
    for p in all_panels(dashboard):
        exprs = [t.get("expr", "") for t in p.get("targets") or []]
        names = {resolve(n, exported) for e in exprs for n in metric_names(e)}
        if series in names and any(re.search(pattern, e) for e in exprs):
            assert p["type"] != "row"
            return
    pytest.fail(f"no panel for {topic}: none reads {series} with {pattern!r}")
