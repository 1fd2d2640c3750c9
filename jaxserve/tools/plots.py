"""PNG plots for the benchmark and eval reports (matplotlib on the Agg backend, no display).

Inputs are the JSON-ready dicts the tools write, so a plot can be redrawn from a saved result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _cdf(ax, values_ms: Sequence[float], label: str) -> None:
  values = np.sort(np.asarray(values_ms, dtype=np.float64))
  if values.size == 0:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
  else:
    ax.step(values, np.arange(1, values.size + 1) / values.size, where="post")
    for q, style in ((50, ":"), (99, "--")):  # the p50 and p99 marks
      mark = float(np.percentile(values, q))
      ax.axvline(
        mark,
        color="tab:red" if q == 99 else "tab:gray",
        linestyle=style,
        label=f"p{q} {mark:.1f} ms",
      )
    ax.legend(loc="lower right", fontsize=8)
  ax.set_xlabel(f"{label} (ms)")
  ax.set_ylabel("fraction of samples")
  ax.grid(True, alpha=0.3)


def latency_cdfs(requests: Sequence[Mapping], path: Path, title: str = "") -> Path:
  """Empirical CDFs of TTFT, TPOT, ITL and E2E latency over the successful requests, each with
  its p50 and p99 marked; `title` names the workload."""
  done = [r for r in requests if r["success"]]
  ttft = [1e3 * r["ttft"] for r in done]
  e2e = [1e3 * r["e2e"] for r in done]
  tpot = [
    1e3 * (r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1) for r in done if r["output_tokens"] > 1
  ]
  itl = [1e3 * gap for r in done for gap in r["itls"]]
  fig, axes = plt.subplots(2, 2, figsize=(10, 7))
  for ax, values, label in zip(
    axes.flat, (ttft, tpot, itl, e2e), ("TTFT", "TPOT", "ITL", "E2E"), strict=True
  ):
    _cdf(ax, values, label)
    ax.set_title(label)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return Path(path)


def sweep_curve(runs: Sequence[Mapping], path: Path, title: str = "") -> Path:
  """Output token throughput against median / p99 TTFT and TPOT, one point per request rate."""
  return sweep_curves({"": runs}, path, title)


def sweep_curves(series: Mapping[str, Sequence[Mapping]], path: Path, title: str = "") -> Path:
  """sweep_curve for several servers on the same axes, one colour per server (its label)."""
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
  for ax, key, label in zip(axes, ("ttft", "tpot"), ("TTFT", "TPOT"), strict=True):
    # four colours: a fifth server and more are left out
    for (name, runs), color in zip(series.items(), ("C0", "C1", "C2", "C3"), strict=False):
      throughput = [run["metrics"]["output_throughput"] for run in runs]
      for stat, style in (("median_ms", "o-"), ("p99", "s--")):
        values = [
          run["metrics"][key][stat]
          if stat == "median_ms"
          else run["metrics"][key]["percentiles_ms"]["p99"]
          for run in runs
        ]
        which = "median" if stat == "median_ms" else "p99"
        ax.plot(throughput, values, style, color=color, label=f"{name} {which}".strip())
        for x, y, run in zip(throughput, values, runs, strict=True):
          ax.annotate(
            f"{run['request_rate']}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8
          )
    ax.set_xlabel("output throughput (tok/s)")
    ax.set_ylabel(f"{label} (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend()
  fig.suptitle(f"{title} (points labelled with request rate)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return Path(path)


def metric_bars(scores: Mapping[str, float], path: Path, title: str = "", ylabel: str = "") -> Path:
  """One bar per named score (e.g. accuracy per task)."""
  names = list(scores)
  fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(names) + 2), 4))
  ax.bar(names, [scores[n] for n in names])
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.tick_params(axis="x", rotation=30)
  ax.grid(True, axis="y", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return Path(path)


def soak_timeline(series: Mapping[str, Sequence[Mapping]], path: Path, title: str = "") -> Path:
  """`jaxserve bench soak`'s rows (soak_report.window_rows) against time, one line per soak:
  output tokens/s, TPOT p50 / p99, TTFT p99, device memory and RSS; windows after the load
  stopped (the drain) are left out, windows with an API server kill marked."""
  fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
  (tput, tpot), (ttft, memory) = axes
  for name, rows in series.items():
    rows = [r for r in rows if not r["drain"]]
    minutes = [r["window"] + 0.5 for r in rows]

    def line(ax, key, scale=1.0, style="-", label=name, rows=rows, minutes=minutes):
      values = [np.nan if r.get(key) is None else r[key] * scale for r in rows]
      return ax.plot(minutes, values, style, marker=".", label=label)[0]

    color = line(tput, "tokens_per_s").get_color()
    for ax, key in ((tpot, "tpot_p50"), (tpot, "tpot_p99"), (ttft, "ttft_p99")):
      style = "--" if key.endswith("p99") and ax is tpot else "-"
      line(ax, key, 1e3, style, f"{name} {key[-3:]}").set_color(color)
    line(memory, "device_mib", 1 / 1024, "-", f"{name} device").set_color(color)
    line(memory, "rss_mib", 1 / 1024, ":", f"{name} RSS").set_color(color)
    for r in rows:
      if r["kills"]:
        tput.axvline(r["window"] + 0.5, color=color, alpha=0.15, linewidth=6)
  labels = (
    (tput, "output tokens/s (shaded: a window with an API server kill)"),
    (tpot, "TPOT (ms), p50 solid, p99 dashed"),
    (ttft, "TTFT p99 (ms)"),
    (memory, "GiB: device memory held (solid), server RSS (dotted)"),
  )
  for ax, label in labels:
    ax.set_title(label, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  for ax in axes[1]:
    ax.set_xlabel("minute of the soak")
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return Path(path)
