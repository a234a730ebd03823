"""The ``agentrl`` command: train, evaluate, serve the recording gateway, inspect rollouts and
traces, build tiny models."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from agentrl_sdk.config_errors import describe_validation_error
from agentrl_sdk.types import Trajectory

if TYPE_CHECKING:
    from agentrl_sdk.pipeline import TrainConfig
    from agentrl_sdk.serving import ServedTraces

app = typer.Typer(help="agentrl: train LangGraph agents with RL, token-exact.", no_args_is_help=True)
console = Console()
errors = Console(stderr=True, highlight=False)


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

    cfg = _load_config(config)
    if steps:
        cfg.max_steps = steps
    job = resolve_entrypoints(cfg)
    with _refused_input():
        result = run_training(job.graph, job.dataset, job.reward, cfg, input_fn=job.input_fn,
                              eval_dataset=job.eval_dataset)  # fmt: skip
    curve = ", ".join(f"{m['reward/mean']:.3f}" for m in result.history)
    console.print(f"reward per step: {curve}")
    console.print(f"MLflow run {result.run_id} · final model {result.final_model}")


@app.command()
def evaluate(
    config: Annotated[Path, typer.Argument(help="Config YAML (with an entrypoint section).")],
    model: Annotated[Path | None, typer.Option(help="Evaluate this model folder instead of the config's (e.g. a final_model).")] = None,
    dataset: Annotated[str | None, typer.Option(help="Rows to evaluate on (default: entrypoint.eval_dataset, else entrypoint.dataset).")] = None,
    output: Annotated[Path | None, typer.Option(help="Also write the scored trajectories here as JSON lines (`agentrl show` reads them).")] = None,
) -> None:
    """Evaluate the config's graph and reward on held-out rows: reward, pass@k, statuses."""
    from agentrl_sdk.api import evaluate as run_eval
    from agentrl_sdk.entrypoints import load_dataset_reference, resolve_entrypoints

    cfg = _load_config(config)
    job = resolve_entrypoints(cfg)
    rows = load_dataset_reference(dataset) if dataset else (job.eval_dataset or job.dataset)
    with _refused_input():
        result = run_eval(job.graph, rows, job.reward, cfg, input_fn=job.input_fn, model=model)
    table = Table("metric", "value", title=f"evaluation of {model or cfg.model.path}")
    for name, value in sorted(result.metrics.items()):
        table.add_row(name, f"{value:.4g}")
    console.print(table)
    if output:
        output.write_text("".join(t.model_dump_json() + "\n" for t in result.trajectories))
        console.print(f"wrote {len(result.trajectories)} trajectories to {output}")
    if result.run_id:
        console.print(f"MLflow run {result.run_id}")


