"""benchmarks/ab_compare.py and benchmarks/ptx_compare.py on synthetic inputs (they pair rows of two runs)."""

import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def _run(script, *args):
    out = subprocess.run([sys.executable, os.path.join(BENCH, script), *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_ab_compare_pairs_rows_and_reports_ratios(tmp_path):
    def run(path, ms):
        rows = [{"meta": {"device": "x"}}]
        for (shape, mode), t in ms.items():
            rows.append(dict(shape=shape, layout="cl", dtype="bf16", mode=mode, variant="default", nk_graph_ms=t))
        rows.append(dict(shape=[9, 9], layout="cl", dtype="bf16", mode="fwd", variant="other", nk_graph_ms=1.0))
        path.write_text("\n".join(json.dumps(r) for r in rows))

    before, after, out = tmp_path / "b.jsonl", tmp_path / "a.jsonl", tmp_path / "ab.json"
    run(before, {((2, 3), "fwd"): 0.2, ((4, 5), "bwd"): 0.5, ((6, 7), "fwd"): 1.0})
    run(after, {((2, 3), "fwd"): 0.1, ((4, 5), "bwd"): 0.6})
    text = _run("ab_compare.py", str(before), str(after), "--json", str(out))
    table = {t["row"]: t for t in json.loads(out.read_text())}
    assert set(table) == {"2x3 cl bf16 fwd", "4x5 cl bf16 bwd"}  # only rows in both, default variant only
    assert abs(table["2x3 cl bf16 fwd"]["ratio"] - 0.5) < 1e-12 and abs(table["4x5 cl bf16 bwd"]["ratio"] - 1.2) < 1e-12
    assert "geomean after/before over 2 rows: 0.7746" in text and "-50.0 %" in text


def test_ptx_compare_matches_specializations(tmp_path):
    def row(kernel, code, **cx):
        return dict(kernel=kernel, constexprs=cx, options={"num_warps": 4}, code=code, registers=32)

    before = [row("k", "aa", BS=256), row("k", "bb", BS=128), row("gone", "cc")]
    after = [row("k", "aa", BS=256), row("k", "zz", BS=128), row("new", "dd")]
    (tmp_path / "b.json").write_text(json.dumps(before))
    (tmp_path / "a.json").write_text(json.dumps(after))
    text = _run("ptx_compare.py", str(tmp_path / "b.json"), str(tmp_path / "a.json"))
    assert "1 specializations the same, 1 changed, 2 in one revision only" in text
    assert 'changed     k {"BS": 128}' in text and "only before gone" in text and "only after  new" in text


def test_ptx_compare_default_constexpr_left_out_of_the_match(tmp_path):
    # session 37: C_ALIGN added to kernels; at its default 1 a specialization must still match the one without it
    def row(code, **cx):
        return dict(kernel="k", constexprs=cx, options={"num_warps": 4}, code=code, registers=32)

    (tmp_path / "b.json").write_text(json.dumps([row("aa", BS=256), row("bb", BS=128)]))
    (tmp_path / "a.json").write_text(json.dumps([row("aa", BS=256, C_ALIGN=1), row("cc", BS=128, C_ALIGN=8)]))
    files = str(tmp_path / "b.json"), str(tmp_path / "a.json")
    assert "0 specializations the same, 0 changed, 4 in one revision only" in _run("ptx_compare.py", *files)
    text = _run("ptx_compare.py", *files, "--default", "C_ALIGN=1")
    assert "1 specializations the same, 0 changed, 2 in one revision only" in text
    assert 'only after  k {"BS": 128, "C_ALIGN": 8}' in text
