"""Tables (stdout and summary.md), JSON, PNG plots."""

from __future__ import annotations

import json
import math
import os
from collections import OrderedDict

from normkit.bench.cases import OPS, SHORT

SCHEMA = "normkit-bench/1"
DIR_LABEL = {("train", "fwd"): "fwd", ("train", "bwd"): "bwd", ("eval", "fwd"): "eval"}


def case_key(r: dict) -> tuple:
    return (r["op"], tuple(r["shape"]), r.get("groups"), r["dtype"], r["params"], r["layout"], r["mode"],
            r["direction"])


def shape_label(r: dict) -> str:
    s = "x".join(str(d) for d in r["shape"])
    return f"{s}/g{r['groups']}" if r.get("groups") else s


def dtype_label(r: dict) -> str:
    d, p = r["dtype"], r["params"]
    return SHORT[d] if d == p else f"{SHORT[d]}/{SHORT[p]}"


def layout_label(r: dict) -> str:
    if r["op"] in ("layer_norm", "rms_norm"):
        return "rows"
    nd = len(r["shape"])
    if r["layout"] == "channels_last":
        return {4: "NHWC", 5: "NDHWC"}.get(nd, "cl")
    return {2: "NC", 3: "NCL", 4: "NCHW", 5: "NCDHW"}.get(nd, "contig")


def grouped(rows) -> "OrderedDict":
    """case key -> {impl: row}, in run order."""
    g = OrderedDict()
    for r in rows:
        g.setdefault(case_key(r), {})[r["impl"]] = r
    return g


def impl_order(rows) -> list:
    seen = []
    for r in rows:
        if r["impl"] not in seen:
            seen.append(r["impl"])
    return seen


def timed(r) -> bool:
    return r is not None and r.get("status") in ("ok", "unchecked") and r.get("ms")


def cell(r) -> str:
    if r is None:
        return ""
    st = r.get("status")
    if st in ("ok", "unchecked") and r.get("ms"):
        s = f"{r['ms']:.3f}"
        if r.get("gbps"):
            s += f" · {r['gbps']:.0f}"
        if r.get("sol") is not None:
            s += f" · {r['sol']:.2f}"
        return s + (" (unchecked)" if st == "unchecked" else "")
    if st == "WRONG":
        return f"**WRONG** {r['ms']:.3f}" if r.get("ms") else "**WRONG**"
    if st == "n/a":
        return "n/a"
    if st == "skipped":
        return "skip"
    return "error"


def speedup(nk, peer):
    """peer ms / normkit ms when both are timed and correct."""
    if timed(nk) and timed(peer):
        return peer["ms"] / nk["ms"]
    return None


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _md_table(header, body) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def op_tables(rows, op: str, with_memory: bool = True) -> str:
    rows = [r for r in rows if r["op"] == op]
    if not rows:
        return ""
    impls = impl_order(rows)
    peers = [i for i in impls if i != "normkit"]
    g = grouped(rows)
    head = ["shape", "dtype", "layout", "dir"]
    t1, t2, t3 = [], [], []
    for key, by in g.items():
        any_r = next(iter(by.values()))
        lead = [shape_label(any_r), dtype_label(any_r), layout_label(any_r),
                DIR_LABEL.get((any_r["mode"], any_r["direction"]), any_r["direction"])]
        t1.append(lead + [cell(by.get(i)) for i in impls])
        nk = by.get("normkit")
        sp = [speedup(nk, by.get(p)) for p in peers]
        best = [by[p]["ms"] for p in peers if timed(by.get(p))]
        bsp = (min(best) / nk["ms"]) if best and timed(nk) else None
        t2.append(lead + [f"{s:.2f}x" if s else "" for s in sp] + [f"{bsp:.2f}x" if bsp else ""])
        t3.append(lead + [f"{by[i]['peak_mem_bytes'] / 2**20:.1f}" if by.get(i) and by[i].get("peak_mem_bytes")
                          is not None else "" for i in impls])
    out = [f"### {op}", "", "ms · GB/s (minimal bytes) · SOL fraction of the measured copy bandwidth", "",
           _md_table(head + impls, t1), ""]
    if peers:
        out += ["normkit speedup (peer ms / normkit ms; correct rows only)", "",
                _md_table(head + [f"vs {p}" for p in peers] + ["vs best peer"], t2), ""]
    if with_memory:
        out += ["peak device memory beyond the inputs, MiB (torch.cuda.max_memory_allocated)", "",
                _md_table(head + impls, t3), ""]
    return "\n".join(out)


