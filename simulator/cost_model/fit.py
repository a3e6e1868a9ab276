"""Fit a ``profiled`` cost model from profile rows (see docs/COST_MODELS.md, "profiled").

Selection: rows for the target GPU whose dtype has the model's element size, and either the
target model at the target TP degree, or model-agnostic kernel rows (GEMMs; attention with the
model's per-GPU head counts; all-reduce over ``tp`` GPUs). Ops nothing measured are filled from
the roofline model and marked ``origin: roofline`` in ``fit_error``.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from servesim.traces.errors import InputError

from ..specs import ModelSpec, resolve_gpu, resolve_model
from .fit_ops import fit_curve, fit_grid, fit_step_regression, gemm_curve, roofline_curve
from .fitted import FORMAT, VERSION, FittedCostModel
from .interp import Curve, NestedGrid
from .importers import import_profile
from .profile_schema import CALLS_PER_LAYER, OPS, validate_profile
from .roofline import RooflineCostModel

if TYPE_CHECKING:
    import pandas as pd

_LAYER_OPS = ("norm", "qkv_proj", "rope", "o_proj", "gate_up_proj", "act", "down_proj",
              "residual_add")
_TOKEN_OPS = ("embedding", "final_norm")
_ROW_OPS = ("lm_head", "sampler")
_TOKEN_GRID = [2.0 ** i for i in range(16)]  # 1 .. 32768 tokens, for roofline fill-ins
_ROW_GRID = [2.0 ** i for i in range(12)]
_BYTES_GRID = [2.0 ** i for i in range(10, 32)]
_ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "int8": 1}


def fit(profile_rows: pd.DataFrame | Sequence[pd.DataFrame], model: Any, gpu: Any, tp: int = 1,
        *, holdout_fraction: float = 0.2, seed: int = 0) -> FittedCostModel:
    """Fit per-op tables for (model, gpu, tp) and return the ready-to-use cost model."""
    import pandas as pd
    spec, gspec = resolve_model(model), resolve_gpu(gpu)
    if not 0 <= holdout_fraction < 1:
        raise InputError("holdout_fraction must be in [0, 1)", field="holdout_fraction")
    frames = [profile_rows] if isinstance(profile_rows, pd.DataFrame) else list(profile_rows)
    rows = validate_profile(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())
    sel = _select(rows, spec, gspec.name, tp)
    roof = RooflineCostModel(model=spec, gpu=gspec, tp=tp)
    rng = np.random.default_rng(seed)
    data: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "model": spec.name, "gpu": gspec.name, "tp": tp,
        "num_layers": spec.num_layers, "hidden_size": spec.hidden_size,
        "dtype_bytes": spec.dtype_bytes, "vocab_size": spec.vocab_size, "ops": {}, "fit_error": {},
    }
    errors = data["fit_error"]
    step_rows = sel[sel["op"].isin(["model_prefill", "model_decode"])]
    layer_rows = sel[sel["op"].map(lambda o: OPS[o][0] != "step")]
    if layer_rows.empty and not step_rows.empty:  # coarse whole-request data only
        data["step_regression"], errs = fit_step_regression(step_rows)
        errors.update(errs)
    else:
        _fit_ops(data, layer_rows, spec, roof, rng, holdout_fraction)
        data["attention"] = _fit_attention(layer_rows, spec, tp, roof, rng, holdout_fraction,
                                           errors)
        data["allreduce"] = _fit_allreduce(layer_rows, tp, roof, rng, holdout_fraction, errors)
    data["metadata"] = {
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "sources": sorted(sel["source"].dropna().unique().tolist()),
        "paths": sorted(sel["path"].dropna().unique().tolist()),
        "frameworks": sorted(sel["framework"].dropna().unique().tolist()),
        "n_rows_used": int(len(sel)), "holdout_fraction": holdout_fraction, "seed": seed,
        # per op: origin, points, MAPE on the profile rows and on held-out points
        "fit_error": data.pop("fit_error"),
    }
    return FittedCostModel(data)


def _dtype_ok(rows: pd.DataFrame, spec: ModelSpec) -> pd.Series:
    """Rows measured in the model's formats: GEMMs in its weight format (fp8 GEMM tables for an
    fp8 checkpoint), attention in its KV-cache format, everything else in its activation size."""
    by_size = rows["dtype"].map(lambda d: _ELEM_BYTES.get(d, 0)) == spec.dtype_bytes
    wfmt = spec.weight_dtype
    gemm_ok = rows["dtype"].isin(("bf16", "fp16") if wfmt in ("bf16", "fp16") else (wfmt,))
    attn_ok = (rows["dtype"] == "fp8") if spec.kv_cache_dtype == "fp8" else by_size
    is_gemm = rows["op"] == "gemm"
    is_attn = rows["op"].astype(str).str.startswith("attn")
    return rows["dtype"].isna() | (is_gemm & gemm_ok) | (is_attn & attn_ok) | \
        (~is_gemm & ~is_attn & by_size)


def _select(rows: pd.DataFrame, spec: ModelSpec, gpu: str, tp: int) -> pd.DataFrame:
    import pandas as pd
    size_ok = _dtype_ok(rows, spec)
    on_gpu = rows[(rows["gpu"] == gpu) & size_ok]
    mine = (on_gpu["model"] == spec.name) & (on_gpu["tp"] == tp).fillna(False)
    generic = (on_gpu["model"] == "") & (on_gpu["op"] != "allreduce") & on_gpu["tp"].isna()
    heads_ok = on_gpu["num_heads"].isna() | (
        (on_gpu["num_heads"] == spec.heads_per_gpu(tp))
        & (on_gpu["num_kv_heads"] == spec.kv_heads_per_gpu(tp))
        & (on_gpu["head_dim"] == spec.head_dim)).fillna(False)
    allreduce = (on_gpu["op"] == "allreduce") & (on_gpu["tp"] == tp).fillna(False)
    sel = on_gpu[(mine | (generic & heads_ok) | allreduce).to_numpy(bool)]
    if sel.empty or (sel["op"] == "allreduce").all():
        have = rows.drop_duplicates(["gpu", "model", "tp"])[["gpu", "model", "tp"]]
        combos = "; ".join(f"gpu={g} model={m or '(any)'} tp={t if pd.notna(t) else '(any)'}"
                           for g, m, t in have.itertuples(index=False))
        raise InputError(f"no profile rows for model={spec.name} gpu={gpu} tp={tp} "
                         f"(dtype of {spec.dtype_bytes} bytes)", field="profile",
                         allowed=combos or "no rows at all")
    return sel


def _put(data: dict, op: str, scope: str, calls: int, curve, err: dict) -> None:
    data["ops"][op] = {"scope": scope, "calls": calls, "curve": curve.to_dict()}
    data["fit_error"][op] = err


def _fit_ops(data: dict, rows: pd.DataFrame, spec: ModelSpec, roof: RooflineCostModel,
             rng: np.random.Generator, holdout: float) -> None:
    """Token-indexed ops: measured curves, GEMM-derived projections, roofline for the rest."""
    gemm_grid = None
    gemm_rows = rows[rows["op"] == "gemm"]
    if len(gemm_rows):
        gemm_grid, err = fit_grid(gemm_rows, ["gemm_m", "gemm_n", "gemm_k"], rng, holdout,
                                  "measured gemm kernels", monotone=True)
        data["fit_error"]["gemm"] = err
    tp = data["tp"]
    h, inter = spec.hidden_size, spec.intermediate_size // tp
    qkv_n = (spec.q_size // tp) + 2 * spec.kv_heads_per_gpu(tp) * spec.head_dim
    gemm_shapes = {"qkv_proj": (qkv_n, h), "o_proj": (h, spec.q_size // tp),
                   "gate_up_proj": (2 * inter, h), "down_proj": (h, inter),
                   "lm_head": (-(-spec.vocab_size // tp), h)}
    fused_quant = _fused_quant_grid(data, rows, spec, rng, holdout) if gemm_grid is not None else None
    plan = [(op, "layer", CALLS_PER_LAYER.get(op, 1)) for op in _LAYER_OPS] + \
        [(op, "tokens", 1) for op in _TOKEN_OPS] + [(op, "rows", 1) for op in _ROW_OPS]
    moe_mlp = ("gate_up_proj", "down_proj") if spec.is_moe else ()
    for op, scope, calls in plan:
        measured = rows[rows["op"] == op]
        if op in moe_mlp:  # routed experts are modelled as one op below, not dense GEMMs
            continue
        if len(measured):
            curve, err = fit_curve(measured, "num_tokens", rng, holdout, "measured")
        elif op in gemm_shapes and gemm_grid is not None:
            n, k = gemm_shapes[op]
            curve = gemm_curve(gemm_grid, n, k)
            err = {**data["fit_error"]["gemm"], "origin": f"gemm kernels n={n} k={k}"}
            if fused_quant is not None and op in _QUANT_FUSED_OPS:
                curve = _without_quant(curve, fused_quant, k)
                err["origin"] += " minus the fp8 activation quantisation vLLM fuses into the op before"
        elif op in gemm_shapes or op in _TOKEN_OPS + _ROW_OPS:  # unmeasured: roofline fill-in
            grid = _ROW_GRID if scope == "rows" else _TOKEN_GRID
            curve = roofline_curve(lambda x, o=op: roof.op_time_s(o, x), grid)
            err = _roofline_err()
        else:  # rope/act/norm/residual_add unmeasured: covered by "elementwise" below
            continue
        _put(data, op, scope, calls, curve, err)
    if spec.is_moe:
        _put(data, "moe_experts", "layer", 1,
             roofline_curve(lambda x: roof.op_time_s("moe", x), _TOKEN_GRID), _roofline_err())
    if not {"norm", "rope", "act"} & set(data["ops"]):  # nothing elementwise was measured
        _put(data, "elementwise", "layer", 1,
             roofline_curve(lambda x: roof.op_time_s("elementwise", x), _TOKEN_GRID),
             _roofline_err())


# fp8 GEMMs whose activation quantisation vLLM's compiled graph fuses into the op before them
# (RMSNorm + quant for qkv and gate_up, SiLU-mul + quant for down: PassConfig fuse_norm_quant /
# fuse_act_quant, or Inductor fusing the native quant). o_proj's input comes out of attention,
# whose fusion with the quant needs the full graph (off by default), so it keeps its quant.
_QUANT_FUSED_OPS = ("qkv_proj", "gate_up_proj", "down_proj")
_QUANT_FLOOR = 0.5  # never take off more than half a GEMM (the tables are separate measurements)


def _fused_quant_grid(data: dict, rows: pd.DataFrame, spec: ModelSpec, rng: np.random.Generator,
                      holdout: float):
    """The (m, k) grid of the activation quantisation that fp8 (per-tensor W8A8) GEMM rows
    include, or None: other weight formats, or no act_quant rows (aiconfigurator's
    scale_matrix_perf + computescale_perf)."""
    quant = rows[rows["op"] == "act_quant"]
    if spec.weight_dtype != "fp8" or quant.empty:
        return None
    grid, data["fit_error"]["act_quant"] = fit_grid(quant, ["gemm_m", "gemm_k"], rng, holdout,
                                                     "measured fp8 activation quantisation", monotone=True)
    return grid


def _without_quant(curve, quant, k: int):
    """A GEMM's curve over m less the quantisation of its m x k input (at most _QUANT_FLOOR of it)."""
    ys = [max(y - quant(m, float(k)), _QUANT_FLOOR * y) for m, y in zip(curve.xs, curve.ys)]
    return Curve(curve.xs, ys)


