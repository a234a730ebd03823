"""The embedded tiny model: offline tokenizer builders, tiny Qwen2 models, supervised warm start."""

from agentrl_sdk.models.cache import cache_root, cached_build
from agentrl_sdk.models.importing import ModelImportError, import_model
from agentrl_sdk.models.real import smollm2_path
from agentrl_sdk.models.templates import HERMES_TEMPLATE, QWEN3_TEMPLATE, TEMPLATES
from agentrl_sdk.models.tiny import build_tiny_model, load_pretrained_pair, save_pretrained_pair
from agentrl_sdk.models.tokenizers import (
    ADDED_TOKENS,
    QWEN_SPLIT_PATTERN,
    build_qwen_tokenizer,
    build_small_tokenizer,
)
from agentrl_sdk.models.warm_start import (
    build_sft_example,
    build_sft_examples,
    supervised_warm_start,
    train_on_sft_examples,
)

__all__ = [
    "cache_root",
    "cached_build",
    "ModelImportError",
    "import_model",
    "smollm2_path",
    "ADDED_TOKENS",
    "HERMES_TEMPLATE",
    "QWEN3_TEMPLATE",
    "QWEN_SPLIT_PATTERN",
    "TEMPLATES",
    "build_qwen_tokenizer",
    "build_small_tokenizer",
    "build_sft_example",
    "build_sft_examples",
    "build_tiny_model",
    "load_pretrained_pair",
    "save_pretrained_pair",
    "supervised_warm_start",
    "train_on_sft_examples",
]
