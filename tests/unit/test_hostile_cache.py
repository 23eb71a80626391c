"""Hostile: a tenant with /status rights forges what stoker once read back from status, and a tenant who
re-creates another's VLLMService by name reaches for its retained compile cache (issue 35, findings 2
and 6). Decisions come from what the operator signed on the claim or observed itself; status is output."""

from __future__ import annotations

import copy
import os
from pathlib import Path

from stoker.api import VLLMService
from stoker.controller.decide import Outcome, decide_children, decide_status, trusted_body
from stoker.controller.objects import facts_json
from stoker.controller.ownership import proven_seed
from stoker.inpod import seed
from stoker.render import cache_key, short_cache_key
from tests.unit.test_decide import KEY, NOW, QWEN_FACTS, body, converged, seeded_claim, snapshot

CLAIM = ("PersistentVolumeClaim", "llm-cache")


def forged_status(svc: VLLMService) -> dict:
    """Everything a tenant could write to say the cache is seeded for the current key."""
    return {
        "cache": {
            "key": cache_key(svc),
            "seededKey": cache_key(svc),
            "seededAt": NOW,
            "claimUid": "llm-cache",
        },
        "startup": {
            "seed": {"cacheKey": short_cache_key(svc)},
            "model": {**QWEN_FACTS, "checkpointBytes": 1 << 45},
            "modelCacheKey": short_cache_key(svc),
        },
    }


def test_a_forged_seeded_key_never_skips_the_seed():
    obj = body()
    svc = VLLMService.model_validate(obj)
    obj["status"] = forged_status(svc)
    children = converged(obj)
    plan = decide_children(snapshot(obj, children))
    assert not plan.seeded and plan.gate_closed
    assert [w.desired["kind"] for w in plan.writes] == ["Job"]  # the seed runs
    assert plan.cache == {}
    # Nothing was signed on the claim for the forged key.
    assert all(w.desired["kind"] != "PersistentVolumeClaim" for w in plan.writes)
    assert proven_seed(children[CLAIM], KEY, "svc-uid") is None
    status = decide_status(snapshot(obj, children), plan, Outcome(children, []), None).status
    assert status["cache"] == {"key": cache_key(svc)}  # the forged fields are written over
    seeded = next(c for c in status["conditions"] if c["type"] == "CacheSeeded")
    assert seeded["status"] == "False"


def test_a_forged_seeded_at_is_replaced_by_the_time_the_operator_signed():
    obj = body()
    children = converged(obj)
    seeded_claim(obj, children)
    obj["status"] = {"cache": {"seededAt": "2000-01-01T00:00:00Z", "claimUid": "another"}}
    plan = decide_children(snapshot(obj, children))
    assert plan.seeded and plan.cache["seededAt"] == "2026-11-26T09:00:00Z"
    assert plan.cache["claimUid"] == children[CLAIM]["metadata"]["uid"]


def test_forged_model_facts_are_replaced_by_what_the_operator_read():
    obj = body()
    svc = VLLMService.model_validate(obj)
    obj["status"] = forged_status(svc)
    children = converged(obj)
    # Signed on the claim with this service's seed: those, whatever status says.
    claim = seeded_claim(obj, children, facts_json(QWEN_FACTS))
    known = trusted_body(obj, svc, claim, KEY, None)
    assert known["status"]["startup"]["model"] == QWEN_FACTS
    assert known["status"]["startup"]["seed"] == obj["status"]["startup"]["seed"]  # the rest untouched
    # Not signed yet: what the operator's own recorder read from the seed's log, else none at all.
    unsigned = copy.deepcopy(converged(obj))[CLAIM]
    recorded = {**QWEN_FACTS, "layers": 23}
    assert (
        trusted_body(obj, svc, unsigned, KEY, facts_json(recorded))["status"]["startup"]["model"] == recorded
    )
    assert "model" not in trusted_body(obj, svc, unsigned, KEY, None)["status"]["startup"]
    # Facts signed for another owner of the claim (before it was taken over) are not this service's.
    other = seeded_claim(obj, copy.deepcopy(children), facts_json(QWEN_FACTS), owner="admins-uid")
    assert "model" not in trusted_body(obj, svc, other, KEY, None)["status"]["startup"]


