"""The resumequal Grafana dashboard, built in code; the chart ships the JSON it writes.

    python tools/dashboard.py --write    # regenerate charts/resumequal/files/dashboard.json
    python tools/dashboard.py --check    # exit 1 when the committed JSON is stale

Every query selects the run series by the ``namespace`` and ``pin`` variables. Per-pin
verdicts judge the latest completed run of each pin in a namespace, as the alerts do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

OUTPUT = Path(__file__).resolve().parent.parent / "charts/resumequal/files/dashboard.json"
UID = "resumequal"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
RUNS = '{namespace=~"$namespace", pin=~"$pin"}'
# The latest completed run of each (namespace, pin), as the alerts' recording rule has it;
# inlined so the dashboard works without the PrometheusRule.
LATEST = (
    f"resumequal_last_completion_timestamp_seconds{RUNS}"
    " == on (namespace, pin) group_left () max by (namespace, pin) "
    f"(resumequal_last_completion_timestamp_seconds{RUNS})"
)
# A dashboard section: a row title and its panels.
Section = tuple[str, list[timeseries.Panel | stat.Panel | statetimeline.Panel]]
RUN_LEGEND = "{{pin}} · {{namespace}}/{{run}} · {{scenario}}"


def _query(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend or "__auto")
        .ref_id(ref)
        .datasource(DATASOURCE)
    )


def _series(
    title: str, description: str, queries: list[prometheus.Dataquery], unit: str, span: int = 12
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(8)
        .span(span)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
    )
    for q in queries:
        panel = panel.with_target(q)
    return panel


def _variables() -> list[Builder[model.VariableModel]]:
    datasource = dash.DatasourceVariable("datasource").label("Data source").type("prometheus")
    namespace = (
        dash.QueryVariable("namespace")
        .label("Namespace")
        .datasource(DATASOURCE)
        .query("label_values(resumequal_qualification_passed, namespace)")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    pin = (
        dash.QueryVariable("pin")
        .label("Pin")
        .datasource(DATASOURCE)
        .query('label_values(resumequal_qualification_passed{namespace=~"$namespace"}, pin)')
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    return [datasource, namespace, pin]


def _verdicts() -> Section:
    # passed + valid: PASS = 2, FAIL = 1, INVALID = 0 (min over the run's scenarios).
    verdict = (
        statetimeline.Panel()
        .title("Verdict of the latest run, by pin")
        .description(
            "PASS, FAIL or INVALID of the newest completed QualificationRun of each pin "
            "(the worst of its scenarios)."
        )
        .datasource(DATASOURCE)
        .with_target(
            _query(
                f"min by (namespace, pin) ((resumequal_qualification_passed{RUNS}"
                f" + resumequal_qualification_valid{RUNS})"
                f" and on (namespace, run, pin) ({LATEST}))",
                "{{pin}} ({{namespace}})",
            )
        )
        .mappings(
            [
                model.ValueMap(
                    options={
                        "2": model.ValueMappingResult(text="PASS", color="green", index=0),
                        "1": model.ValueMappingResult(text="FAIL", color="red", index=1),
                        "0": model.ValueMappingResult(text="INVALID", color="orange", index=2),
                    }
                )
            ]
        )
        .show_value(common.VisibilityMode.AUTO)
        .height(8)
        .span(16)
    )
    runs = (
        stat.Panel()
        .title("Runs by result (time range)")
        .description("Qualifications completed in the selected time range, by verdict.")
        .datasource(DATASOURCE)
        .with_target(
            _query("sum by (result) (increase(resumequal_runs_total[$__range]))", "{{result}}")
        )
        .unit("short")
        .decimals(0)
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .height(8)
        .span(8)
    )
    first = _series(
        "First divergent step",
        "Optimizer step of the first divergence between the control and the resumed leg; "
        "-1 when none.",
        [_query(f"resumequal_first_divergent_step{RUNS}", RUN_LEGEND)],
        "none",
        span=24,
    )
    return "Verdicts", [verdict, runs, first]


def _forensics() -> Section:
    tensors = _series(
        "Differing tensors at the first divergence",
        "How many tensors differ at the first divergent boundary (from the per-tensor "
        "digests): a few named tensors point at one module, nearly all at a reduction or "
        "the state.",
        [_query(f"resumequal_first_divergence_differing_tensors{RUNS}", RUN_LEGEND)],
        "none",
        span=12,
    )
    origin = (
        stat.Panel()
        .title("Where the divergence starts (resumequal zoom)")
        .description(
            "Per run that resumequal zoom replayed: the origin module or stage of the first "
            "divergence (module, reduction, clipping, optimizer, state). The run's "
            "report.html has the per-module table."
        )
        .datasource(DATASOURCE)
        .with_target(
            _query(
                f"max by (namespace, run, pin, origin_kind, origin) "
                f"(resumequal_zoom_origin_info{RUNS})",
                "{{pin}} · {{namespace}}/{{run}}: {{origin_kind}} {{origin}}",
            )
        )
        .text_mode(common.BigValueTextMode.NAME)
        .color_mode(common.BigValueColorMode.NONE)
        .graph_mode(common.BigValueGraphMode.NONE)
        .height(8)
        .span(12)
    )
    return "Forensics", [tensors, origin]


def _drift() -> Section:
    return (
        "Drift after resuming",
        [
            _series(
                "Parameters: max |a - b|",
                "Largest element-wise difference of the final model parameters.",
                [_query(f"resumequal_param_max_abs_diff{RUNS}", RUN_LEGEND)],
                "none",
            ),
            _series(
                "Parameters: relative L2",
                "||a - b|| / ||a|| of the final model parameters, and the alert threshold.",
                [
                    _query(f"resumequal_param_rel_l2_diff{RUNS}", RUN_LEGEND),
                    _query("resumequal:drift_threshold:param_rel_l2", "threshold", "B"),
                ],
                "none",
            ),
            _series(
                "Parameters: mismatch fraction",
                "Fraction of final model parameter elements whose bits differ.",
                [_query(f"resumequal_param_mismatch_fraction{RUNS}", RUN_LEGEND)],
                "percentunit",
            ),
            _series(
                "Loss: max |Δ|",
                "Largest per-step loss difference between the legs.",
                [_query(f"resumequal_loss_max_abs_diff{RUNS}", RUN_LEGEND)],
                "none",
            ),
        ],
    )


def _timing() -> Section:
    quantiles = [
        _query(
            f"histogram_quantile({q}, sum by (le, phase) "
            "(increase(resumequal_phase_duration_seconds_bucket[$__range])))",
            f"{{{{phase}}}} p{int(q * 100)}",
            ref,
        )
        for q, ref in ((0.5, "A"), (0.95, "B"))
    ]
    return (
        "Restart and phases",
        [
            _series(
                "Restart latency",
                "Seconds from the kill to the first resumed step.",
                [_query(f"resumequal_restart_seconds{RUNS}", RUN_LEGEND)],
                "s",
            ),
            _series(
                "Phase durations (p50, p95 over the time range)",
                "Time spent in each phase of a qualification.",
                quantiles,
                "s",
            ),
            _series(
                "Negative controls: detected vs total",
                "Planted resume omissions the comparator caught, against those it had to.",
                [
                    _query(
                        f"resumequal_negative_controls_detected{RUNS}",
                        "detected · {{pin}} · {{run}}",
                    ),
                    _query(
                        f"resumequal_negative_controls_total{RUNS}",
                        "total · {{pin}} · {{run}}",
                        "B",
                    ),
                ],
                "short",
                span=24,
            ),
        ],
    )


def _operator() -> Section:
    return (
        "Operator",
        [
            _series(
                "Reconciles and errors",
                "Reconciles per second by result, and failed reconciles.",
                [
                    _query(
                        "sum by (result) "
                        "(rate(resumequal_operator_reconcile_total[$__rate_interval]))",
                        "{{result}}",
                    ),
                    _query(
                        "sum by (pod) "
                        "(rate(resumequal_operator_reconcile_errors_total[$__rate_interval]))",
                        "errors · {{pod}}",
                        "B",
                    ),
                ],
                "ops",
                span=8,
            ),
            _series(
                "Work queue depth",
                "QualificationRuns waiting to be reconciled.",
                [_query("resumequal_operator_queue_depth", "{{pod}}")],
                "short",
                span=8,
            ),
            _series(
                "Reconcile duration and queue wait p95, leader",
                "95th percentile reconcile time; how long a changed run waited for a worker "
                "before it (the two add up to how late the operator acts on a change; "
                "listings and resyncs, at low priority, are not counted); and which replica "
                "leads.",
                [
                    _query(
                        "histogram_quantile(0.95, sum by (le, pod) (rate("
                        "resumequal_operator_reconcile_duration_seconds_bucket"
                        "[$__rate_interval])))",
                        "p95 · {{pod}}",
                    ),
                    _query(
                        "histogram_quantile(0.95, sum by (le, pod) (rate("
                        'resumequal_operator_queue_wait_seconds_bucket{priority="normal"}'
                        "[$__rate_interval])))",
                        "queue wait p95 · {{pod}}",
                        "C",
                    ),
                    _query("resumequal_operator_leader", "leader · {{pod}}", "B"),
                ],
                "s",
                span=8,
            ),
        ],
    )


def build() -> dict[str, object]:
    """The dashboard as the JSON object Grafana imports."""
    board = (
        dash.Dashboard("resumequal: resume qualification")
        .uid(UID)
        .description(
            "Verdicts, first divergence, drift, restart latency and controls of "
            "QualificationRuns, and the health of the resumequal operator."
        )
        .tags(["resumequal", "training", "preemption"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .time("now-7d", "now")
        .refresh("5m")
        .timezone("browser")
        .variables(_variables())
    )
    panel_id = 0
    for title, panels in (_verdicts(), _forensics(), _drift(), _timing(), _operator()):
        panel_id += 1
        board = board.with_row(dash.Row(title).collapsed(False).id(panel_id))
        for panel in panels:
            panel_id += 1
            board = board.with_panel(panel.id(panel_id))
    encoded: dict[str, object] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return encoded


def render() -> str:
    """The committed file's exact text."""
    return json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", action="store_true", help=f"write {OUTPUT.name}")
    group.add_argument("--check", action="store_true", help="fail when the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        OUTPUT.write_text(text, encoding="utf-8")
        return 0
    if OUTPUT.read_text(encoding="utf-8") != text:
        print(f"{OUTPUT} is stale: run python tools/dashboard.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
