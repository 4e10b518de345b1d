"""A small dependency-free SVG line plot for the experiment scripts."""

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]


def line_plot(curves, path, title, xlabel, lo, hi, yfmt, legend="top"):
    """curves = {label: [(x, y)]}, x from 0; y clamped to [lo, hi], labelled with yfmt."""
    W, H, L, B = 640, 400, 70, 40
    t1 = max(p[0] for c in curves.values() for p in c)
    sx = lambda t: L + (W - L - 20) * t / t1
    sy = lambda y: 20 + (H - B - 20) * (1 - (min(max(y, lo), hi) - lo) / max(hi - lo, 1e-12))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<text x="{W/2}" y="14" text-anchor="middle">{title}</text>',
           f'<line x1="{L}" y1="{H-B}" x2="{W-20}" y2="{H-B}" stroke="black"/><line x1="{L}" y1="20" x2="{L}" y2="{H-B}" stroke="black"/>',
           f'<text x="{W/2}" y="{H-8}" text-anchor="middle">{xlabel} (0 to {t1:.1f})</text>',
           f'<text x="4" y="28">{yfmt(hi)}</text><text x="4" y="{H-B}">{yfmt(lo)}</text>']
    for i, (label, c) in enumerate(curves.items()):
        col = COLORS[i % len(COLORS)]
        ly = 40 + 16 * i if legend == "top" else H - B - 20 - 16 * i
        out.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.5" points="{" ".join(f"{sx(t):.1f},{sy(y):.1f}" for t, y in c)}"/>')
        out.append(f'<text x="{W-150}" y="{ly}" fill="{col}">{label}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out))