def retained_from_another_owner(obj: dict) -> dict:
    """The children as converged, the claim retained from a deleted VLLMService of this name (another
    uid) that had seeded it for the same key."""
    admins = converged({**obj, "metadata": {**obj["metadata"], "uid": "admins-uid"}})
    seeded_claim(obj, admins, facts_json(QWEN_FACTS), owner="admins-uid")
    return {**converged(obj), CLAIM: admins[CLAIM]}


def test_a_service_recreated_by_name_does_not_get_the_retained_claim():
    obj = body()
    plan = decide_children(snapshot(obj, retained_from_another_owner(obj)))
    assert plan.blocked is not None and "retained from another VLLMService" in plan.blocked
    assert "reuseRetained" in plan.blocked and "`use`" in plan.blocked
    assert plan.writes == [] and plan.deletions == [] and not plan.seeded


def test_a_claim_taken_over_with_reuse_retained_changes_owner_and_is_seeded_again():
    obj = body()
    obj["spec"]["coldStart"] = {"compileCache": {"reuseRetained": True}}
    children = retained_from_another_owner(obj)
    plan = decide_children(snapshot(obj, children))
    assert plan.blocked is None and not plan.seeded and plan.gate_closed
    claim_write = next(w for w in plan.writes if w.desired["kind"] == "PersistentVolumeClaim")
    annotations = claim_write.desired["metadata"]["annotations"]
    assert annotations["stoker.dev/compile-cache-owner"] == "svc-uid"
    assert "stoker.dev/seeded-key" not in annotations  # the apply drops the previous owner's record
    seed = next(w.desired for w in plan.writes if w.desired["kind"] == "Job")
    args = seed["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--empty" in args  # what the previous owner's pods wrote is removed before this seed writes


def test_the_seed_empties_a_volume_another_owner_filled_without_following_its_links(tmp_path: Path):
    """What another owner's pods left on the volume: links out of it (to a directory and a file that must
    survive), a dangling link, a FIFO, a tree 200 directories deep."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.py").write_text("kept")
    volume = tmp_path / "volume"
    deep = volume / "inductor" / "/".join(["d"] * 200)
    deep.mkdir(parents=True)
    (deep / "payload.py").write_text("import os")
    (volume / "triton-link").symlink_to(outside, target_is_directory=True)
    (volume / "file-link").symlink_to(outside / "keep.py")
    (volume / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(volume / "fifo")
    seed.empty_directory(str(volume))
    assert list(volume.iterdir()) == []
    assert (outside / "keep.py").read_text() == "kept"


def test_a_seed_that_cannot_empty_the_volume_does_not_seed(tmp_path: Path, capsys) -> None:
    code = seed.main(["--pages", str(tmp_path / "pages"), "--empty", str(tmp_path / "missing"), "--", "true"])
    assert code == 1
    assert "stoker-seed: cannot empty the cache volume" in capsys.readouterr().out


def test_a_claim_from_before_owners_were_recorded_stays_with_the_service_it_was_made_for():
    """After an upgrade: a retained claim without an owner record is this service's only if it was created
    while this service existed; one older than the service was made for an earlier one of its name."""
    obj = body()
    obj["metadata"]["creationTimestamp"] = "2026-11-26T08:00:00Z"
    for created, taken in (("2026-11-26T08:00:01Z", True), ("2026-11-26T07:59:59Z", False)):
        children = converged(obj)
        claim = children[CLAIM]
        claim["metadata"]["creationTimestamp"] = created
        for name in ("stoker.dev/compile-cache-owner", "stoker.dev/compile-cache-owner-signature"):
            del claim["metadata"]["annotations"][name]
        plan = decide_children(snapshot(obj, children))
        assert (plan.blocked is None) is taken, created
        if taken:  # and it records its owner now
            (write,) = [w for w in plan.writes if w.desired["kind"] == "PersistentVolumeClaim"]
            assert write.desired["metadata"]["annotations"]["stoker.dev/compile-cache-owner"] == "svc-uid"