def _roofline_err() -> dict:
    return {"origin": "roofline", "n_points": 0, "mape_fit": None, "mape_holdout": None}


def _fit_attention(rows: pd.DataFrame, spec: ModelSpec, tp: int, roof: RooflineCostModel,
                   rng: np.random.Generator, holdout: float, errors: dict) -> dict:
    mixed = rows[rows["op"] == "attn_mixed"]
    if len(mixed):  # vLLM's own mixed prefill+decode batch: use it whole
        grid, errors["attn_mixed"] = fit_grid(
            mixed, ["chunk_len", "prefix_len", "batch_size", "context_len"], rng, holdout,
            "measured")
        out = {"kind": "mixed", "grid": grid.to_dict()}
        alphas = sorted(mixed["skew_alpha"].dropna().unique().tolist())
        if len(alphas) > 1:
            raise InputError(f"attn_mixed rows carry different skew_alpha values {alphas}: fit "
                             "one profiler run at a time", field="skew_alpha")
        if alphas:  # measured by the source's skew profile; absent = no correction
            out["skew_alpha"] = float(alphas[0])
        return out
    pre, dec = rows[rows["op"] == "attn_prefill"], rows[rows["op"] == "attn_decode"]
    if not len(pre) and not len(dec):
        errors["attention"] = _roofline_err()
        return {"kind": "roofline", "coefficients": roof.attention_coefficients()}
    out: dict[str, Any] = {"kind": "split"}
    if len(pre):
        pre = pre.assign(prefix_len=pre["prefix_len"].fillna(0))
        chunked = set(pre.loc[pre["prefix_len"] > 0, "path"])
        if chunked:  # a chunked-prefill table wins over files that never cached a prefix:
            pre = pre[pre["path"].isin(chunked)]  # one grid must not mix measurement setups
        grid, errors["attn_prefill"] = fit_grid(pre, ["batch_size", "chunk_len", "prefix_len"],
                                                rng, holdout, "measured")
        out["prefill"] = grid.to_dict()
        out["prefill_has_prefix"] = bool(pre["prefix_len"].nunique() > 1)
    if len(dec):
        grid, errors["attn_decode"] = fit_grid(dec, ["batch_size", "context_len"], rng, holdout,
                                               "measured")
        out["decode"] = grid.to_dict()
    for phase in ("prefill", "decode"):  # a phase nobody measured comes from the roofline
        if phase not in out:
            out[phase] = _roofline_attention_grid(roof, phase).to_dict()
            out["prefill_has_prefix"] = out.get("prefill_has_prefix", True)
            errors[f"attn_{phase}"] = _roofline_err()
    return out


