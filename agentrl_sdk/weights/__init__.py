"""The weight handoff between trainer and engines, below both: what one push carries (`push`
lists the kinds) and the ways it may take (`TRANSPORTS`)."""

from agentrl_sdk.weights.adapters import AdapterWeights
from agentrl_sdk.weights.collective import CollectiveWeights
from agentrl_sdk.weights.object_refs import RayWeights
from agentrl_sdk.weights.push import (
    PushSize,
    StateDict,
    WeightIntake,
    WeightKind,
    WeightPush,
    cast_floating,
    size_of,
)
from agentrl_sdk.weights.shared_files import SharedWeights
from agentrl_sdk.weights.transports import TRANSPORTS, TransportName, WeightTransport

__all__ = [
    "TRANSPORTS",
    "AdapterWeights",
    "CollectiveWeights",
    "PushSize",
    "RayWeights",
    "SharedWeights",
    "StateDict",
    "TransportName",
    "WeightIntake",
    "WeightKind",
    "WeightPush",
    "WeightTransport",
    "cast_floating",
    "size_of",
]