@app.command()
def gateway(
    model_dir: Annotated[Path, typer.Argument(help="Local model folder (save_pretrained, with tokenizer).")],
    backend: Annotated[str, typer.Option(help="Engine backend: torch, vllm or vllm-server.")] = "torch",
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0: a free one).")] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar="AGENTRL_GATEWAY_API_KEY", help="Bearer token (default: a random one, printed).")] = None,
    auth: Annotated[bool, typer.Option(help="Require the bearer token.")] = True,
    model_name: Annotated[str, typer.Option(help="Model name clients ask for.")] = "agentrl",
    max_tokens: Annotated[int, typer.Option(help="Default most tokens per answer.")] = 256,
    temperature: Annotated[float, typer.Option(help="Default sampling temperature.")] = 1.0,
    max_context_tokens: Annotated[int, typer.Option(help="Prompt plus answer budget per call.")] = 4096,
    max_client_rollouts: Annotated[int | None, typer.Option(help="Most rollouts open at once; more answer 429 (default 256).")] = None,
    client_rollout_ttl: Annotated[float | None, typer.Option(help="Seconds without a request after which a rollout is dropped (default 600).")] = None,
    max_request_bytes: Annotated[int | None, typer.Option(help="Largest request body; larger ones answer 413 unparsed (default 2 MiB).")] = None,
    i_know_its_open: Annotated[bool, typer.Option("--i-know-its-open", help="Allow --no-auth on a non-loopback --host (anyone who reaches the port can use it).")] = False,
    tracking_uri: Annotated[str | None, typer.Option(help="Write an MLflow trace of each rollout a client closes to this store (default: no traces).")] = None,
    experiment: Annotated[str, typer.Option(help="MLflow experiment of those traces.")] = "agentrl-gateway",
) -> None:
    """Serve MODEL_DIR as an OpenAI-compatible API that records every call token by token.

    Each rollout has its own base URL, ``/rollouts/<id>/v1`` (any new id opens a rollout), or
    sends ``X-Rollout-Id`` to ``/v1``; ``POST /rollouts/<id>/reward`` adds a reward and
    ``DELETE /rollouts/<id>`` closes it and returns its trajectory (ids, masks, logprobs).
    Idle rollouts are dropped after ``--client-rollout-ttl`` seconds; ``/health`` counts them.
    With ``--tracking-uri``, each closed rollout's token ledger is also written as an MLflow
    trace in the background (``sdk.traces`` reads it back).
    """
    import asyncio

    from agentrl_sdk.config import ChatConfig, RolloutConfig
    from agentrl_sdk.gateway import GatewayConfig
    from agentrl_sdk.gateway.standalone import serve_model
    from agentrl_sdk.types import SamplingParams

    limits = {"max_client_rollouts": max_client_rollouts, "max_request_bytes": max_request_bytes,
              "client_rollout_ttl_s": client_rollout_ttl}
    try:
        config = GatewayConfig(
            host=host, port=port, auth=auth, api_key=api_key if auth else None,
            models={model_name: "default"}, open_on_first_call=True,
            allow_unauthenticated_remote=i_know_its_open,
            **{name: value for name, value in limits.items() if value is not None},
        )
    except ValidationError as exc:
        _usage_error(describe_validation_error(exc, GatewayConfig, source="agentrl gateway"))
    rollout = RolloutConfig(
        sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature),
        chat=ChatConfig(max_context_tokens=max_context_tokens),
    )

    def ready(gw) -> None:
        console.print(f"recording gateway on [bold]{gw.url}[/] · model {model_name!r} · "
                      f"base URL {gw.rollout_url('<rollout-id>')} · Ctrl-C stops")
        if config.open_to_anyone:
            errors.print(f"[bold red]WARNING: no auth on {host}: anyone who can reach port "
                         f"{gw.port} can use this model and read its rollouts.[/]")
        if gw.api_key and api_key is None:
            console.print(f"API key: {gw.api_key}")

    traces = _gateway_traces(model_dir, tracking_uri, experiment) if tracking_uri else None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        asyncio.run(serve_model(str(model_dir), backend=backend, config=config, rollout=rollout,
                                on_ready=ready,
                                on_client_close=traces.record_rollout if traces else None))
    except KeyboardInterrupt:
        pass
    finally:
        if traces is not None:
            counts = traces.close()
            console.print(", ".join(f"{k} {v}" for k, v in counts.items()), markup=False)


def _gateway_traces(model_dir: Path, tracking_uri: str, experiment: str) -> ServedTraces:
    """The background trace writer of `agentrl gateway --tracking-uri` (exit 2 when the store
    cannot be reached)."""
    from transformers import AutoTokenizer

    from agentrl_sdk.errors import TrackingError
    from agentrl_sdk.serving import ServedTraces, open_experiment

    try:
        experiment_id = open_experiment(tracking_uri, experiment)
    except TrackingError as exc:
        _usage_error(str(exc))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return ServedTraces(tracking_uri, experiment_id, tokenizer)


