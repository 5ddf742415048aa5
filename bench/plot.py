"""Plots for bench/results/<name>.json, written next to them as <name>.svg.

    python bench/plot.py bench/results [proxies] [lock_vs_etcd] [scale] [tls]

Each value in the JSON is a Spread {median, min, max} over repetitions:
points and bars show the median, error bars the min-max range.
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402


def med(s):
    return s["median"]


def err(spreads):
    """Error bars (below, above) for a list of spreads."""
    return [[s["median"] - s["min"] for s in spreads], [s["max"] - s["median"] for s in spreads]]


def bars(ax, labels, spreads, title, ylabel):
    ax.bar(range(len(labels)), [med(s) for s in spreads], yerr=err(spreads), capsize=3, color="tab:blue")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)


def lines(ax, series, title, xlabel, ylabel, logx=False, logy=False):
    """series: {label: (xs, spreads)}"""
    for label, (xs, spreads) in series.items():
        ax.errorbar(xs, [med(s) for s in spreads], yerr=err(spreads), marker="o", capsize=3, label=label)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def proxies(r, fig):
    paths = r["paths"]
    names = [p["name"] for p in paths]
    axes = fig.subplots(2, 2)
    bars(axes[0][0], names, [p["rps"] for p in paths], f"closed loop, {r['connections']} connections", "requests/s")
    proxied = [p for p in paths if p["name"] != "straight"]
    bars(axes[0][1], [p["name"] for p in proxied], [p["cpu_per_1000"] for p in proxied],
         "proxy CPU per 1,000 requests (closed loop)", "CPU seconds")
    for ax, q in ((axes[1][0], "p50"), (axes[1][1], "p99")):
        lines(ax, {p["name"]: ([f["rate"] for f in p["fixed"]], [f[q] for f in p["fixed"]]) for p in paths},
              f"{q} at fixed rates (CO-corrected)", "requests/s", "µs", logy=True)


def lock_vs_etcd(r, fig):
    axes = fig.subplots(2, 2)
    systems = r["systems"]
    t = r["throughput"]
    lines(axes[0][0], {s: ([x["clients"] for x in t], [x[s] for x in t]) for s in systems},
          "acquire+release pairs/s", "clients", "pairs/s", logx=True, logy=True)
    latency = [(f"{s} {q}", r["latency_ms"][q][s]) for q in ("p50", "p99") for s in systems]
    loaded = [(f"{s} {q}, {r['live_leases']} live", r["loaded_latency_ms"][q][s])
              for q in ("p50", "p99") for s in systems if r["loaded_latency_ms"][q][s]]
    bars(axes[0][1], *zip(*(latency + loaded)), "1 client: acquire+release latency", "ms")
    bars(axes[1][0], list(systems), [r["keepalives_per_s"][s] for s in systems], "keepalives/s, 64 holders", "/s")
    failover = [(s, r["failover_ms"][s]) for s in systems if r["failover_ms"][s]]
    failover.append(("fencegate, old defaults (300-600 ms)", r["failover_old_defaults_ms"]["fencegate"]))
    bars(axes[1][1], *zip(*failover), "leader SIGKILL → next grant", "ms")


def scale(r, fig):
    axes = fig.subplots(2, 2)
    leases = r["leases"]
    live = [x["live"] for x in leases]
    lines(axes[0][0], {"fencegate": (live, [x["pairs_per_s"] for x in leases])},
          "acquire+release pairs/s (64 clients) vs live leases", "live leases", "pairs/s", logx=True)
    lines(axes[0][1], {"leader": (live, [x["leader_rss_mib"] for x in leases]),
                       "3 nodes": (live, [x["cluster_rss_mib"] for x in leases])},
          "memory vs live leases", "live leases", "RSS MiB", logx=True)
    sk = r["sidecar_keys"]
    keys = [x["keys"] for x in sk]
    lines(axes[1][0], {"sidecar (cached)": (keys, [x["rps"] for x in sk])},
          "sidecar requests/s vs distinct keys", "keys", "requests/s", logx=True)
    lines(axes[1][1], {"sidecar": (keys, [x["rss_mib"] for x in sk])},
          "sidecar memory vs distinct keys", "keys", "RSS MiB", logx=True)


def tls(r, fig):
    axes = fig.subplots(1, 2)
    systems = r["systems"]
    t = r["throughput"]
    lines(axes[0], {s: ([x["clients"] for x in t], [x[s] for x in t]) for s in systems},
          "acquire+release pairs/s", "clients", "pairs/s", logx=True)
    labels = [f"{s} {q}" for q in ("p50", "p99") for s in systems]
    bars(axes[1], labels, [r["latency_ms"][q][s] for q in ("p50", "p99") for s in systems],
         "1 client: acquire+release latency", "ms")


PLOTS = {"proxies": proxies, "lock_vs_etcd": lock_vs_etcd, "scale": scale, "tls": tls}


def main():
    out = Path(sys.argv[1])
    for name in sys.argv[2:] or PLOTS:
        path = out / f"{name}.json"
        if name not in PLOTS:
            print(f"no plot for {name}")
            continue
        if not path.exists():
            print(f"no {path}; skipped")
            continue
        fig = plt.figure(figsize=(12, 8), layout="constrained")
        PLOTS[name](json.loads(path.read_text()), fig)
        fig.savefig(out / f"{name}.svg")
        plt.close(fig)
        print(f"wrote {out / name}.svg")


if __name__ == "__main__":
    main()
