"""docs/operations/grafana-dashboard.json: a dashboard Grafana imports, asking only for series stoker exports.

The metrics are read from src/stoker/controller/metrics.py's own source (each Counter, Gauge, Histogram
and Summary it constructs, with its label names), so a renamed metric or label fails here, not on a
user's empty panel.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docs" / "operations" / "grafana-dashboard.json"
METRICS_MODULE = REPO / "src" / "stoker" / "controller" / "metrics.py"

# PromQL's functions and aggregations the dashboard may call, and its binary keywords.
FUNCTIONS = {
    "abs", "avg", "ceil", "clamp_max", "clamp_min", "count", "delta", "deriv", "floor", "histogram_quantile",
    "idelta", "increase", "irate", "label_replace", "max", "min", "quantile", "rate", "round", "sort",
    "sort_desc", "sum", "topk", "bottomk", "avg_over_time", "max_over_time", "min_over_time", "vector",
}  # fmt: skip
KEYWORDS = {"and", "or", "unless", "bool", "offset"}
GROUPING = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"
MATCHERS = r"([A-Za-z_:][\w:]*)?\s*\{([^}]*)\}"
LABEL_IN_MATCHER = r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)"
IDENTIFIER = r"[A-Za-z_:][\w:]*"
# Grafana's own variables inside a range selector, e.g. [$__rate_interval].
RANGE = r"\[[^\]]*\]"


def exported_series() -> dict[str, set[str]]:
    """Every sample name metrics.py exports, with the label names its samples carry."""
    series: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(METRICS_MODULE.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        kind = node.func.id
        if kind not in {"Counter", "Gauge", "Histogram", "Summary"}:
            continue
        name = ast.literal_eval(node.args[0])
        label_node = (
            node.args[2]
            if len(node.args) > 2
            else next((keyword.value for keyword in node.keywords if keyword.arg == "labelnames"), None)
        )
        labels = set(ast.literal_eval(label_node)) if label_node is not None else set()
        if kind == "Counter":
            base = name.removesuffix("_total")
            samples = {f"{base}_total": labels, f"{base}_created": labels}
        elif kind == "Gauge":
            samples = {name: labels}
        else:
            samples = {f"{name}_sum": labels, f"{name}_count": labels, f"{name}_created": labels}
            if kind == "Histogram":
                samples[f"{name}_bucket"] = labels | {"le"}
        series.update(samples)
    return series


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(board: dict[str, Any]) -> Iterator[str]:
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield target["expr"]


def variable_queries(board: dict[str, Any]) -> Iterator[str]:
    """The series selectors of the query variables: `label_values(SELECTOR, label)`."""
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
            assert match, f"variable {variable['name']}: {query}"
            yield match.group(1)


def references(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """(each metric named in `expr` with the labels its matchers name, the labels its grouping clauses name).

    Raises AssertionError for an identifier that is neither a known function, a keyword nor a metric.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    grouping = {label.strip() for labels in re.findall(GROUPING, text) for label in labels.split(",")}
    grouping.discard("")
    text = re.sub(GROUPING, " ", text)
    text = re.sub(RANGE, " ", text)
    metrics: list[tuple[str, set[str]]] = []
    for name, matchers in re.findall(MATCHERS, text):
        assert name, f"a selector without a metric name in {expr!r}"
        metrics.append((name, set(re.findall(LABEL_IN_MATCHER, matchers))))
    text = re.sub(MATCHERS, lambda match: f" {match.group(1)} ", text)
    named = {name for name, _ in metrics}
    for match in re.finditer(IDENTIFIER, text):
        word = match.group(0)
        if re.match(r"\s*\(", text[match.end() :]):
            assert word in FUNCTIONS, f"unknown function {word} in {expr!r}"
        elif word not in KEYWORDS and word not in named:
            metrics.append((word, set()))
            named.add(word)
    return metrics, grouping