def headline(rows) -> str:
    """Per op / direction / dtype: normkit's SOL (min and geomean) and geomean speedup over each peer."""
    impls = impl_order(rows)
    peers = [i for i in impls if i != "normkit"]
    g = grouped(rows)
    buckets = OrderedDict()
    for key, by in g.items():
        any_r = next(iter(by.values()))
        bk = (any_r["op"], DIR_LABEL.get((any_r["mode"], any_r["direction"]), any_r["direction"]),
              dtype_label(any_r))
        buckets.setdefault(bk, []).append(by)
    body = []
    for (op, d, dt), bys in buckets.items():
        nks = [b.get("normkit") for b in bys]
        sols = [r["sol"] for r in nks if timed(r) and r.get("sol") is not None]
        n_timed = sum(1 for r in nks if timed(r))
        # a normkit row that is wrong or raised counts as a failure, not as a row left out
        failed_nk = sum(1 for r in nks if (r or {}).get("status") in ("WRONG", "error"))
        wrong_peers = OrderedDict()
        for b in bys:
            for impl, r in b.items():
                if impl != "normkit" and r.get("status") == "WRONG":
                    wrong_peers[impl] = wrong_peers.get(impl, 0) + 1
        line = [op, d, dt, str(len(bys)), str(n_timed),
                f"{min(sols):.2f}" if sols else "", f"{geomean(sols):.2f}" if sols else ""]
        for p in peers:  # each geomean with the rows it covers: a peer that failed or was skipped covers fewer
            ups = [x for x in (speedup(b.get("normkit"), b.get(p)) for b in bys) if x]
            gm = geomean(ups)
            line.append(f"{gm:.2f}x ({len(ups)}/{len(bys)})" if gm else "")
        best = []
        for b in bys:
            nk = b.get("normkit")
            ms = [b[p]["ms"] for p in peers if timed(b.get(p))]
            if ms and timed(nk):
                best.append(min(ms) / nk["ms"])
        gm = geomean(best)
        line += [f"{gm:.2f}x ({len(best)}/{len(bys)})" if gm else "", f"{sum(1 for s in best if s < 1)}",
                 str(failed_nk), ", ".join(f"{k} {v}" for k, v in wrong_peers.items()) or "0"]
        body.append(line)
    head = ["op", "dir", "dtype", "rows", "normkit timed", "normkit SOL min", "SOL geomean"] + \
        [f"vs {p} (geomean, rows)" for p in peers] + ["vs best peer (rows)", "rows slower than best",
                                                      "normkit WRONG / error rows", "peer WRONG rows"]
    return _md_table(head, body)


