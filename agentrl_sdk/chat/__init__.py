"""Token-exact chat: the LangChain chat model, its token ledger, templates and tool parsers."""

from agentrl_sdk.chat.attribution import NodeTag
from agentrl_sdk.chat.context import current_node, current_recorder
from agentrl_sdk.chat.events import EventLog
from agentrl_sdk.chat.ledger import PromptPlan, TokenLedger
from agentrl_sdk.chat.model import TokenChatModel
from agentrl_sdk.chat.recorder import PendingCall, RolloutRecorder
from agentrl_sdk.chat.template import ChatTemplate
from agentrl_sdk.chat.tool_parsers import HermesToolParser, ParsedResponse, ToolParser
from agentrl_sdk.chat.turn import failure_status, record_turn

__all__ = [
    "ChatTemplate",
    "EventLog",
    "HermesToolParser",
    "NodeTag",
    "ParsedResponse",
    "PendingCall",
    "PromptPlan",
    "RolloutRecorder",
    "TokenChatModel",
    "TokenLedger",
    "ToolParser",
    "current_node",
    "current_recorder",
    "failure_status",
    "record_turn",
]
