#!/usr/bin/env python3
"""Plots of the emulated-cluster scaling runs (issue 29; docs/experiments.md, "Scaling on an
emulated cluster"): examples/s against workers, measured and as the planner predicted it, and
the scaling efficiency, from the JSON lines `scripts/scaling.sh` writes.

    python3 scripts/scaling_plots.py OUTDIR RUNS.jsonl [RUNS.jsonl ...] [--validation V.jsonl ...]

Writes OUTDIR/throughput.svg and OUTDIR/efficiency.svg: one curve per (mode, servers), the
planner's predictions (from the validation lines, when given) dashed beside the measurements.
"""
import json, os, sys

sys.path.insert(0, os.path.dirname(__file__))
from svgplot import COLORS  # noqa: E402


def plot(series, path, title, ylabel, yfmt):
    """series = [(label, [(x, y)], dashed)]; x = workers (1..), y from 0."""
    W, H, L, B, R = 680, 420, 80, 50, 190
    xs = [x for _, c, _ in series for x, _ in c]
    ys = [y for _, c, _ in series for _, y in c]
    x1, y1 = max(xs), max(ys) * 1.05
    sx = lambda x: L + (W - L - R) * (x - 1) / max(x1 - 1, 1)
    sy = lambda y: 20 + (H - B - 20) * (1 - y / y1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<text x="{(W - R + L) / 2}" y="14" text-anchor="middle">{title}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="20" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{(W - R + L) / 2}" y="{H - 12}" text-anchor="middle">workers</text>',
           f'<text x="14" y="{(H - B) / 2}" transform="rotate(-90 14 {(H - B) / 2})" text-anchor="middle">{ylabel}</text>']
    for x in sorted(set(xs)):
        out.append(f'<text x="{sx(x):.1f}" y="{H - B + 16}" text-anchor="middle">{x}</text>')
    for i in range(5):
        y = y1 * i / 4
        out.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{yfmt(y)}</text>')
        out.append(f'<line x1="{L}" y1="{sy(y):.1f}" x2="{W - R}" y2="{sy(y):.1f}" stroke="#ddd"/>')
    for i, (label, c, dashed) in enumerate(series):
        col = COLORS[(i // 2 if any(d for _, _, d in series) else i) % len(COLORS)]
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(c))
        dash = ' stroke-dasharray="5,4"' if dashed else ""
        out.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.8"{dash} points="{pts}"/>')
        for x, y in c:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{col}"/>')
        out.append(f'<text x="{W - R + 10}" y="{30 + 16 * i}" fill="{col}">{label}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    outdir, rest = argv[1], argv[2:]
    runs, val, into = [], [], None
    for a in rest:
        if a == "--validation":
            into = val
            continue
        (into if into is not None else runs).extend(json.loads(l) for l in open(a) if l.strip())
    os.makedirs(outdir, exist_ok=True)
    groups = {}
    for r in runs:
        groups.setdefault((r["mode"], r["servers"], r.get("cpu_per_node")), []).append(r)
    pred = {(v["mode"], v["servers"], v["workers"]): v["predicted"] for v in val}
    thr, eff = [], []
    for (mode, s, cpu), rs in sorted(groups.items()):
        name = f"{mode}, {s} servers" + (f", {cpu} core" if cpu not in (None, 0.1) else "")
        thr.append((name, [(r["workers"], r["examples_per_s"]) for r in rs], False))
        p = [(r["workers"], pred[(mode, s, r["workers"])]) for r in rs if (mode, s, r["workers"]) in pred]
        if val:
            thr.append((name + " (planner)", p, True))
        eff.append((name, [(r["workers"], r.get("efficiency", 1.0)) for r in rs], False))
    job = "train dnn (Downpour SGD)" if runs and runs[0].get("job") == "dnn" else "train linear (async SGD)"
    plot(thr, os.path.join(outdir, "throughput.svg"), f"{job} on emulated machines", "examples/s",
         lambda y: f"{y / 1000:.0f}k")
    plot(eff, os.path.join(outdir, "efficiency.svg"), "scaling efficiency (speed-up / workers; weak: rate / (W x rate at W=1))",
         "efficiency", lambda y: f"{y:.2f}")
    print(f"wrote {outdir}/throughput.svg and {outdir}/efficiency.svg")


if __name__ == "__main__":
    main(sys.argv)