@app.command()
def serve(
    config: Annotated[Path, typer.Argument(help="Training config YAML (entrypoint.graph, model, engine, rollout, tracking).")],
    model: Annotated[Path | None, typer.Option(help="Serve this model folder instead of the config's (e.g. a final_model).")] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0: a free one).")] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar="AGENTRL_SERVE_API_KEY", help="Bearer token /invoke requires (default: none, loopback only).")] = None,
    experiment: Annotated[str | None, typer.Option(help="MLflow experiment of the traces (default: tracking.experiment).")] = None,
    i_know_its_open: Annotated[bool, typer.Option("--i-know-its-open", help="Allow a non-loopback --host without --api-key (anyone who reaches the port can run the graph).")] = False,
) -> None:
    """Serve the config's graph over HTTP, one MLflow trace per request.

    ``POST /invoke`` with ``{"input": <graph input>}`` runs the graph once on the config's
    model (``model.path``, the ``engine`` backend, ``rollout`` sampling) and answers its output
    and ``trace_id``. Each trace holds the request's token ledger and goes to
    ``tracking.uri`` (none with ``tracking.enabled: false``), written in the background;
    ``GET /health`` counts requests and traces written, pending, dropped and lost.
    """
    from agentrl_sdk.entrypoints import resolve_graph
    from agentrl_sdk.pipeline.policies import model_path
    from agentrl_sdk.serving import ServeConfig
    from agentrl_sdk.serving import serve as serve_graph

    cfg = _load_config(config)
    if cfg.rollout.timeout_s is None:
        _usage_error("rollout.timeout_s must be set to serve: a request may not run without "
                     "a time limit")
    try:
        settings = ServeConfig(
            host=host, port=port, api_key=api_key, allow_unauthenticated_remote=i_know_its_open,
            tracking_uri=cfg.tracking.uri if cfg.tracking.enabled else None,
            experiment=experiment or cfg.tracking.experiment,
        )
        graph = resolve_graph(cfg)
        path = str(model) if model is not None else model_path(cfg.model)
    except ValidationError as exc:
        _usage_error(describe_validation_error(exc, ServeConfig, source="agentrl serve"))
    except ValueError as exc:
        _usage_error(str(exc))

    def ready(server) -> None:
        traces = (f"traces to {settings.tracking_uri} (experiment {settings.experiment!r})"
                  if settings.tracking_uri else "no traces")
        console.print(f"serving on {server.url} · POST /invoke · {traces} · Ctrl-C stops",
                      markup=False, highlight=False, soft_wrap=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with _refused_input():
        serve_graph(graph, path, config=settings, rollout=cfg.rollout,
                    backend=cfg.engine.backend, engine_options=cfg.engine.create_kwargs(),
                    on_ready=ready)


DEFAULT_URI = "sqlite:///mlflow.db"
"""The tracking store `TrackingConfig` writes to by default."""


@app.command()
def inspect(
    trace_id: Annotated[str | None, typer.Argument(help="Show this trace; list traces when omitted.")] = None,
    uri: Annotated[str, typer.Option(help="MLflow tracking URI (sqlite file or server).")] = DEFAULT_URI,
    config: Annotated[Path | None, typer.Option(help="Take the URI from this training config's tracking section.")] = None,
    experiment: Annotated[str | None, typer.Option(help="Experiment name (default: all).")] = None,
    run: Annotated[str | None, typer.Option(help="Training run id: only its traces.")] = None,
    step: Annotated[int | None, typer.Option(help="Only traces of this training step.")] = None,
    status: Annotated[str | None, typer.Option(help="Only this status (ok, graph_error, ...).")] = None,
    row: Annotated[str | None, typer.Option(help="Only this dataset row id.")] = None,
    phase: Annotated[str | None, typer.Option(help="Only training (train) or evaluation (eval) rollouts.")] = None,
    kind: Annotated[str | None, typer.Option(help="Only rollout traces (rollout) or tree rollouts' whole trees (tree).")] = None,
    limit: Annotated[int, typer.Option(help="List at most this many traces.")] = 50,
    html: Annotated[Path | None, typer.Option(help="Also write the trace as a self-contained HTML page.")] = None,
    prompt: Annotated[bool, typer.Option(help="Print prompt tokens too.")] = True,
) -> None:
    """List rollout traces (reward, status) or show one: tokens by mask and advantage, spans,
    tool calls and errors."""
    from agentrl_sdk.tracing import load_trace_view, render_trace, search_rollout_traces, trace_html
    from agentrl_sdk.tracing.terminal import plain

    uri = _tracking_uri(uri, config)
    if trace_id is None:
        if html is not None:
            raise typer.BadParameter("--html needs a TRACE_ID (list traces first)")
        infos = search_rollout_traces(uri, experiment=experiment, run_id=run, step=step,
                                      status=status, row_id=row, phase=phase, kind=kind,
                                      limit=limit)  # fmt: skip
        table = Table(title=plain(f"{len(infos)} rollout traces in {uri}"))
        table.add_column("trace", no_wrap=True, min_width=35)
        for name in ("step", "phase", "row", "sample", "status", "reward", "advantage",
                     "versions", "ms"):
            table.add_column(name)
        for info in infos:
            t = info.tags
            sample = f"tree {t.get('tree_path')}" if t.get("kind") == "tree" else t.get(
                "sample_index")  # a tree rollout's whole tree
            cells = (info.trace_id, t.get("step"), t.get("phase", "train"), t.get("row_id"),
                     sample, t.get("status"), t.get("reward"), t.get("advantage"),
                     t.get("policy_versions"), info.execution_duration)
            table.add_row(*map(plain, cells))  # tags carry dataset text: shown, never obeyed
        console.print(table)
        return
    view = load_trace_view(uri, trace_id)
    console.print(render_trace(view, show_prompt=prompt))
    if html is not None:
        html.write_text(trace_html(view), encoding="utf-8")
        console.print(f"wrote {html}")


@app.command()
def ui(
    uri: Annotated[str, typer.Option(help="MLflow tracking URI of the project's store.")] = DEFAULT_URI,
    config: Annotated[Path | None, typer.Option(help="Take the URI from this training config's tracking section.")] = None,
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1.")] = 5000,
) -> None:
    """Serve the MLflow UI on 127.0.0.1 over the project's store and print the link."""
    from agentrl_sdk.tracing import MlflowServer

    server = MlflowServer(_tracking_uri(uri, config), port=port)
    console.print(f"starting: {' '.join(server.command())}")
    # The server runs in its own session: stop it on SIGTERM as on Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.start()
    try:
        server.wait()
        console.print(f"MLflow UI: [bold]{server.url}[/] (traces: Experiments → Traces) · Ctrl-C stops")
        server.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def _tracking_uri(uri: str, config: Path | None) -> str:
    return uri if config is None else _load_config(config).tracking.uri


def _load_config(path: Path) -> TrainConfig:
    """The training config at ``path``; a bad one ends the command with exit code 2 and one
    line per problem (field path, message, value given), never a traceback."""
    import yaml

    from agentrl_sdk.pipeline import TrainConfig

    try:
        return TrainConfig.from_yaml(path)
    except ValueError as exc:
        cause = exc.__cause__
        _usage_error(describe_validation_error(cause, TrainConfig, source=str(path))
                     if isinstance(cause, ValidationError) else str(exc))
    except (OSError, yaml.YAMLError) as exc:
        _usage_error(f"{path}: cannot read the config: {exc}")


@contextlib.contextmanager
def _refused_input() -> Iterator[None]:
    """A dataset refused when it loads (bad rows under ``data.on_bad_row: raise``, or none
    usable), an unreachable tracking URI or a checkpoint that cannot be resumed end the
    command like a bad config: its message, exit code 2."""
    from agentrl_sdk.data import DatasetError
    from agentrl_sdk.errors import CheckpointError, TrackingError

    try:
        yield
    except (DatasetError, TrackingError, CheckpointError) as exc:
        _usage_error(str(exc))


def _usage_error(message: str) -> NoReturn:
    """Print ``message`` to stderr and exit with code 2 (the user's input is at fault)."""
    errors.print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(2)


@app.command("build-model")
def build_model(
    out: Annotated[Path, typer.Argument(help="Folder to write (save_pretrained layout).")],
    vocab: Annotated[str, typer.Option(help="'qwen' (real Qwen BPE) or 'small' (1k BPE).")] = "small",
    template: Annotated[str, typer.Option(help="'hermes' or 'qwen3' chat template.")] = "hermes",
    hidden_size: Annotated[int, typer.Option(help="Width of the residual stream (a multiple of 4, the head count).")] = 64,
    num_layers: Annotated[int, typer.Option(help="Decoder layers.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the random weights: the same seed, the same model.")] = 0,
) -> None:
    """Build a tiny random Qwen2-architecture model and its tokenizer, offline."""
    from agentrl_sdk.models import (
        build_qwen_tokenizer, build_small_tokenizer, build_tiny_model, save_pretrained_pair,
    )  # fmt: skip

    tokenizer = (build_qwen_tokenizer if vocab == "qwen" else build_small_tokenizer)(template)
    model = build_tiny_model(tokenizer, hidden_size=hidden_size, num_layers=num_layers, seed=seed)
    save_pretrained_pair(model, tokenizer, out)
    params = sum(p.numel() for p in model.parameters())
    console.print(f"wrote {out} ({params / 1e6:.2f}M parameters, vocab {len(tokenizer)})")


@app.command("import-model")
def import_model_command(
    src: Annotated[Path, typer.Argument(help="A .gguf file, or a local HF causal-LM folder.")],
    out: Annotated[Path, typer.Argument(help="Folder to write (save_pretrained layout); new or empty.")],
    dtype: Annotated[str, typer.Option(help="Weight dtype: float32, bfloat16 or float16.")] = "float32",
    overwrite: Annotated[bool, typer.Option(help="Write into a non-empty OUT.")] = False,
) -> None:
    """Import a GGUF file (dequantized) or an HF folder as a folder both engines load."""
    import json
    import time

    from agentrl_sdk.models import ModelImportError, import_model

    started = time.perf_counter()
    try:
        import_model(src, out, dtype=dtype, overwrite=overwrite)  # type: ignore[arg-type]
    except ModelImportError as exc:
        _usage_error(f"import-model: {exc}")
    config = json.loads((out / "config.json").read_text())
    eos = json.loads((out / "generation_config.json").read_text()).get("eos_token_id")
    files = sorted(p for p in out.iterdir() if p.is_file())
    size = sum(p.stat().st_size for p in files)
    console.print(
        f"wrote {out} in {time.perf_counter() - started:.1f}s: {config.get('architectures')} "
        f"{config.get('model_type')}, {config.get('num_hidden_layers')} layers, vocab "
        f"{config.get('vocab_size')}, {dtype}, eos ids {eos}, {size / 1e6:.0f} MB"
    )
    for path in files:
        console.print(f"  {path.name}  {path.stat().st_size / 1e6:.2f} MB")
