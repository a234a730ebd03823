"""The weight handoff between trainer and engines: what one push carries and how it travels.

Below both engines and trainer: an engine says which kinds it takes (`WeightIntake`) and loads
a `WeightPush`; the trainer makes them (``TrainerGroup.weights``). Kinds: `StateDict` (tensors
through the caller), `SharedWeights` (files in one host's shared memory, `shared_files`),
`RayWeights` (object-store references, `object_refs`), `CollectiveWeights` (a broadcast,
`collective`) and `AdapterWeights` (LoRA tensors, `adapters`). The ways a push may take, by
the name ``trainer.weight_transport`` gives them: `TRANSPORTS` (`transports`).
"""

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