def accuracy_table(acc) -> str:
    if not acc:
        return ""
    impls = impl_order(acc)
    g = OrderedDict()
    for r in acc:
        g.setdefault((r["op"], r["dtype"], r["params"], r["input"]), {})[r["impl"]] = r
    body = []
    for (op, d, p, kind), by in g.items():
        line = [op, SHORT[d] if d == p else f"{SHORT[d]}/{SHORT[p]}", kind]
        for i in impls:
            r = by.get(i)
            if r is None:
                line.append("")
            elif r.get("errors"):
                e = r["errors"]
                s = " ".join(f"{k} {v:.1e}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in e.items())
                line.append(("**over tol** " if r["status"] == "WRONG" else "") + s)
            else:
                line.append(r.get("status") or "")
        body.append(line)
    return _md_table(["op", "dtype", "input"] + impls, body)


def models_table(models) -> str:
    if not models:
        return ""
    body = []
    for m in models:
        if m.get("status") != "ok":
            body.append([m.get("model", "?"), m.get("setting", ""), m.get("status", ""), "", "", "", "", "", "",
                         (m.get("note") or "")[:80]])
            continue
        body.append([m["model"], m["setting"], f"{m['step_ms']:.2f}",
                     f"{m['gpu_busy_ms']:.2f}" if m.get("gpu_busy_ms") is not None else "",
                     f"{m['gpu_kernel_ms']:.2f}" if m.get("gpu_kernel_ms") is not None else "",
                     f"{m['norm_ms']:.2f}" if m.get("norm_ms") is not None else "",
                     f"{m['norm_share'] * 100:.1f}%" if m.get("norm_share") is not None else "",
                     f"{m['final_loss']:.4f}" if m.get("final_loss") is not None else "",
                     f"{m['speedup']:.2f}x" if m.get("speedup") else "",
                     (m.get("note") or "")[:80]])
    return _md_table(["model", "setting", "step ms", "GPU busy ms", "GPU kernel ms (sum)", "norm kernel ms (sum)",
                      "norm share", "loss after N steps", "speedup", "note"], body)


def console_report(result: dict) -> str:
    out = []
    dev = result.get("device", {})
    out.append(f"device: {dev.get('gpu_name') or dev.get('device')}   torch {dev.get('torch')}   triton "
               f"{dev.get('triton')}   copy bandwidth: "
               + (f"{result['copy_bandwidth_gbps']:.0f} GB/s" if result.get("copy_bandwidth_gbps") else "n/a"))
    if not_gpu_note(result):
        out.append(not_gpu_note(result))
    rows = result.get("rows") or []
    for op in OPS:
        t = op_tables(rows, op, with_memory=True)
        if t:
            out += ["", t]
    if result.get("accuracy"):
        out += ["", "### accuracy (relative L2 error against float64)", "", accuracy_table(result["accuracy"])]
    if result.get("models"):
        out += ["", "### models", "", models_table(result["models"])]
    errors = error_lines(rows)
    if errors:  # an "error" cell says nothing of why
        out += ["", "### errors", ""] + errors
    if rows:  # last, so that the end of the output (what a remote run shows) holds it
        out += ["", "### headline", "", headline(rows)]
        if not_gpu_note(result):
            out += ["", not_gpu_note(result)]
    return "\n".join(out)


def not_gpu_note(result: dict):
    """The warning a run off the GPU carries (None on CUDA): its times are not the project's numbers."""
    dev = result.get("device") or {}
    if dev.get("device") == "cuda":
        return None
    return (f"**Not a GPU measurement.** This run is on {dev.get('device') or 'a CPU'}"
            + (" at the --quick sizes" if result.get("quick") else "")
            + ": normkit runs its PyTorch reference there (or its Triton kernels in the interpreter, with "
            "TRITON_INTERPRET=1), the times are CPU wall clock and the copy bandwidth is the CPU's. It tests the "
            "harness; its SOL fractions and speedups say nothing about GPU performance.")


def summary_markdown(result: dict, plots=()) -> str:
    dev = result.get("device", {})
    vers = result.get("versions", {})
    lines = ["# normkit benchmark summary", ""]
    warn = not_gpu_note(result)
    if warn:
        lines += [warn, ""]
    lines += [f"- device: **{dev.get('gpu_name') or dev.get('device')}**"
              + (f" ({dev.get('sm_count')} SMs, L2 {dev.get('l2_cache_bytes', 0) / 2**20:.0f} MiB)"
                 if dev.get("sm_count") else ""),
              "- versions: " + ", ".join(f"{k} {v}" for k, v in vers.items() if v),
              f"- date: {result.get('date')}, git {result.get('git_sha')}",
              "- copy bandwidth (SOL ceiling, bytes read + written): "
              + (f"**{result['copy_bandwidth_gbps']:.0f} GB/s**" if result.get("copy_bandwidth_gbps") else "n/a"),
              f"- timing: {result.get('timing', {}).get('method', '')}",
              ] + ([f"- torch.compile: {result.get('timing', {}).get('compile', '')}"]
                   if "compile" in (result.get("implementations") or {}) else []) + [
              "- implementations: " + "; ".join(f"**{k}**: {v}" for k, v in
                                                 (result.get("implementations") or {}).items()),
              "- byte count: forward = read x + write y; backward = read x + read dy + write dx; "
              "parameters and statistics not counted",
              "- correctness: every implementation's y (and dx, dw, db, running stats) against "
              f"{result.get('oracle', 'normkit.reference in float64')} on the same inputs, relative L2 "
              "error within a per-dtype tolerance (bf16 1.6e-2, fp16 4e-3, fp32 1e-4); **WRONG** marks a "
              "failure; `n/a` = the implementation lacks that op or layout; `skip` = not run (budget or scope)",
              f"- wall time: {result.get('elapsed_s', 0):.0f} s"
              + (f" (--budget {result['config']['budget']:.0f} s: rows not reached read `skip`)"
                 if (result.get("config") or {}).get("budget") else ""),
              ]
    if result.get("interrupted"):
        lines.append(f"- **interrupted** ({result['interrupted']}): the rows after that point were not run")
    lines.append("")
    rows = result.get("rows") or []
    if rows:
        lines += ["## Headline", "", headline(rows), ""]
    for p in plots:
        lines.append(f"![{os.path.basename(p)}]({os.path.basename(p)})")
    if plots:
        lines.append("")
    for op in OPS:
        t = op_tables(rows, op, with_memory=True)
        if t:
            lines += [t.replace("### ", "## ", 1), ""]
    if result.get("accuracy"):
        lines += ["## Accuracy: relative L2 error against float64 (same rounded inputs)", "",
                  accuracy_table(result["accuracy"]), ""]
    if result.get("models"):
        lines += ["## Whole training steps", "", models_table(result["models"]), ""]
    errors = error_lines(rows)
    if errors:
        lines += ["## Errors", ""] + errors + [""]
    return "\n".join(lines)


def error_lines(rows) -> list:
    """A line per row that raised, the first of each (implementation, op, message) only."""
    lines, seen = [], set()
    for r in rows:
        key = (r["impl"], r["op"], r.get("note"))
        if r.get("status") != "error" or key in seen:
            continue
        seen.add(key)
        lines.append(f"- {r['impl']} {r['op']} {shape_label(r)} {dtype_label(r)} {layout_label(r)} "
                     f"{r['direction']}: {r.get('note')}")
    return lines


def write_json(result: dict, path: str):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, separators=(",", ":"), default=_jsonable)
    os.replace(tmp, path)


