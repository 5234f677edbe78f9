"""Canonical JSON and the conversation hash the model steps record."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from durable_agent.journal.codec import ListDigest, digest

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)
messages = st.lists(st.dictionaries(st.text(max_size=6), json_values, max_size=4), max_size=12)


@given(messages, st.lists(st.integers(min_value=0, max_value=12), max_size=6))
def test_the_running_hash_equals_the_hash_of_the_whole_list(
    items: list[dict[str, Any]], cuts: list[int]
) -> None:
    """Growing a list, cutting it short or rebuilding it: always digest(the list)."""
    running = ListDigest()
    for cut in [*cuts, len(items)]:
        prefix = items[:cut]  # a new list object holding the same items, as the loop sends
        assert running.of(prefix) == digest(prefix)


def test_a_replaced_last_item_is_hashed_again() -> None:
    running = ListDigest()
    items: list[Any] = [{"role": "user", "content": "a"}]
    assert running.of(items) == digest(items)
    items[-1] = {"role": "user", "content": "b"}
    assert running.of(items) == digest(items)
    items.append({"role": "assistant", "content": "c"})
    assert running.of(items) == digest(items)
    assert running.of([]) == digest([])
