"""The signature on the messages the service sends itself (models.security.signing): what it
covers, key rotation, and what a worker's check says of each way it can fail. That the
real pools drop what fails is in test_attacks."""

from __future__ import annotations

import pytest
from keyrings import key, ring

from models.security.signing import sign, verify

MESSAGE = ("whisperq.infer", [{"job_id": "0a0a0a0a-0000-4000-8000-00000000abcd", "windows": [[0, 16000]]}], {})


def test_a_signature_holds_for_its_task_and_arguments_only():
    keys = ring(key("k1"))
    token = sign(*MESSAGE, keyring=keys)
    assert token.startswith("wqm1:k1:")
    assert verify(token, *MESSAGE, keyring=keys) is None
    task, args, kwargs = MESSAGE
    assert verify(token, "whisperq.shadow", args, kwargs, keyring=keys) == "bad signature"
    other = [{**args[0], "job_id": "0b0b0b0b-0000-4000-8000-00000000abcd"}]
    assert verify(token, task, other, kwargs, keyring=keys) == "bad signature"
    assert verify(token, task, args, {"prompt": "mine"}, keyring=keys) == "bad signature"
    # as JSON carries them: a tuple arrives a list, dict keys in any order
    assert verify(token, task, (args[0],), kwargs, keyring=keys) is None


@pytest.mark.parametrize(
    "token, why",
    [
        (None, "unsigned"),
        ("", "unsigned"),
        ("wqm1:k1", "malformed signature"),
        ("hmac:k1:AAAA", "malformed signature"),
        ("wqm1:nope:" + "A" * 44, "signed with a key this deployment does not have"),
        ("wqm1:k1:not base64!", "signed with a key this deployment does not have"),
        ("wqm1:k1:" + "A" * 43 + "=", "bad signature"),
    ],
)
def test_each_way_a_signature_fails_is_named(token, why):
    assert verify(token, *MESSAGE, keyring=ring(key("k1"))) == why


def test_messages_signed_before_a_rotation_verify_while_the_old_key_is_configured():
    old, new = key("old"), key("new")
    before = ring(old)
    token = sign(*MESSAGE, keyring=before)
    rotated = ring(new, old)  # the new key active, the old one still configured
    assert verify(token, *MESSAGE, keyring=rotated) is None
    assert sign(*MESSAGE, keyring=rotated).startswith("wqm1:new:")
    assert verify(token, *MESSAGE, keyring=ring(new)) == "signed with a key this deployment does not have"
    # another deployment's key of the same id does not verify
    assert verify(token, *MESSAGE, keyring=ring(key("old"))) == "bad signature"