def _roofline_attention_grid(roof: RooflineCostModel, phase: str) -> NestedGrid:
    """The roofline attention of one phase, tabulated like a measured grid."""
    c = roof.attention_coefficients()

    def seconds(pairs: float, kv: float, q: float) -> float:
        return max(pairs * c["s_per_pair"], kv * c["s_per_kv_token"] + q * c["s_per_q_token"]) \
            + c["overhead_s"]

    pts, ys = [], []
    if phase == "decode":  # (batch, context)
        for b in (2 ** i for i in range(12)):
            for k in [0] + [2 ** i for i in range(4, 18)]:
                pts.append((b, k))
                ys.append(seconds(b * (k + 1), b * (k + 1), b))
        return NestedGrid.from_points(["batch_size", "context_len"], np.array(pts), np.array(ys))
    for chunk in (2 ** i for i in range(16)):  # (batch = 1, chunk, prefix)
        for p in [0] + [2 ** i for i in range(4, 18)]:
            pts.append((1, chunk, p))
            ys.append(seconds(chunk * p + chunk * (chunk + 1) / 2, chunk + p, chunk))
    return NestedGrid.from_points(["batch_size", "chunk_len", "prefix_len"], np.array(pts),
                                  np.array(ys))


def _fit_allreduce(rows: pd.DataFrame, tp: int, roof: RooflineCostModel,
                   rng: np.random.Generator, holdout: float, errors: dict) -> dict | None:
    if tp == 1:
        return None
    ar = rows[rows["op"] == "allreduce"]
    if len(ar):
        curve, errors["allreduce"] = fit_curve(ar, "bytes", rng, holdout, "measured")
    else:
        curve = roofline_curve(lambda b: roof.op_time_s("allreduce", b), _BYTES_GRID)
        # Not measured in this profile: the shared collective tables, or the link model.
        errors["allreduce"] = {**_roofline_err(), "source": roof.collectives.source.allreduce}
    return {"calls": CALLS_PER_LAYER["allreduce"], "curve": curve.to_dict()}


