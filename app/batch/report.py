"""``python run.py report DIR``: plots and a table for a batch written by ``python run.py batch``.

Writes into DIR/report/ (matplotlib, Agg backend, no display needed):

- ``kinetic_energy.png``   kinetic energy per frame of every ok run (log scale when it spans decades)
- ``contacts.png``         contacts per frame when metrics.json has them, else max/mean/final per run
- ``steps_per_second.png`` steps/s per run (failed runs marked)
- ``summary.md``           the summary table as Markdown

and prints the summary table on the terminal. Exit code 0; 2 when DIR is not a batch directory.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from app.errors import UserError
from app.files import read_json_object, write_atomic, write_text_atomic

# Beyond this many runs a line plot gets no legend (it would hide the plot).
LEGEND_MAX_RUNS = 12
REPORT_DIR = "report"
HEADERS = {"run_id": "run id", "steps_per_second": "steps/s", "final_kinetic_energy": "final KE (J)",
           "max_penetration": "max pen. (m)", "contacts_max": "contacts max"}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(f"report: {message} (usage: python run.py report DIR)")


# The row fields the report reads as numbers; anything else there is shown as missing.
NUMERIC_FIELDS = ("seed", "steps_per_second", "final_kinetic_energy", "max_penetration", "contacts_max")


def load_batch(out: Path) -> tuple[dict, list[dict]]:
    """summary.json and, per row, the run's metrics.json (``row["metrics"]``, {} when absent or unreadable). Every
    field the report uses is checked: a summary that is not one is refused, stray values are shown as missing."""
    if not out.is_dir():
        raise UserError(f"report: DIR {out}: no such directory")
    path = out / "summary.json"
    if not path.exists():
        raise UserError(f"report: DIR {out}: no summary.json (expected the --out of python run.py batch)")
    try:
        summary = read_json_object(path)
    except (OSError, ValueError) as e:
        raise UserError(f"report: {path}: not a batch summary ({e})") from None
    rows = summary.get("rows")
    params = summary.get("parameters", [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise UserError(f"report: {path}: not a batch summary (expected 'rows', a list of objects)")
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise UserError(f"report: {path}: not a batch summary (expected 'parameters', a list of names)")
    for k, row in enumerate(rows):
        run_id = row.get("run_id")
        if not isinstance(run_id, str) or not run_id or run_id.startswith(".") or "/" in run_id or "\\" in run_id:
            raise UserError(f"report: {path}: rows[{k}].run_id: expected the name of a run directory, got "
                            f"{str(run_id)[:80]!r}")
        for key in NUMERIC_FIELDS:
            v = row.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                row[key] = None
        try:
            row["metrics"] = read_json_object(out / run_id / "metrics.json")
        except (OSError, ValueError):
            row["metrics"] = {}
    return summary, rows


def _number(v) -> float:
    """v as a finite float, 0 for anything else (a metrics file is data, not trusted to hold numbers)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0.0


def frame_series(metrics: dict, *names) -> list[float] | None:
    """A per-frame series from metrics.json: the first of ``names`` that is a list (top level, or the
    ``per_frame`` entry of a dict)."""
    for name in names:
        v = metrics.get(name)
        if isinstance(v, dict):
            v = v.get("per_frame")
        if isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                             and math.isfinite(x) for x in v):
            return [float(x) for x in v]
    return None


def frame_times(metrics: dict, n: int) -> tuple[list[float], str]:
    """x values for n frames: seconds of simulated time when metrics has sim_time, else frame numbers."""
    sim_time = metrics.get("sim_time")
    if isinstance(sim_time, (int, float)) and sim_time > 0:
        return [sim_time * (i + 1) / n for i in range(n)], "simulated time (s)"
    return list(range(1, n + 1)), "frame"


def _lines(ax, rows, key_names, ylabel):
    plotted = 0
    xlabel = "frame"
    for row in rows:
        series = frame_series(row["metrics"], *key_names)
        if series is None:
            continue
        x, xlabel = frame_times(row["metrics"], len(series))
        ax.plot(x, series, lw=1.0, alpha=0.9 if len(rows) <= LEGEND_MAX_RUNS else 0.4, label=row["run_id"])
        plotted += 1
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if 0 < plotted <= LEGEND_MAX_RUNS:
        ax.legend(fontsize=7, loc="best")
    return plotted


def _save(fig, path):
    import matplotlib.pyplot as plt

    write_atomic(path, lambda fh: fig.savefig(fh, format="png", dpi=110))
    plt.close(fig)


