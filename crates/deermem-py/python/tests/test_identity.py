"""The host names the user: a ``user_id`` shaped like the storage bucket another id is kept in
(``victim@corp.com`` is stored as ``victim-corp-com-7b46e3848256709a``) is refused with a
``ValueError`` saying why, so it cannot read or write that user's memory."""

from __future__ import annotations

import pytest

VICTIM = "victim@corp.com"
VICTIM_BUCKET = "victim-corp-com-7b46e3848256709a"


def test_a_bucket_shaped_user_id_is_refused_and_the_victim_is_untouched(make):
    m = make()
    _, fid = m.create_fact("Victim likes tea", user_id=VICTIM)
    for call in (
        lambda: m.get_memory(user_id=VICTIM_BUCKET),
        lambda: m.export_memory(user_id=VICTIM_BUCKET),
        lambda: m.create_fact("Injected", user_id=VICTIM_BUCKET),
        lambda: m.get_memory(user_id=f" {VICTIM_BUCKET} "),
    ):
        with pytest.raises(ValueError, match="storage bucket derived from another user id"):
            call()
    facts = m.get_memory(user_id=VICTIM)["facts"]
    assert [f["id"] for f in facts] == [fid]
    # Bucket-like ids no other id can produce are ordinary users.
    m.create_fact("Builder fact", user_id="build-0123456789abcdef")
    assert len(m.get_memory(user_id="build-0123456789abcdef")["facts"]) == 1
