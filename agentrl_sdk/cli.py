"""The ``agentrl`` command: look at trajectories, build the local tiny models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console

from agentrl_sdk.types import Trajectory

app = typer.Typer(help="agentrl: train LangGraph agents with RL, token-exact.", no_args_is_help=True)
console = Console()


@app.command()
def show(
    path: Annotated[Path, typer.Argument(help="Trajectories as JSON lines (Trajectory.model_dump_json).")],
    model_dir: Annotated[Path, typer.Option(help="Folder holding the tokenizer used to decode ids.")],
    prompt: Annotated[bool, typer.Option(help="Also print the prompt tokens.")] = False,
    limit: Annotated[int, typer.Option(help="Show at most this many trajectories.")] = 10,
) -> None:
    """Print trajectories token by token, coloured by mask (generated vs observation)."""
    from transformers import AutoTokenizer

    from agentrl_sdk.tracing import legend, render_trajectory

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    console.print(legend())
    with path.open() as lines:
        for i, line in enumerate(lines):
            if i >= limit:
                break
            traj = Trajectory.model_validate_json(line)
            console.print(render_trajectory(traj, tokenizer, show_prompt=prompt))


@app.command()
def train(
    config: Annotated[Path, typer.Argument(help="Training config YAML (with an entrypoint section).")],
    steps: Annotated[int | None, typer.Option(help="Override max_steps.")] = None,
) -> None:
    """Train the graph, dataset and reward named in the config's entrypoint section."""
    from agentrl_sdk.api import train as run_training
    from agentrl_sdk.entrypoints import resolve_entrypoints
    from agentrl_sdk.pipeline import TrainConfig

    cfg = TrainConfig.from_yaml(config)
    if steps:
        cfg.max_steps = steps
    job = resolve_entrypoints(cfg)
    result = run_training(job.graph, job.dataset, job.reward, cfg, input_fn=job.input_fn)
    curve = ", ".join(f"{m['reward/mean']:.3f}" for m in result.history)
    console.print(f"reward per step: {curve}")
    console.print(f"MLflow run {result.run_id} · final model {result.final_model}")


@app.command("build-model")
def build_model(
    out: Annotated[Path, typer.Argument(help="Folder to write (save_pretrained layout).")],
    vocab: Annotated[str, typer.Option(help="'qwen' (real Qwen BPE) or 'small' (1k BPE).")] = "small",
    template: Annotated[str, typer.Option(help="'hermes' or 'qwen3' chat template.")] = "hermes",
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
) -> None:
    """Build a tiny random Qwen2-architecture model and its tokenizer, offline."""
    from agentrl_sdk.models import (
        build_qwen_tokenizer,
        build_small_tokenizer,
        build_tiny_model,
        save_pretrained_pair,
    )

    kind: Literal["qwen", "small"] = "qwen" if vocab == "qwen" else "small"
    tokenizer = build_qwen_tokenizer(template) if kind == "qwen" else build_small_tokenizer(template)
    model = build_tiny_model(tokenizer, hidden_size=hidden_size, num_layers=num_layers, seed=seed)
    save_pretrained_pair(model, tokenizer, out)
    params = sum(p.numel() for p in model.parameters())
    console.print(f"wrote {out} ({params / 1e6:.2f}M parameters, vocab {len(tokenizer)})")
