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
import json
import math
import sys
from pathlib import Path

from app.errors import UserError

# Beyond this many runs a line plot gets no legend (it would hide the plot).
LEGEND_MAX_RUNS = 12
REPORT_DIR = "report"
HEADERS = {"run_id": "run id", "steps_per_second": "steps/s", "final_kinetic_energy": "final KE (J)",
           "max_penetration": "max pen. (m)", "contacts_max": "contacts max"}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(f"report: {message} (usage: python run.py report DIR)")


def load_batch(out: Path) -> tuple[dict, list[dict]]:
    """summary.json and, per row, the run's metrics.json (``row["metrics"]``, {} when absent)."""
    if not out.is_dir():
        raise UserError(f"report: DIR {out}: no such directory")
    path = out / "summary.json"
    if not path.is_file():
        raise UserError(f"report: DIR {out}: no summary.json (expected the --out of python run.py batch)")
    try:
        summary = json.loads(path.read_text())
        rows = summary["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"report: {path}: not a batch summary ({type(e).__name__}: {e})") from None
    for row in rows:
        try:
            row["metrics"] = json.loads((out / row["run_id"] / "metrics.json").read_text())
        except (OSError, ValueError):
            row["metrics"] = {}
    return summary, rows


def frame_series(metrics: dict, *names) -> list[float] | None:
    """A per-frame series from metrics.json: the first of ``names`` that is a list (top level, or the
    ``per_frame`` entry of a dict)."""
    for name in names:
        v = metrics.get(name)
        if isinstance(v, dict):
            v = v.get("per_frame")
        if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
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


def plot_report(out: Path, rows: list[dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = out / REPORT_DIR
    report.mkdir(exist_ok=True)
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
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

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
            ax.bar([i + (j - 1) * width for i in range(len(ok))], [float(s.get(key) or 0) for s in stats],
                   width=width, label=key)
        ax.set_xticks(range(len(ok)), names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("contacts")
        ax.legend(fontsize=8)
        ax.set_title(f"Contacts per run ({len(ok)} ok runs)")
    fig.tight_layout()
    written.append(report / "contacts.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

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
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
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
    (out / REPORT_DIR / "summary.md").write_text(summary_markdown(summary, rows))
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a log file or pipe: do not squeeze the table into 80 columns
        console = Console(width=200)
    print_table(summary, rows, console)
    console.print(f"plots: {', '.join(str(w) for w in written)}", highlight=False)
    return 0