def _jsonable(o):
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return str(o)
    if isinstance(o, tuple):
        return list(o)
    return str(o)


def clean_floats(obj):
    """NaN / inf -> strings, so the JSON is strict."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {k: clean_floats(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_floats(v) for v in obj]
    return obj


PLOT_FILES = OrderedDict([
    ("batch_norm.png", ("batch_norm",)),
    ("layer_rms_norm.png", ("layer_norm", "rms_norm")),
    ("group_instance_norm.png", ("group_norm", "instance_norm")),
])


def save_png(fig, path: str, dpi: int = 80):
    """Save as a 256-colour PNG: a third of the bytes of matplotlib's RGBA, the same picture for line plots
    (the committed results travel to the GPU machine inside a 64 MiB limit)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def plot(result: dict, out_dir: str) -> list:
    """GB/s against the suite's shapes (ordered by tensor size; layer/RMS norm by row width), one panel per
    op / direction / dtype (/ layout), one line per implementation, red crosses on WRONG points, the copy
    bandwidth as a ceiling. At most 3 PNGs. Returns the paths written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print(f"plots skipped: matplotlib not importable ({type(e).__name__}: {e})")
        return []
    rows = [r for r in (result.get("rows") or []) if r.get("ms")]
    copy = result.get("copy_bandwidth_gbps")
    impls = impl_order(result.get("rows") or [])
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(impls)}
    written = []
    os.makedirs(out_dir, exist_ok=True)
    for fname, ops in PLOT_FILES.items():
        panels = OrderedDict()
        for r in rows:
            if r["op"] not in ops:
                continue
            d = DIR_LABEL.get((r["mode"], r["direction"]), r["direction"])
            lay = "" if r["op"] in ("layer_norm", "rms_norm") else \
                (" NHWC-like" if r["layout"] == "channels_last" else " contiguous")
            panels.setdefault((r["op"], d), OrderedDict()).setdefault(dtype_label(r) + lay, []).append(r)
        if not panels:
            continue
        nrows = len(panels)
        ncols = max(len(v) for v in panels.values())
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.8 * ncols + 1, 3.6 * nrows + 0.6), squeeze=False)
        for i, ((op, d), sub) in enumerate(panels.items()):
            for j in range(ncols):
                ax = axes[i][j]
                if j >= len(sub):
                    ax.axis("off")
                    continue
                title, prs = list(sub.items())[j]
                # x: the panel's shapes as categories, ordered by row width (layer/RMS norm) or by tensor
                # size (the others), labelled with shape and MiB: equal-size shapes stay apart
                def order(r):
                    return (r["shape"][-1], r["tensor_bytes"]) if r["op"] in ("layer_norm", "rms_norm") \
                        else (r["tensor_bytes"], r["shape"])
                shapes = []
                for r in sorted(prs, key=order):
                    if shape_label(r) not in [t[0] for t in shapes]:
                        shapes.append((shape_label(r), r["tensor_bytes"]))
                pos = {lab: i for i, (lab, _) in enumerate(shapes)}
                for name in impls:
                    pts = sorted(((pos[shape_label(r)], r["gbps"], r["status"]) for r in prs
                                  if r["impl"] == name and r.get("gbps")), key=lambda t: t[0])
                    if not pts:
                        continue
                    xs = [p[0] for p in pts]
                    ys = [p[1] for p in pts]
                    ax.plot(xs, ys, marker="o", ms=3, lw=1.2, color=colors[name], label=name)
                    bad = [(x, y) for x, y, p in zip(xs, ys, pts) if p[2] == "WRONG"]
                    if bad:
                        ax.scatter([b[0] for b in bad], [b[1] for b in bad], marker="x", s=50, color="red",
                                   zorder=5, label="WRONG")
                if copy:
                    ax.axhline(copy, color="black", ls="--", lw=1, label="copy BW")
                ax.set_xticks(range(len(shapes)))
                ax.set_xticklabels([f"{lab}\n{b / 2**20:.3g} MiB" for lab, b in shapes], rotation=60,
                                   ha="right", fontsize=6)
                ax.set_ylim(bottom=0)
                ax.set_title(f"{op} {d} {title}", fontsize=8)
                ax.tick_params(labelsize=7)
                if j == 0:
                    ax.set_ylabel("GB/s", fontsize=8)
        handles, labels = [], []
        for row in axes:
            for ax in row:
                for h, l in zip(*ax.get_legend_handles_labels()):
                    if l not in labels:
                        handles.append(h)
                        labels.append(l)
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.975), ncol=min(len(labels), 8),
                   fontsize=8, frameon=False)
        dev = (result.get("device") or {}).get("gpu_name") or (result.get("device") or {}).get("device")
        fig.suptitle(f"{', '.join(ops)} on {dev}:\nGB/s under the minimal byte count", fontsize=9, y=0.998)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / (3.0 * nrows + 0.6) - 0.02))
        path = os.path.join(out_dir, fname)
        save_png(fig, path)
        plt.close(fig)
        written.append(path)
    return written
