"""Serving that records: a graph served over HTTP, one MLflow trace per request.

`serve` (and ``agentrl serve``) runs a LangGraph graph, or an OpenAI-speaking agent function,
behind ``POST /invoke``; every request's token ledger (prompt ids, sampled ids, logprobs,
mask, policy version, tokenizer identity) becomes an MLflow trace, written in the background,
that `agentrl_sdk.traces` reads back as training data.
"""

from agentrl_sdk.serving.config import ServeConfig
from agentrl_sdk.serving.run import aserve, serve
from agentrl_sdk.serving.server import GraphServer, Served
from agentrl_sdk.serving.traces import ServedTraces, open_experiment

__all__ = ["GraphServer", "ServeConfig", "Served", "ServedTraces", "aserve", "open_experiment",
           "serve"]