def test_dashboard_is_an_importable_grafana_dashboard() -> None:
    board = dashboard()
    assert board["title"] and board["uid"] and isinstance(board["schemaVersion"], int)
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {variable["name"] for variable in board["templating"]["list"]}
    assert "datasource" in variables, "the dashboard asks for its Prometheus data source on import"
    for panel in panels(board):
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys(), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"{panel['title']}: no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval", "__range", "__interval"}
            assert used <= variables, f"{panel['title']}: undefined variables {used - variables}"


def test_metrics_module_defines_the_series_the_test_reads() -> None:
    series = exported_series()
    assert "stoker_startup_total_seconds_bucket" in series
    assert series["stoker_startup_expected_seconds"] == {"namespace", "name", "phase"}
    assert "stoker_reconcile_total" in series


@pytest.mark.parametrize("expr", [*expressions(dashboard()), *variable_queries(dashboard())])
def test_every_query_names_only_exported_metrics_and_their_labels(expr: str) -> None:
    series = exported_series()
    metrics, grouping = references(expr)
    assert metrics, f"no metric in {expr!r}"
    available: set[str] = set()
    for name, labels in metrics:
        assert name in series, f"{name} is not a metric of src/stoker/controller/metrics.py ({expr!r})"
        assert labels <= series[name], f"{name} has no label {labels - series[name]} ({expr!r})"
        available |= series[name]
    assert grouping <= available, f"grouping by labels no metric carries: {grouping - available} ({expr!r})"


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("sum by (phase) (rate(stoker_startup_phases_seconds_sum[5m]))", "not a metric"),
        ('stoker_startup_expected_seconds{service="a"}', "has no label"),
        ("sum by (pod) (rate(stoker_reconcile_total[5m]))", "grouping by labels"),
        ("histogram_quantile(0.5, rate(stoker_startup_total_seconds[5m]))", "not a metric"),
        ("frobnicate(stoker_reconcile_total)", "unknown function"),
    ],
)
def test_the_check_catches_what_would_leave_a_panel_empty(expr: str, problem: str) -> None:
    with pytest.raises(AssertionError, match=problem):
        test_every_query_names_only_exported_metrics_and_their_labels(expr)


def per_service_selectors(expr: str) -> Iterator[tuple[str, str]]:
    """(metric, its matchers) for each metric in `expr` whose samples name a VLLMService."""
    series = exported_series()
    for name, matchers in re.findall(MATCHERS, expr):
        if "namespace" in series.get(name, set()):
            yield name, matchers
    for name, _ in references(expr)[0]:
        if "namespace" in series[name]:
            assert re.search(rf"{name}\s*\{{", expr), f"{name} without the dashboard's variables ({expr!r})"


@pytest.mark.parametrize("expr", list(expressions(dashboard())))
def test_every_per_service_query_follows_the_namespace_and_service_variables(expr: str) -> None:
    """A panel of a per-service metric that ignored the Namespace and VLLMService pickers would show every
    service's data under a selection of one."""
    series = exported_series()
    for name, matchers in per_service_selectors(expr):
        assert 'namespace=~"$namespace"' in matchers, f"{name} ignores $namespace ({expr!r})"
        service_label = "name" if "name" in series[name] else "service"
        assert f'{service_label}=~"$name"' in matchers, f"{name} ignores $name ({expr!r})"


@pytest.mark.parametrize(
    "expr",
    [
        "histogram_quantile(0.5, sum by (le) (rate(stoker_startup_total_seconds_bucket[5m])))",
        'stoker_node_warming_nodes{namespace=~"$namespace"}',
    ],
)
def test_the_variables_check_catches_a_panel_that_ignores_them(expr: str) -> None:
    with pytest.raises(AssertionError, match=r"without the dashboard's variables|ignores \$name"):
        test_every_per_service_query_follows_the_namespace_and_service_variables(expr)


def test_node_warming_has_panels() -> None:
    queried = " ".join(expressions(dashboard()))
    assert "stoker_node_warming_wanted_bytes" in queried and "stoker_node_warming_nodes" in queried
