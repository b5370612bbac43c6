"""The no-tokenizer estimate is an upper bound of real tokenizers, for every script.

No model's ``tokenizer.json`` ships offline, so the tokenizers here are built with the
``tokenizers`` library in the two shapes open models use: byte-level BPE (GPT-2, Llama 3, Qwen),
trained on a small multilingual text and also with no merges at all (the worst case: one token
per byte), and SentencePiece-style BPE with byte fallback and a word marker (Llama 2, Mistral).
The old estimate, four characters a token, fails all of them on digits and punctuation.
"""

from __future__ import annotations

import functools

from hypothesis import example, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from fleet_core.gateway.metering.counting import estimate_tokens

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 20,
    "Привет, мир! Как дела? " * 20,
    "漢字かな交じり文、中文句子。한국어 문장입니다. " * 20,
    "def f(x): return [i ** 2 for i in range(x)]  # code\n" * 20,
    "3.14159 2.71828 1234567890 +-*/=%$#@!&^ " * 20,
]


@functools.cache
def byte_level(merges: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000 if merges else 256,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    return tokenizer


@functools.cache
def sentencepiece_like() -> Tokenizer:
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for word in ("▁", "▁the", "▁a", "e", "t", "▁de", "s"):
        vocab[word] = len(vocab)
    merges = [("▁", "the"), ("▁", "a"), ("▁", "de")]
    merges = [m for m in merges if "".join(m) in vocab and all(p in vocab for p in m)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    return tokenizer


def counted(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=300)


@settings(max_examples=300, deadline=None)
@given(TEXT)
@example("1234567890" * 20)  # digits: the stream the engine counted as 200, billed as 50
@example("!?.,;:" * 30)
@example("漢" * 600)
@example("a")
def test_the_estimate_is_at_least_every_tokenizers_count(text: str) -> None:
    estimate = estimate_tokens(text)
    for tokenizer in (byte_level(True), byte_level(False), sentencepiece_like()):
        assert estimate >= counted(tokenizer, text), (text, estimate, counted(tokenizer, text))


def test_the_old_rule_of_thumb_was_low_for_digits() -> None:
    digits = "1234567890" * 20
    assert (len(digits) + 3) // 4 < counted(byte_level(False), digits)
    assert estimate_tokens(digits) >= counted(byte_level(False), digits)
