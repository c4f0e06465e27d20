"""split_reasoning: every place providers put a model's reasoning."""

from __future__ import annotations

from clotho.chat.reasoning import split_reasoning


def test_reasoning_content_field() -> None:
    message = {"role": "assistant", "content": "42", "reasoning_content": "6 times 7"}
    assert split_reasoning(message) == ("6 times 7", "42")


def test_reasoning_field() -> None:
    message = {"role": "assistant", "content": "42", "reasoning": "six sevens"}
    assert split_reasoning(message) == ("six sevens", "42")


def test_reasoning_details_texts_are_joined() -> None:
    message = {
        "role": "assistant",
        "content": "42",
        "reasoning_details": [
            {"type": "reasoning.text", "text": "first step"},
            {"type": "reasoning.encrypted", "data": "opaque"},  # no text: skipped
            {"type": "reasoning.text", "text": "second step"},
            "not a dict",
        ],
    }
    assert split_reasoning(message) == ("first step\nsecond step", "42")


def test_reasoning_details_without_text_is_no_reasoning() -> None:
    message = {"content": "42", "reasoning_details": [{"type": "reasoning.encrypted"}]}
    assert split_reasoning(message) == (None, "42")


def test_think_block_is_moved_out_of_the_content() -> None:
    message = {"role": "assistant", "content": "<think>\nlet me see\n</think>\n\nThe answer is 42."}
    assert split_reasoning(message) == ("let me see", "The answer is 42.")


def test_several_think_blocks_are_all_removed() -> None:
    message = {"content": "<think>one</think>middle <think>two</think> end"}
    reasoning, content = split_reasoning(message)
    assert reasoning == "one\ntwo"
    assert content == "middle  end"
    assert "think>" not in content


def test_unclosed_think_block_is_all_reasoning() -> None:
    message = {"content": "<think>still thinking when the tokens ran out"}
    assert split_reasoning(message) == ("still thinking when the tokens ran out", "")


def test_lone_closing_think_tag() -> None:
    # Templates that open <think> in the prompt make the model generate only the closing tag.
    message = {"content": "thinking it over\n</think>\n\nFinal answer."}
    assert split_reasoning(message) == ("thinking it over", "Final answer.")


def test_lone_closing_tag_with_nothing_before_it() -> None:
    assert split_reasoning({"content": "</think>Only the answer."}) == (None, "Only the answer.")


def test_reasoning_field_wins_but_think_is_still_removed() -> None:
    message = {
        "content": "<think>inline thoughts</think>Answer.",
        "reasoning_content": "structured thoughts",
    }
    assert split_reasoning(message) == ("structured thoughts", "Answer.")


def test_order_of_preference() -> None:
    both = {"content": "x", "reasoning_content": "from rc", "reasoning": "from r"}
    assert split_reasoning(both)[0] == "from rc"
    details = {"content": "x", "reasoning": "from r", "reasoning_details": [{"text": "from d"}]}
    assert split_reasoning(details)[0] == "from r"
    empty_rc = {"content": "x", "reasoning_content": "", "reasoning": "from r"}
    assert split_reasoning(empty_rc)[0] == "from r"


def test_no_reasoning() -> None:
    assert split_reasoning({"role": "assistant", "content": "plain answer"}) == (
        None,
        "plain answer",
    )
    assert split_reasoning({"role": "assistant", "content": None, "tool_calls": []}) == (
        None,
        None,
    )
    assert split_reasoning({"role": "assistant"}) == (None, None)


def test_content_parts_are_joined_and_searched() -> None:
    message = {
        "content": [
            {"type": "text", "text": "<think>parts"},
            {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": " too</think>done"},
        ]
    }
    assert split_reasoning(message) == ("parts too", "done")


def test_non_string_reasoning_is_ignored() -> None:
    assert split_reasoning({"content": "a", "reasoning": {"summary": "x"}}) == (None, "a")
