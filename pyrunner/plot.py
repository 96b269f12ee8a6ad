"""plot.py — `strata plot TRACE -o out.png`: the timeline of seed 000's investigation from a `--trace` file.

Panels share one time axis (seconds from the trace's start); request boundaries are drawn on every
panel. From the top:
  routing    experts routed per layer over time (layer x time, colour: distinct experts of the
             layer's MoE step), cache admits and swaps as markers (the cache map changing)
  cache      hit rate per sample interval, and experts resident on the device
  memory     process RSS and device memory held by resident experts
  busy       CPU busy (thread-pool tasks, all workers) and device busy (sim compute / copies), as
             shares of each bin; model-thread waits (merge, PLE handshake) on top
  storage    process storage reads (read_bytes of /proc/self/io) and major faults per second
and below them a per-request summary table (also printed by `strata plot`).
Rendering uses matplotlib's Agg backend (no display needed).
"""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np


class PlotError(Exception):
    pass


def load(path: str) -> dict:
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise PlotError(f"{path}: cannot read a trace ({e})") from None
    if not isinstance(d, dict) or not isinstance(d.get("traceEvents"), list):
        raise PlotError(f"{path}: not a Chrome trace (no traceEvents list); write one with --trace")
    return d


def requests(events: list[dict]) -> list[dict]:
    """Per request: start/end (s) and its stats, from the "request" spans."""
    out = []
    for e in events:
        if e.get("cat") == "request" and e.get("ph") == "X":
            a = e.get("args", {})
            out.append({"t0": e["ts"] / 1e6, "t1": (e["ts"] + e["dur"]) / 1e6, "request": a.get("request"),
                        "finish_reason": a.get("finish_reason"), "stats": a.get("stats", {}),
                        "error": a.get("error")})
    return sorted(out, key=lambda r: r["t0"])


SUMMARY_COLUMNS = ("request", "prompt", "generated", "prefill s", "decode tok/s", "hit rate", "PCIe MB",
                   "drafts acc/prop", "PLE wait s", "finish")


def summary_rows(reqs: list[dict]) -> list[list[str]]:
    rows = []
    for r in reqs:
        s = r["stats"]
        rows.append([str(r["request"]), str(s.get("prompt_tokens", "")), str(s.get("generated_tokens", "")),
                     f"{s['prefill_s']:.3f}" if "prefill_s" in s else "-",
                     f"{s['decode_tps']:.1f}" if "decode_tps" in s else "-",
                     f"{100 * s['hit_rate']:.1f} %" if "hit_rate" in s else "-",
                     f"{s['pcie_bytes'] / 1e6:.2f}" if "pcie_bytes" in s else "-",
                     f"{s['drafts_accepted']}/{s['drafts_proposed']}" if "drafts_proposed" in s else "-",
                     f"{s['ple_wait_s']:.3f}" if "ple_wait_s" in s else "-",
                     str(r["finish_reason"])])
    return rows


