"""Per-request timelines in the report: one bar per request, its phases side by side
(servesim/timeline.py: queued, prefill, decode; preemptions marked)."""

from __future__ import annotations

import numpy as np

from servesim.plots import style
from servesim.timeline import request_timelines

COLORS = {"queued": "#bbbbbb", "prefill": style.PREFILL, "decode": style.DECODE, "preempted": "#CC79A7"}
MAX_SHOWN = 40  # bars that stay legible in one figure


def shown_requests(requests, limit: int = MAX_SHOWN) -> list[str]:
    """The requests worth a look first: the most preempted and the slowest (by E2E), then evenly
    spaced others in arrival order, up to `limit`; deterministic."""
    frame = requests.sort_values("arrival_s", kind="stable")
    ids = frame["request_id"].tolist()
    picked: list[str] = []
    worst = frame.sort_values(["num_preemptions", "e2e_s"], ascending=False, kind="stable")
    for rid in worst["request_id"].tolist()[: limit // 4]:
        picked.append(rid)
    step = max(1, len(ids) // max(1, limit - len(picked)))
    for rid in ids[::step]:
        if len(picked) >= limit:
            break
        if rid not in picked:
            picked.append(rid)
    return sorted(picked, key=ids.index)


def request_gantt(res, step_records=None, limit: int = MAX_SHOWN, title: str = "Request timelines"):
    """A sample of requests (shown_requests) as bars: queued, prefill, decode (and, with the step
    trace, each chunk and preemption); a request's preemption count is written beside its bar."""
    ids = shown_requests(res.requests, limit)
    spans = request_timelines(res.requests, res.steps, step_records, request_ids=ids)
    preempted = dict(zip(res.requests["request_id"], res.requests["num_preemptions"]))
    fig = style.figure(11, 1.2 + 0.16 * max(len(ids), 1))
    ax = fig.add_subplot()
    if not ids:
        style.note(ax, "no requests")
        return fig
    for y, rid in enumerate(ids):
        for span in spans[rid]:
            if span.kind in COLORS and span.end_s > span.start_s:
                ax.barh(y, span.end_s - span.start_s, left=span.start_s, height=0.7, color=COLORS[span.kind], lw=0)
        end = spans[rid][-1].end_s
        if preempted.get(rid):
            ax.text(end, y, f"  {int(preempted[rid])}x preempted", va="center", fontsize=7, color=COLORS["preempted"])
        elif spans[rid][-1].kind != "finished":
            ax.text(end, y, f"  {spans[rid][-1].kind}", va="center", fontsize=7)
    ax.set_yticks(np.arange(len(ids)), ids, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (s)")
    handles = [ax.barh(0, 0, color=c, label=k) for k, c in COLORS.items()]
    ax.legend(handles=handles, loc="lower right", ncols=4, frameon=False)
    ax.set_title(title)
    return fig