def load_profiles(paths: Sequence[str | Path], source: str = "auto") -> pd.DataFrame:
    """Import several profile files/folders (each through its importer) into one table."""
    import pandas as pd
    if not paths:
        raise InputError("no profile paths given", field="profile")
    return pd.concat([import_profile(source, p) for p in paths], ignore_index=True)


def fit_main(profile_paths: Sequence[str | Path], out_path: str | Path, model: Any, gpu: Any,
             tp: int = 1, source: str = "auto") -> FittedCostModel:
    """CLI entry (``servesim fit PROFILE... --out COSTMODEL``): import, fit, save atomically."""
    fitted = fit(load_profiles(profile_paths, source), model, gpu, tp)
    fitted.save(out_path)
    return fitted


def format_fit_report(fitted: FittedCostModel) -> str:
    """Human-readable per-op fit error table (for the CLI)."""
    lines = [f"{fitted.model} on {fitted.gpu} tp={fitted.tp}",
             f"{'op':<14}{'origin':<34}{'points':>8}{'MAPE fit':>10}{'held-out':>10}"]
    for op, e in fitted.fit_error.items():
        fmt = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
        lines.append(f"{op:<14}{e['origin'][:33]:<34}{e['n_points']:>8}"
                     f"{fmt(e['mape_fit']):>10}{fmt(e['mape_holdout']):>10}")
    return "\n".join(lines)
