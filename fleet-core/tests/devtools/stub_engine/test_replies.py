"""The pretend model's arithmetic, which every usage assertion elsewhere relies on."""

from __future__ import annotations

import base64
import struct

from fleet_core.devtools.stub_engine import replies
from fleet_core.devtools.stub_engine.wire import ChatMessage, PromptTokensDetails, TextPart


def test_reply_tokens_carry_their_leading_space_and_rejoin_to_the_reply() -> None:
    tokens = replies.reply_tokens("  Hello   big world ")
    assert tokens == ("Hello", " big", " world")
    assert "".join(tokens) == "Hello big world"


def test_chat_prompt_counts_words_of_string_content_and_text_parts_only() -> None:
    messages = [
        ChatMessage(role="system", content="be brief"),
        ChatMessage(
            role="user", content=[TextPart(text="one two three"), TextPart(type="image_url")]
        ),
        ChatMessage(role="assistant", content=None),
    ]
    assert replies.chat_prompt(messages) == replies.Prompt(5, False, "be brief\none two three")


def test_cached_is_a_whole_word_match() -> None:
    assert replies.text_prompt(["please use the CACHED prefix"]).cached
    assert not replies.text_prompt(["uncached prefix"]).cached


def test_token_id_prompts_count_ids() -> None:
    assert replies.text_prompt([[1, 2, 3], "a b"]).tokens == 5


def test_answer_truncates_with_length_and_otherwise_stops() -> None:
    assert replies.answer(11, None) == replies.Answer(11, "stop")
    assert replies.answer(11, 11) == replies.Answer(11, "stop")
    assert replies.answer(11, 4) == replies.Answer(4, "length")


def test_usage_reports_half_the_prompt_as_cached_only_when_cached() -> None:
    plain = replies.usage(replies.Prompt(7, cached=False), 3)
    assert (plain.prompt_tokens, plain.completion_tokens, plain.total_tokens) == (7, 3, 10)
    assert replies.usage(replies.Prompt(7, cached=True), 3).prompt_tokens_details == (
        PromptTokensDetails(cached_tokens=3)
    )


def test_embeddings_are_deterministic_distinct_and_float32_exact() -> None:
    first = replies.embedding("hello", 8)
    assert first == replies.embedding("hello", 8)
    assert first != replies.embedding("hellp", 8)
    assert len(replies.embedding("x", 3)) == 3
    packed = base64.b64decode(replies.embedding_base64(first))
    assert list(struct.unpack("<8f", packed)) == first
