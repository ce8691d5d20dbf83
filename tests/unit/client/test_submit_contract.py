"""``Client.submit`` and ``Client.abort`` check the input contract before sending (issue 25 item 1).

Before the fix ``submit`` sent empty or repeated tool names (the worker rejected them later), and a conversation id
holding a lone surrogate failed with a ``UnicodeEncodeError`` that named no field. The client is built on an
unreachable bootstrap address (nothing connects before the first request), so a check that let a bad record through
would fail with a broker error or a timeout, not the ``ValueError`` asserted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from settled._settings import Settings
from settled.client import Client


@pytest.fixture
def client() -> Iterator[Client]:
    with Client(Settings(kafka_bootstrap="127.0.0.1:1", namespace="unit"), default_timeout_s=1.0) as c:
        yield c


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"conversation_id": "conv\ud800"}, "^conversation_id contains a lone surrogate U\\+D800 at index 4: "),
        ({"conversation_id": "c\x00"}, "^conversation_id contains a NUL character at index 1: "),
        ({"conversation_id": "c" * 257}, "^conversation_id is longer than 256 characters"),
        ({"conversation_id": "~partition/0"}, "^conversation_id starts with the reserved prefix"),
        ({"idempotency_key": "k\udcff"}, "^idempotency_key contains a lone surrogate U\\+DCFF at index 1"),
        ({"principal": "p\n"}, "^principal contains the control character U\\+000A at index 1"),
        ({"tools_offered": ["a", "a"]}, "^payload.tools_offered name 1 repeats an earlier name: 'a'"),
        ({"tools_offered": ["a", ""]}, "^payload.tools_offered name 1 is empty"),
        ({"tools_offered": ["a", "b\x00"]}, "^payload.tools_offered name 1 contains a NUL character"),
        ({"lane": "newest"}, "^lane must be one of queue, join, reject, interrupt, keep_newest, got 'newest'"),
    ],
)
def test_submit_names_the_field_that_breaks_the_contract(client: Client, args: dict[str, Any], message: str) -> None:
    conversation = args.pop("conversation_id", "conv")
    with pytest.raises(ValueError, match=message):
        client.submit(conversation, {"x": 1}, **args)


def test_abort_names_the_field_that_breaks_the_contract(client: Client) -> None:
    with pytest.raises(ValueError, match=r"^submission_id contains a NUL character at index 1"):
        client.abort("conv", "s\x00")
    with pytest.raises(ValueError, match=r"^reason contains a lone surrogate U\+DC80 at index 0"):
        client.abort("conv", "s1", reason="\udc80")
