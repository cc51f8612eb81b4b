"""The GPU check's summary: one document, written as JSON, CSV, a markdown table and a log.

The document (``gpu_check.json``) is the run's ``meta`` (mode, start, git revision, machine,
versions and device) plus ``steps``: for each its name, what it runs, command, status, seconds,
budget, target, figures (``name``, ``value``, ``unit``, ``op``, ``bound``, ``met``, ``note``)
and the tail of its log. The CSV (one row per figure, a step without figures one row) and the
markdown table (what docs/kernels.md's GPU section holds) are made from it alone, so
``fill-doc`` can render the table again from a summary that came back from a lent machine.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

#: Statuses of a step that ran as it should (a missed target is reported, not a failure).
OK = ("passed", "parsed", "not available")
#: Columns of ``gpu_check.csv``.
FIELDS = "step status seconds budget_s figure value unit target met mode git_rev".split()
DOC_BEGIN, DOC_END = "<!-- gpu-check:begin -->", "<!-- gpu-check:end -->"
#: (title, width) of the printed table's columns.
COLUMNS = list(
    zip(
        ("step", "status", "time", "figure", "value", "target", "met"),
        (16, 22, 11, 46, 10, 9, 6),
        strict=True,
    )
)


def fmt_value(v: float | None, unit: str = "") -> str:
    """A figure for people: fractions as percentages, small numbers in g format."""
    if v is None:
        return "-"
    if unit == "" and 0 < abs(v) < 1 and v != int(v):
        return f"{v:.3g}" if abs(v) < 1e-2 else f"{v:.1%}"
    text = f"{v:.0f}" if v == int(v) and abs(v) < 1e6 else f"{v:.4g}"
    return text + (unit if unit == "x" else f" {unit}" if unit else "")


def fmt_met(met: bool | None) -> str:
    return "-" if met is None else "yes" if met else "MISSED"


def target_of(fig: dict) -> str:
    return f"{fig['op']} {fig['bound']:g}" if fig["op"] else ""


def figure_name(fig: dict) -> str:
    return fig["name"] + (f" ({fig['note']})" if fig["note"] else "")


def figure_rows(doc: dict) -> list[dict]:
    """The CSV's rows: one per figure, a step without figures one row."""
    rows = []
    for st in doc["steps"]:
        base = {k: st[k] for k in ("status", "budget_s")}
        base.update(
            step=st["name"],
            seconds=round(st["seconds"], 1),
            mode=doc["mode"],
            git_rev=doc["git_rev"],
        )
        for fig in st["figures"] or [None]:
            row = dict(base, figure="", value="", unit="", target="", met="")
            if fig is not None:
                row.update(figure=figure_name(fig), unit=fig["unit"], target=target_of(fig))
                row["value"] = "" if fig["value"] is None else fig["value"]
                row["met"] = "" if fig["met"] is None else fig["met"]
            rows.append(row)
    return rows


def table_lines(doc: dict) -> list[list[str]]:
    """Cells of the summary table (step, status, time, figure, value, target, met)."""
    lines = []
    for st in doc["steps"]:
        status = st["status"] + (f" ({st['detail']})" if st["detail"] else "")
        first = [st["name"], status, f"{st['seconds']:.0f} / {st['budget_s']} s"]
        for fig in st["figures"] or [None]:
            if fig is None:
                lines.append([*first, "", "", st["target"], ""])
            else:
                value = fmt_value(fig["value"], fig["unit"])
                lines.append([*first, figure_name(fig), value, target_of(fig), fmt_met(fig["met"])])
            first = ["", "", ""]
    return lines


def render_markdown(doc: dict) -> str:
    """The summary as a markdown table under one line naming device, versions and revision."""
    env = doc.get("env", {})
    head = (
        f"GPU check ({doc['mode']} run) of {doc['started']}: {env.get('device', 'no device')}, "
        f"torch {env.get('torch', '?')}, Triton {env.get('triton', '?')}, CUDA "
        f"{env.get('cuda', '?')}, git {doc['git_rev']}; {doc['wall_s']:.0f} s in all."
    )
    lines = [head, "", "| step | status | time / budget | figure | value | target | met |"]
    lines.append("|---|---|---:|---|---:|---|---|")
    for cells in table_lines(doc):
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def print_table(doc: dict) -> None:
    print("\n" + " ".join(f"{c:<{w}}" for c, w in COLUMNS))
    for cells in table_lines(doc):
        cells[1] = cells[1][: COLUMNS[1][1]]
        cells[3] = cells[3][: COLUMNS[3][1]]
        print(" ".join(f"{c:<{w}}" for c, (_, w) in zip(cells, COLUMNS, strict=True)).rstrip())


def write_summary(doc: dict, out: Path, logs: dict[str, str]) -> None:
    """Print the table; write ``out/gpu_check.{json,csv,md,log}`` (logs: step -> its output)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(doc, indent=1) + "\n")
    with open(out / "gpu_check.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(figure_rows(doc))
    with open(out / "gpu_check.log", "w") as f:
        for st in doc["steps"]:
            f.write(f"===== {st['name']}: {st['status']} {st['detail']}\n{logs[st['name']]}\n")
    (out / "gpu_check.md").write_text(render_markdown(doc))
    print_table(doc)


def fill_doc(summary: Path, doc: Path, allow_dry: bool = False) -> None:
    """Replace the text between the GPU markers of ``doc`` with the table of ``summary``.

    Raises:
        SystemExit: a dry run's summary (unless ``allow_dry``), or markers missing.
    """
    run = json.loads(summary.read_text())
    if run["mode"] != "gpu" and not allow_dry:
        raise SystemExit(f"{summary} is a {run['mode']} run: not a GPU result")
    text = doc.read_text()
    if text.count(DOC_BEGIN) != 1 or text.count(DOC_END) != 1:
        raise SystemExit(f"{doc}: needs one {DOC_BEGIN} and one {DOC_END}")
    head, rest = text.split(DOC_BEGIN)
    tail = rest.split(DOC_END)[1]
    doc.write_text(f"{head}{DOC_BEGIN}\n{render_markdown(run)}{DOC_END}{tail}")
    print(f"{doc}: GPU section filled from {summary}")
