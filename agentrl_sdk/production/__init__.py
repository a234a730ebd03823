"""Learning from production: MLflow traces and their feedback as training data.

`traces` selects traces (experiment, time range, tags, an MLflow filter), reads each one's
reward from its feedback or a function, and returns a `TraceSelection`: its records' exact
token ledgers as training samples, or their inputs as dataset rows to replay.
"""

from agentrl_sdk.production.feedback import LeftOutReason, RewardFn, RewardSpec, feedback_number
from agentrl_sdk.production.reading import read_trace
from agentrl_sdk.production.records import TraceRecord, TracedCall
from agentrl_sdk.production.redact import Redact, drop_matching, redact_text
from agentrl_sdk.production.replay import RowFn, replay_row
from agentrl_sdk.production.rescoring import RolloutReward, rollout_reward
from agentrl_sdk.production.selection import TraceSelection, traces
from agentrl_sdk.production.tokens import check_tokenizer, training_batch, training_samples

__all__ = [
    "LeftOutReason",
    "Redact",
    "RewardFn",
    "RewardSpec",
    "RolloutReward",
    "RowFn",
    "TraceRecord",
    "TraceSelection",
    "TracedCall",
    "check_tokenizer",
    "drop_matching",
    "feedback_number",
    "read_trace",
    "redact_text",
    "replay_row",
    "rollout_reward",
    "traces",
    "training_batch",
    "training_samples",
]