def format_summary(reqs: list[dict]) -> str:
    rows = [list(SUMMARY_COLUMNS)] + summary_rows(reqs)
    widths = [max(len(r[i]) for r in rows) for i in range(len(SUMMARY_COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


def _counter(events, name):
    """(times s, {series: values}) of a counter."""
    ts, series = [], defaultdict(list)
    for e in events:
        if e.get("ph") == "C" and e.get("name") == name:
            ts.append(e["ts"] / 1e6)
            for k, v in e.get("args", {}).items():
                series[k].append(v)
    return np.asarray(ts), {k: np.asarray(v, dtype=float) for k, v in series.items()}


def _busy(spans, edges):
    """Busy seconds per bin of the union... summed over spans (several threads add up)."""
    busy = np.zeros(len(edges) - 1)
    for t0, t1 in spans:
        i0 = max(0, int(np.searchsorted(edges, t0, "right")) - 1)
        i1 = min(len(busy) - 1, int(np.searchsorted(edges, t1, "right")) - 1)
        for i in range(i0, i1 + 1):
            lo, hi = max(t0, edges[i]), min(t1, edges[i + 1])
            if hi > lo:
                busy[i] += hi - lo
    return busy


def render(trace_path: str, out_path: str, bins: int = 200) -> dict:
    """Draws the timeline of trace_path to out_path (PNG); returns {"requests", "summary"}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = load(trace_path)
    ev = d["traceEvents"]
    spans = [e for e in ev if e.get("ph") == "X"]
    if not spans:
        raise PlotError(f"{trace_path}: the trace has no spans")
    t_end = max((e["ts"] + e.get("dur", 0)) for e in spans) / 1e6
    t_start = min(e["ts"] for e in spans) / 1e6
    if t_end <= t_start:
        t_end = t_start + 1e-3
    edges = np.linspace(t_start, t_end, bins + 1)
    width = edges[1] - edges[0]
    reqs = requests(ev)

    n_rows = len(reqs)
    fig = plt.figure(figsize=(14, 15 + 0.25 * min(n_rows, 40)))
    gs = fig.add_gridspec(6, 1, height_ratios=[3, 1.3, 1.3, 1.3, 1.3, 0.6 + 0.12 * min(n_rows, 40)])
    ax_route = fig.add_subplot(gs[0])
    axes = [ax_route] + [fig.add_subplot(gs[i], sharex=ax_route) for i in range(1, 5)]
    ax_cache, ax_mem, ax_busy, ax_io = axes[1:]
    ax_tab = fig.add_subplot(gs[5])
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)

    # routing: layer x time, distinct experts routed
    moe = [e for e in spans if e.get("cat") == "moe"]
    n_layer = 1 + max((e["args"].get("layer", 0) for e in moe), default=0)
    grid = np.full((n_layer, bins), np.nan)
    for e in moe:                 # every bin the layer's MoE step covers
        t0, t1 = e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6
        i0 = min(bins - 1, max(0, int((t0 - t_start) / width)))
        i1 = min(bins - 1, max(i0, int((t1 - t_start) / width)))
        li = e["args"].get("layer", 0)
        v = e["args"].get("experts", 0)
        cur = grid[li, i0:i1 + 1]
        grid[li, i0:i1 + 1] = np.where(np.isnan(cur), v, np.maximum(cur, v))
    im = ax_route.imshow(grid, aspect="auto", origin="lower", interpolation="nearest", cmap="viridis",
                         extent=(t_start, t_end, -0.5, n_layer - 0.5))
    cax = ax_route.inset_axes([1.005, 0.0, 0.01, 1.0])
    fig.colorbar(im, cax=cax, label="experts routed")
    for cat, colour, marker in (("cache_admit", "white", "^"), ("cache_swap", "red", "x")):
        pts = [(e["ts"] / 1e6, e["args"].get("layer", 0)) for e in ev if e.get("cat") == cat]
        if pts:
            ax_route.scatter(*zip(*pts), s=12, c=colour, marker=marker, label=cat.replace("_", " "))
    if any(e.get("cat") in ("cache_admit", "cache_swap") for e in ev):
        ax_route.legend(loc="upper right", fontsize=8)
    ax_route.set_ylabel("layer")
    ax_route.set_title(f"strata timeline: {trace_path}")

    # cache
    ts, c = _counter(ev, "cache")
    if len(ts) > 1:
        dh, dl = np.diff(c["hits"]), np.diff(c["lookups"])
        rate = np.where(dl > 0, dh / np.maximum(dl, 1), np.nan)
        ax_cache.step(ts[1:], 100 * rate, where="pre", label="hit rate %")
    ts_r, r = _counter(ev, "resident_total")
    ax_c2 = ax_cache.twinx()
    if len(ts_r):
        ax_c2.plot(ts_r, r["experts"], color="tab:orange", label="resident experts")
        ax_c2.set_ylabel("resident experts")
    ax_cache.set_ylabel("hit rate %")
    ax_cache.set_ylim(-5, 105)

    # memory
    ts, m = _counter(ev, "rss_mib")
    if len(ts):
        ax_mem.plot(ts, m["rss"], label="RSS MiB")
    if len(ts_r):
        ax_mem.plot(ts_r, r["bytes"] / 2**20, label="device: resident experts MiB")
    ts_p, p = _counter(ev, "ple_resident_pages")
    if len(ts_p):
        ax_mem.plot(ts_p, p["resident"] * 4096 / 2**20, label="PLE table in page cache MiB")
    ax_mem.set_ylabel("MiB")
    if ax_mem.get_legend_handles_labels()[0]:
        ax_mem.legend(loc="upper left", fontsize=8)

    # busy
    n_pool = len({e["tid"] for e in spans if e.get("cat") == "pool_task"}) or 1
    centers = (edges[:-1] + edges[1:]) / 2
    pool = _busy([(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in spans if e.get("cat") == "pool_task"], edges)
    comp = _busy([(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in spans if e.get("cat") == "dev_compute"], edges)
    copy = _busy([(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in spans if e.get("cat") == "dev_copy"], edges)
    waits = _busy([(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in spans
                   if e.get("cat") in ("merge_wait", "ple_wait")], edges)
    ax_busy.plot(centers, 100 * pool / width / n_pool, label=f"CPU pool tasks busy % ({n_pool} threads)")
    ax_busy.plot(centers, 100 * comp / width, label="device compute %")
    ax_busy.plot(centers, 100 * copy / width, label="device copies %")
    ax_busy.plot(centers, 100 * waits / width, label="model thread waiting %", linestyle=":")
    ax_busy.set_ylabel("busy %")
    ax_busy.set_ylim(-5, 105)
    ax_busy.legend(loc="upper left", fontsize=8)

    # storage
    ts, s = _counter(ev, "storage")
    if len(ts) > 1:
        dt = np.maximum(np.diff(ts), 1e-6)
        ax_io.step(ts[1:], np.diff(s["read_bytes"]) / dt / 1e6, where="pre", label="storage reads MB/s")
    ts_f, f = _counter(ev, "major_faults")
    if len(ts_f) > 1:
        ax_f = ax_io.twinx()
        ax_f.step(ts_f[1:], np.diff(f["major_faults"]) / np.maximum(np.diff(ts_f), 1e-6), where="pre",
                  color="tab:red", label="major faults/s")
        ax_f.set_ylabel("major faults/s")
    ax_io.set_ylabel("MB/s")
    ax_io.set_xlabel("seconds from the trace's start")
    if ax_io.get_legend_handles_labels()[0]:
        ax_io.legend(loc="upper left", fontsize=8)

    for ax in axes:
        for q in reqs:
            ax.axvspan(q["t0"], q["t1"], color="grey", alpha=0.06)
            ax.axvline(q["t0"], color="grey", lw=0.8, ls="--")
    for q in reqs:
        ax_route.text(q["t0"], n_layer - 0.5, f" req {q['request']}", va="top", fontsize=8, color="white")

    ax_tab.axis("off")
    rows = summary_rows(reqs)
    if rows:
        tab = ax_tab.table(cellText=rows[:40], colLabels=list(SUMMARY_COLUMNS), loc="center", cellLoc="center")
        tab.auto_set_font_size(False)
        tab.set_fontsize(8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=90)
    plt.close(fig)
    return {"requests": len(reqs), "summary": format_summary(reqs)}
