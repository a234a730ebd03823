"""``agentrl serve CONFIG``: the config's graph on its model, served until Ctrl-C, each request
traced into the config's tracking store; bad input exits 2 with one line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
import yaml
from typer.testing import CliRunner

import agentrl_sdk as sdk
from agentrl_sdk.cli import app
from agentrl_sdk.tracing.server import free_port
from tests.serving.conftest import ensure_experiment

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(tmp_path, model_dir, uri, **extra):
    config = {
        "model": {"path": model_dir},
        "entrypoint": {"graph": "tests.serving.conftest:two_call_graph"},
        "rollout": {"sampling": {"max_tokens": 8}, "timeout_s": 60},
        "tracking": {"uri": uri, "experiment": "cli"},
        **extra,
    }
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_agentrl_serve_traces_each_request_into_the_configs_store(tmp_path, model_dir, store):
    ensure_experiment(store, "cli")
    config = _config(tmp_path, model_dir, store)
    env = {**os.environ, "PYTHONPATH": ROOT, "COLUMNS": "300"}
    process = subprocess.Popen(
        [sys.executable, "-c", "from agentrl_sdk.cli import app; app()", "serve", str(config),
         "--port", "0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, url = time.monotonic() + 120, None
        while url is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            assert line, f"agentrl serve exited with {process.wait()}"
            found = re.search(r"serving on (http://127\.0\.0\.1:\d+)", line)
            url = found and found.group(1)
        reply = httpx.post(f"{url}/invoke", timeout=60, json={
            "input": {"messages": [{"role": "user", "content": "hi"}]}})
    finally:
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=60)
    assert reply.status_code == 200 and reply.json()["status"] == "ok"
    assert process.returncode == 0, rest
    [record] = sdk.traces(store, experiment="cli").records  # written before the exit
    assert record.trace_id == reply.json()["trace_id"] and record.tags["model"] == model_dir
    assert len(record.calls) == 2


def test_bad_input_exits_2_with_one_line(tmp_path, model_dir):
    runner = CliRunner()
    no_limit = _config(tmp_path, model_dir, "sqlite:///x.db", rollout={"timeout_s": None})
    result = runner.invoke(app, ["serve", str(no_limit)])
    assert result.exit_code == 2 and "rollout.timeout_s must be set" in result.output
    config = _config(tmp_path, model_dir, "sqlite:///x.db")
    result = runner.invoke(app, ["serve", str(config), "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "not a loopback address" in result.output
    assert "Traceback" not in result.output
    dead = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["gateway", model_dir, "--tracking-uri", dead])
    assert result.exit_code == 2 and f"cannot open MLflow experiment 'agentrl-gateway' at " \
        f"'{dead}'" in " ".join(result.output.split())
