#!/usr/bin/env python3
"""Draws the README's picture from figures already measured in docs/benchmarks.md.

Reads the table under "### Cache pressure (shared prefixes, engines at real speed)" (the peer
comparison made with scripts/peer-compare.sh: kvroute, the SGLang router and vLLM's router in
turn in front of the same four simulated engines, `kvroute engine`) and writes an SVG with two
panels: TTFT p90 and SLO attainment per router, both rounds. Nothing is measured here and no
figure is typed in: change the table and rerun, and `--check` (CI) fails when the committed
SVG is not what the table draws.

    python3 scripts/readme-chart.py            # writes docs/img/peers-cache-pressure.svg
    python3 scripts/readme-chart.py --check    # exit 1 if the file is stale
"""

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "docs" / "benchmarks.md"
OUT = ROOT / "docs" / "img" / "peers-cache-pressure.svg"
HEADING = "### Cache pressure (shared prefixes, engines at real speed)"
# Column prefix in the table -> the name shown on the chart.
ROUTERS = [
    ("kv_aware", "kvroute (kv_aware)"),
    ("sglang", "SGLang router"),
    ("vllm", "vLLM router"),
    ("least_request", "least request"),
]
COLOURS = {"r1": "#2b6cb0", "r2": "#90cdf4"}
KVROUTE_COLOURS = {"r1": "#c05621", "r2": "#fbd38d"}


def table(text: str) -> dict:
    """The first markdown table after HEADING, as {metric: {column: float}}."""
    after = text.split(HEADING, 1)
    if len(after) != 2:
        sys.exit(f"{SOURCE}: heading not found: {HEADING!r}")
    lines = []
    for line in after[1].splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for line in lines[2:]:
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        values = {}
        for col, cell in zip(header[1:], cells[1:]):
            try:
                values[col] = float(cell)
            except ValueError:
                pass
        out[cells[0]] = values
    return out


def panel(x0, title, metric, unit, data, width, height):
    """One bar panel: a bar per router and round."""
    values = [data[metric][f"{key} {r}"] for key, _ in ROUTERS for r in ("r1", "r2")]
    top = max(values) * 1.15
    plot_h = height - 90
    base = 40 + plot_h
    group_w = width / len(ROUTERS)
    bar_w = group_w * 0.32
    parts = [
        f'<text x="{x0 + width / 2:.1f}" y="22" text-anchor="middle" '
        f'font-weight="bold">{title}</text>',
        f'<line x1="{x0}" y1="{base}" x2="{x0 + width}" y2="{base}" stroke="#444"/>',
    ]
    for i, (key, name) in enumerate(ROUTERS):
        colours = KVROUTE_COLOURS if key == "kv_aware" else COLOURS
        for j, r in enumerate(("r1", "r2")):
            v = data[metric][f"{key} {r}"]
            h = plot_h * v / top
            x = x0 + i * group_w + group_w / 2 - bar_w + j * bar_w
            parts.append(
                f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{bar_w - 2:.1f}" '
                f'height="{h:.1f}" fill="{colours[r]}"><title>{name} round {r[1]}: '
                f"{v:g} {unit}</title></rect>"
            )
            parts.append(
                f'<text x="{x + bar_w / 2 - 1:.1f}" y="{base - h - 4:.1f}" '
                f'text-anchor="middle" font-size="10">{v:g}</text>'
            )
        parts.append(
            f'<text x="{x0 + i * group_w + group_w / 2:.1f}" y="{base + 16}" '
            f'text-anchor="middle" font-size="11">{name}</text>'
        )
    return parts


def svg(data: dict) -> str:
    width, height, pw = 860, 300, 400
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    parts += panel(20, "TTFT p90 (ms), lower is better", "TTFT p90 (ms)", "ms", data, pw, height)
    parts += panel(
        440, "SLO attainment (%), higher is better", "SLO attainment (%)", "%", data, pw, height
    )
    parts.append(
        f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle" font-size="11" '
        'fill="#444">Two rounds each (dark: 1, light: 2); four simulated engines '
        "(kvroute engine), 400 requests, 32 shared 4,096-token prefixes; docs/benchmarks.md"
        "</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the SVG is stale")
    args = ap.parse_args()
    drawn = svg(table(SOURCE.read_text()))
    if args.check:
        if not OUT.exists() or OUT.read_text() != drawn:
            print(f"{OUT.relative_to(ROOT)} is stale: run python3 scripts/readme-chart.py")
            return 1
        return 0
    OUT.write_text(drawn)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