def plot_report(out: Path, rows: list[dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = out / REPORT_DIR
    try:
        report.mkdir(exist_ok=True)
    except OSError as e:
        raise UserError(f"report: {report}: cannot make the report directory ({e.strerror or e})") from None
    ok = [r for r in rows if r.get("status") == "ok"]
    written = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    n = _lines(ax, ok, ("kinetic_energy",), "kinetic energy (J)")
    values = [x for r in ok for x in (frame_series(r["metrics"], "kinetic_energy") or []) if x > 0]
    if values and max(values) / min(values) > 1e3:
        ax.set_yscale("log")
    ax.set_title(f"Kinetic energy ({n} ok runs)" if n else "Kinetic energy: no ok run has per-frame values")
    fig.tight_layout()
    written.append(report / "kinetic_energy.png")
    _save(fig, written[-1])

    fig, ax = plt.subplots(figsize=(8, 4.5))
    n = _lines(ax, ok, ("contacts_per_frame", "contact_count", "contacts"), "contacts")
    if n:
        ax.set_title(f"Contacts per frame ({n} ok runs)")
    else:  # metrics.json only has contacts {max, mean, final}: bars per run
        ax.clear()
        names = [r["run_id"] for r in ok]
        stats = [(r["metrics"].get("contacts") or {}) if isinstance(r["metrics"].get("contacts"), dict) else {} for r in ok]
        width = 0.27
        for j, key in enumerate(("max", "mean", "final")):
            ax.bar([i + (j - 1) * width for i in range(len(ok))], [_number(s.get(key)) for s in stats],
                   width=width, label=key)
        ax.set_xticks(range(len(ok)), names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("contacts")
        ax.legend(fontsize=8)
        ax.set_title(f"Contacts per run ({len(ok)} ok runs)")
    fig.tight_layout()
    written.append(report / "contacts.png")
    _save(fig, written[-1])

    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.22 * len(rows) + 1.2)))
    names = [r["run_id"] for r in rows]
    sps = [float(r.get("steps_per_second") or 0) if r.get("status") == "ok" else 0.0 for r in rows]
    colors = ["tab:blue" if r.get("status") == "ok" else "tab:red" for r in rows]
    ax.barh(range(len(rows)), sps, color=colors)
    ax.set_yticks(range(len(rows)), names, fontsize=7)
    ax.invert_yaxis()
    for i, r in enumerate(rows):
        if r.get("status") != "ok":
            ax.text(0, i, " failed", va="center", color="tab:red", fontsize=7)
    ax.set_xlabel("steps per second")
    ax.set_title("Steps per second per run")
    fig.tight_layout()
    written.append(report / "steps_per_second.png")
    _save(fig, written[-1])
    return written


def _cell(v, fmt=".4g"):
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return format(v, fmt) if math.isfinite(v) else str(v)
    return str(v)


def table_columns(summary: dict) -> list[str]:
    params = summary.get("parameters", [])
    return ["run_id", "seed", *params, "status", "steps_per_second", "final_kinetic_energy", "max_penetration",
            "contacts_max", "error"]


def summary_markdown(summary: dict, rows: list[dict]) -> str:
    cols = table_columns(summary)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c)).replace("|", "\\|") for c in cols) + " |")
    return "\n".join(lines) + "\n"


def print_table(summary: dict, rows: list[dict], console) -> None:
    from rich.markup import escape
    from rich.table import Table

    cols = table_columns(summary)
    ok = sum(r.get("status") == "ok" for r in rows)
    table = Table(title=f"{len(rows)} runs: {ok} ok, {len(rows) - ok} failed", show_lines=False)
    for c in cols:
        table.add_column(HEADERS.get(c, c), overflow="fold", no_wrap=c == "run_id",
                         justify="left" if c in ("run_id", "status", "error") else "right")
    for r in rows:
        cells = [escape(_cell(r.get(c))) for c in cols]
        status = cells[cols.index("status")]
        cells[cols.index("status")] = f"[green]{status}[/]" if status == "ok" else f"[red]{status}[/]"
        table.add_row(*cells)
    console.print(table)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _Parser(prog="run.py report", description="Plots and a table for a batch directory.")
    p.add_argument("dir", metavar="DIR", help="the --out directory of python run.py batch")
    args = p.parse_args(argv)
    out = Path(args.dir)
    summary, rows = load_batch(out)
    written = plot_report(out, rows)
    write_text_atomic(out / REPORT_DIR / "summary.md", summary_markdown(summary, rows))
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a log file or pipe: do not squeeze the table into 80 columns
        console = Console(width=200)
    print_table(summary, rows, console)
    console.print(f"plots: {', '.join(str(w) for w in written)}", highlight=False)
    return 0
