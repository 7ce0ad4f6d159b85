"""PNG timelines: one lane per rank, F/B/W blocks, one panel per trace.

Panels share the time axis so two traces (plan and reality) read top to
bottom. Pillow draws; it is imported here only, so planning needs nothing
beyond the core packages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ppsim.fileio import write_bytes_atomic

COLOURS = {"F": (76, 120, 168), "B": (84, 162, 75), "W": (238, 202, 59), "C": (196, 52, 52),
           "D": (230, 140, 30), "R": (148, 103, 189), "S": (140, 86, 75)}
"""F/B/W ops, collectives (C inside the ops, D the step's data-parallel ones), and the
step's tail: R what the data-parallel reduce and gather expose, S the optimizer step."""
LEGEND = {"F": "forward", "B": "backward (input gradient, and the weights' without W)",
          "W": "weight gradient", "C": "collective inside an op (strip)",
          "D": "step's data-parallel collective (strip)",
          "R": "step's reduce/gather left exposed", "S": "optimizer step"}
"""What each colour is, named under the time axis for the kinds a picture draws."""
COLLECTIVE, STEP_COLLECTIVE = "C", "D"
STRIPS = (COLLECTIVE, STEP_COLLECTIVE)
"""Collectives: strips along the lane's foot, under the blocks of the ops they run in or
beside."""
STRIP_H = 5
Lane = Sequence[tuple[float, float, str, int]]
"""(start ms, duration ms, kind, microbatch) per op; microbatch -1 for the step's R and S."""


def render_png(panels: Sequence[tuple[str, Sequence[Lane]]], path: str, title: str = "",
               width: int = 1400) -> None:
    """Draw panels of lanes to a PNG, written atomically; `title` may run to several lines."""
    import io

    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default()
    lane_h, gap, left = 22, 4, 70
    top = 14 + 16 * (title.count("\n") + 1)
    panel_head = 20
    end = max((s + d for _, lanes in panels for lane in lanes for s, d, _, _ in lane),
              default=1.0) or 1.0
    drawn = {kind for _, lanes in panels for lane in lanes for _, _, kind, _ in lane}
    legend = _legend_rows([k for k in COLOURS if k in drawn], font, width - 20)
    height = (top + sum(panel_head + len(lanes) * (lane_h + gap) + 14 for _, lanes in panels)
              + 30 + 16 * len(legend) + (8 if legend else 0))
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    scale = (width - left - 20) / end
    draw.multiline_text((10, 8), title, fill="black", font=font, spacing=4)
    y = top
    for label, lanes in panels:
        draw.text((10, y), label, fill="black", font=font)
        y += panel_head
        for r, lane in enumerate(lanes):
            draw.text((10, y + 5), f"rank {r}", fill=(90, 90, 90), font=font)
            draw.rectangle([left, y, width - 20, y + lane_h], fill=(245, 245, 245))
            for s, d, kind, mb in sorted(lane, key=lambda op: op[2] in STRIPS):
                x0 = left + s * scale
                x1 = max(x0 + 1, left + (s + d) * scale - 1)
                y0 = y + lane_h - STRIP_H if kind in STRIPS else y
                draw.rectangle([x0, y0, x1, y + lane_h], fill=COLOURS.get(kind, (150, 150, 150)))
                label = f"{kind}{mb}" if mb >= 0 else kind
                # only a label the block holds whole: the next block would cut one short
                # (B12 read as B1)
                if kind not in STRIPS and font.getlength(label) + 3 <= x1 - x0:
                    draw.text((x0 + 2, y + 5), label, fill="white", font=font)
            y += lane_h + gap
        y += 14
    # Time axis with five ticks.
    for i in range(6):
        t = end * i / 5
        x = left + t * scale
        draw.line([x, y, x, y + 5], fill="black")
        draw.text((min(x - 10, width - 70), y + 8), f"{t:.1f} ms", fill="black", font=font)
    _draw_legend(draw, legend, y + 30, font)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    write_bytes_atomic(path, buf.getvalue())


def _legend_rows(kinds: Sequence[str], font: Any, width: int) -> list[list[tuple[str, int]]]:
    """The legend's entries (kind, x) in rows that fit `width` pixels."""
    rows: list[list[tuple[str, int]]] = [[]]
    x = 10
    for kind in kinds:
        w = 14 + int(font.getlength(LEGEND[kind])) + 18
        if rows[-1] and x + w > width:
            rows.append([])
            x = 10
        rows[-1].append((kind, x))
        x += w
    return rows if rows[0] else []


def _draw_legend(draw: Any, rows: list[list[tuple[str, int]]], y: int, font: Any) -> None:
    """A swatch of each kind's colour and what it is, one row of entries under another."""
    for row in rows:
        for kind, x in row:
            draw.rectangle([x, y + 1, x + 9, y + 10], fill=COLOURS[kind])
            draw.text((x + 14, y), LEGEND[kind], fill="black", font=font)
        y += 16
