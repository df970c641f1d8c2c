"""`simpar kernels GPU [--json]`: the public kernel figures simpar prices a GPU's kernels with.

Prints the GPU's compute die, its GEMM curve (best measured fraction of peak, tile-fill size, fp8
scale, power-limit factor) with the rows and sources behind it, what that makes of a few GEMM shapes
in a training step (times the fitted training fractions of its default calibration), the attention
curves of each implementation measured on the die, which implementation each stack runs there, and
the measured MoE dispatch kernels that time the flex dispatcher on the GPU's cluster presets.
"""

from __future__ import annotations

import json

import click


@click.command("kernels")
@click.argument("gpu")
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def kernels(gpu: str, as_json: bool) -> None:
    """The public kernel figures (GEMM, fp8, attention) simpar prices a GPU with, and their sources."""
    from rich.console import Console
    from rich.table import Table

    from simpar.sim.cost.kernel_report import kernel_report
    from simpar.sim.specs import load_gpu

    rep = kernel_report(load_gpu(gpu))
    if as_json:
        click.echo(json.dumps(rep, indent=1))
        return
    con = Console(highlight=False)
    con.print(f"[bold]{rep['gpu']}[/]: die {rep['die'] or '(none: no kernel data)'}; calibration: {rep['calibration']}")
    if rep["parts_measured"]:
        con.print(f"measured parts of this die: {', '.join(rep['parts_measured'])}")
    g = rep["gemm"]
    if g is None:
        con.print("GEMM: no public measurement of this die; the calibration's mm_eff_max / mm_half_dim apply")
    else:
        fp8 = f"{g['fp8_scale']:.3f} ({g['rows_fp8']} rows)" if g["fp8_scale"] is not None else "none measured"
        power = f"; x {g['power_factor']:.3f} at this GPU's power limit" if g["power_factor"] is not None else ""
        con.print(
            f"GEMM: best measured {g['mm_eff_max']:.3f} of peak ({g['rows_16bit']} 16-bit rows), tile-fill half "
            f"size {g['mm_half_dim']:.0f} (shared by every die), fp8 scale {fp8}{power}"
        )
        for s in g["sources"]:
            con.print(f"  source: {s}")
        fit = "; ".join(
            f"{r['kind']} {r['median_abs_error']:.0%} ({r['median_signed_error']:+.0%}, {r['rows']} rows)"
            for r in rep["gemm_curve_vs_its_rows"]
        )
        con.print(f"the curve against every measured GEMM of the die, median |error| (signed): {fit}", markup=False)
    con.print(
        f"training reaches {rep['train_gemm_fraction']:.3f} of the GEMM figures and {rep['train_attn_fraction']:.3f} "
        "of the attention figures (fitted per GPU group; `simpar accuracy` judges them leave-one-source-out)"
    )
    t = Table(title="GEMMs in a training step", show_edge=False)
    for col in ("m x n x k", "dtype", "TFLOPS"):
        t.add_column(col, justify="right")
    for row in rep["gemm_in_training"]:
        t.add_row(" x ".join(str(x) for x in row["shape"]), row["dtype"], f"{row['TFLOPS']:.0f}")
    con.print(t)
    a = Table(title="attention kernels measured on this die (head dim 128; kernel fwd / bwd fraction of peak)")
    for col in ("impl", "seq 2048", "seq 8192", "rows"):
        a.add_column(col)
    notes: list[str] = []
    for row in rep["attention"]:
        if row.get("kernel") is None:
            a.add_row(row["impl"], "-", "-", "no 16-bit forward row with a known FLOP count")
            continue
        k = row["kernel"]
        marks = ""
        for d in row["derived"]:
            if d not in notes:
                notes.append(d)
            marks += f" [{notes.index(d) + 1}]"
        a.add_row(row["impl"], *(f"{k[s][0]:.3f} / {k[s][1]:.3f}" for s in ("2048", "8192")), f"{row['rows']}{marks}")
    con.print(a)
    for i, d in enumerate(notes, start=1):
        con.print(f"  [{i}] {d}", markup=False)
    fwd, bwd = rep["attention_fallback"]
    con.print(f"without a curve for its implementation: the calibration's {fwd:.2f} / {bwd:.2f}")
    con.print("stacks: " + ", ".join(f"{k} runs {v}" for k, v in rep["stacks"].items()))
    for d in rep["moe_dispatch"]:
        pts = ", ".join(f"{n} {d['group']} {a:.0f} / {b:.0f}" for n, a, b in d["points"])
        con.print(
            f"MoE flex dispatch on {d['cluster']} {d['scope']} ({d['implementation']} measured on {d['measured_on']}, "
            f"{d['timing']} at {d['sms']} SMs; GB/s dispatch / combine): {pts}",
            markup=False,
        )
        for src in d["sources"]:
            con.print(f"  source: {src}", markup=False)
    if not rep["moe_dispatch"]:
        con.print("MoE flex dispatch: no measured kernel on this GPU's clusters; NCCL's all-to-all model times it")
