"""The result files of the benchmarks: ``benchmarks/results/NAME.json``, one format for all.

Every file holds:

- ``benchmark``: its name;
- ``machine``: ``cpu`` (model name), ``cores``, ``bf16`` (whether bfloat16 matmuls are native
  here: `agentrl_sdk.hardware`), with the platform, Python, torch and its thread count;
- ``date``: when it was measured (ISO 8601, UTC);
- ``command``: the command, run from the repository root, that measures it again;
- ``figures``: a list of ``{name, value, unit, baseline, baseline_value, ratio, goal}`` (plus
  the figure's own detail fields): ``baseline`` names what the value is compared with,
  measured in the same run, and ``baseline_value`` is what it measured;
- ``details`` (optional): per-run data that is not a figure.

A figure written with ``merge=True`` also carries its own ``date``, ``command`` and ``machine``:
the file's other figures came from other runs, perhaps on another machine.
``benchmarks/report.py`` turns the files into the page.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
_SHIPPED_RESULTS = RESULTS_DIR
ROOT = RESULTS_DIR.parents[1]
FIGURE_KEYS = ("name", "value", "unit", "baseline", "baseline_value", "ratio", "goal")
NOT_RECORDED = "not recorded"


def write_result(name: str, figures: dict[str, dict], *, merge: bool = False) -> Path:
    """Write one benchmark's figures with this machine, the time and this command line.

    Args:
        name: Benchmark name; the file is ``results/{name}.json``.
        figures: ``{FIGURE: {"value", "baseline", "ratio", "goal", "unit", ...}}``: ``baseline``
            is the baseline's measured value; its name comes from ``"baseline_name"`` when the
            figure gives one, else from `_baselines`. A figure whose value is not a number
            (per-run data) goes to ``details``.
        merge: Keep the file's other figures (a benchmark whose variants run separately);
            this call's figures carry their own date, command and machine.

    Returns:
        The path written.
    """
    path = RESULTS_DIR / f"{name}.json"
    now, command, machine = utc_now(), command_line(), machine_info()
    payload = {"benchmark": name, "machine": machine, "date": now, "command": command,
               "figures": [], "details": {}}  # fmt: skip
    if merge and path.exists():
        old = normalise(json.loads(path.read_text()), name)
        for figure in old["figures"]:
            figure.setdefault("date", old["date"])
            figure.setdefault("command", old["command"])
            figure.setdefault("machine", old["machine"])
        payload["figures"], payload["details"] = old["figures"], old["details"]
    fresh = normalise({"figures": figures}, name)
    if merge:
        for figure in fresh["figures"]:
            figure.update(date=now, command=command, machine=machine)
    names = {f["name"] for f in fresh["figures"]}
    payload["figures"] = [f for f in payload["figures"] if f["name"] not in names]
    payload["figures"] += fresh["figures"]
    payload["details"] |= fresh["details"]
    if not payload["details"]:
        del payload["details"]
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    if RESULTS_DIR == _SHIPPED_RESULTS:
        _refresh_pages()
    return path


def _refresh_pages() -> None:
    """Rewrite the generated benchmarks page, which must match the result files (the test
    runs ``report.py --check``)."""
    try:
        from benchmarks import report
    except ImportError:  # run as a script from benchmarks/, the checkout's root not on the path
        import report  # type: ignore[no-redef]
    report.main([])


def normalise(payload: dict[str, Any], name: str) -> dict[str, Any]:
    """``payload`` in the current format: figures as a list, the top-level fields present
    (``NOT_RECORDED`` where an older file lacks them; ``when`` was the date's old name)."""
    out = {k: v for k, v in payload.items() if k not in ("when", "figures")}
    out["benchmark"] = payload.get("benchmark", name)
    out["date"] = payload.get("date") or payload.get("when") or NOT_RECORDED
    out["command"] = payload.get("command") or NOT_RECORDED
    out["machine"] = dict(payload.get("machine") or {})
    out["details"] = dict(payload.get("details") or {})
    raw = payload.get("figures", [])
    items = raw.items() if isinstance(raw, dict) else ((f["name"], f) for f in raw)
    out["figures"] = []
    for key, figure in items:
        if isinstance(raw, list):
            out["figures"].append(dict(figure))
        elif _is_number(figure.get("value")):
            out["figures"].append(_from_mapping(out["benchmark"], key, figure))
        else:
            out["details"][key] = figure
    return out


def _from_mapping(benchmark: str, name: str, figure: dict[str, Any]) -> dict[str, Any]:
    """One figure of the mapping format as a list entry. A figure with ``after`` (tree.py,
    repeated_jobs.py, real_model.py's speedup) held the ratio (or difference) as its value,
    the baseline's measurement as ``baseline`` and its own as ``after``."""
    rest = dict(figure)
    value, measured = rest.pop("value"), rest.pop("baseline", None)
    ratio = rest.pop("ratio", None)
    named = rest.pop("baseline_name", None) or baseline_name(benchmark, name)
    if "after" in rest and ratio is None and _is_number(rest["after"]):
        after = rest.pop("after")
        if "minus" in str(rest.get("unit", "")):
            rest["difference"] = value
            ratio = round(after / measured, 3) if measured else None
        else:
            ratio = value
        value = after
    entry = {"name": name, "value": value, "unit": rest.pop("unit", ""), "baseline": named,
             "baseline_value": measured, "ratio": ratio, "goal": rest.pop("goal", None)}  # fmt: skip
    return entry | rest


# What each figure's baseline is, by benchmark (the longest name a result's name starts with:
# tree_gated takes tree's) and figure ("*": the benchmark's default). Always measured in the same
# run as the figure, unless the name says it is a goal.
BASELINES: dict[str, dict[str, str]] = {
    "algorithms": {"*": "GRPO, same budget, same run"},
    "async_vs_sync": {"*": "sync pipeline, same job, same run",
                      "bound_fraction": "1.0: the bound (max of trainer time, tokens at peak tok/s)"},
    "crash_resume": {"*": "the count the figure is out of (same runs)",
                     "kills": "none",
                     "checkpoint_s_per_update": "median update step without checkpointing, same run"},
    "demo_lora": {"*": "full fine-tuning, same job, same sitting"},
    "engine": {"*": "HF generate, one request at a time, same model, same run"},
    "engines": {"*": "TorchEngine, batched, same model, same run",
                "vllm_vs_hf": "HF generate, one request at a time, same model, same run",
                "weight_sync_ms": "TorchEngine load_state_dict, same weights, same run"},
    "gateway": {"*": "the engine call the gateway wraps (median ms), same run"},
    "multi_lora": {"*": "one full model per agent, same job, same sitting"},
    "overhead": {"*": "the engine call the adapter wraps (median ms), same run"},
    "real_model": {"*": "held-out accuracy (%) before RL, same run (ratio: after / before)",
                   "rl_minutes": "goal: 10 minutes (no baseline run)",
                   "peak_rss_gb": "goal: 4 GB (no baseline run)",
                   "first_run_peak_rss_gb": "goal: 4 GB (no baseline run)",
                   "speedup_vs_before": "the previous recipe's run, minutes to +20 points"},
    "repeated_jobs": {"*": "the first job in the same process"},
    "scaling": {"*": "see the unit: the variant named there, same run"},
    "soak": {"*": "rollouts started", "rss_growth_mb": "RSS after warm-up, same run",
             "llm_call_p50_ms": "none", "llm_call_p99_ms": "p50 of the same calls"},
    "tool_latency": {"*": "the same rollouts with instant tools, same run"},
    "tracing": {"*": "the same rollouts untraced, same run"},
    "tree": {"*": "chain rollouts (no branching), same job, alternating rounds"},
    "vs_trl": {"*": "TRL GRPOTrainer, same job, alternating rounds in the same run "
                         "(ratio > 1: ours is faster)"},
    "weight_sync": {"bandwidth_fraction": "memcpy bandwidth (GB/s) of this machine, same run",
                    "driver_peak_buckets": "the driver way's growth (buckets), same run"},
}


def baseline_name(benchmark: str, figure: str) -> str:
    """What ``figure`` of ``benchmark`` is compared with (`BASELINES`; 'none' if unnamed)."""
    keys = [k for k in BASELINES if benchmark == k or benchmark.startswith(k + "_")]
    table = BASELINES[max(keys, key=len)] if keys else {}
    return table.get(figure) or table.get("*") or "none"


def machine_info() -> dict[str, Any]:
    """This machine: CPU model, cores, bf16 capability, platform, Python, torch."""
    import torch

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "bf16": bf16_capability(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bf16_capability() -> str:
    """'native (...)' or 'emulated (...)': bf16 matmuls through oneDNN, or torch's reference
    loop (`agentrl_sdk.hardware.bf16_is_native`), with the CPU flags that decide it."""
    from agentrl_sdk.hardware import bf16_is_native

    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        flags = set()
    found = [label for flag, label in (("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX"))
             if flag in flags]  # fmt: skip
    which = ", ".join(found) if found else "no AVX512-BF16 or AMX"
    return f"{'native' if bf16_is_native('cpu') else 'emulated'} ({which})"


def command_line() -> str:
    """This process's command line as run from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *sys.argv[1:]])


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
