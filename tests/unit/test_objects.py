from stoker.controller.objects import merge_patch, still_running


def pod(name: str, template_hash: str) -> dict:
    return {"metadata": {"name": name, "labels": {"pod-template-hash": template_hash}}}


def test_a_record_stays_current_while_its_replicaset_has_pods():
    record = {"pod": "llm-aaa-1", "podTemplateHash": "aaa"}
    assert still_running(record, [pod("llm-aaa-2", "aaa")])  # a sibling of the same rollout
    assert not still_running(record, [pod("llm-bbb-1", "bbb")])  # replaced by an edit
    assert not still_running(record, [])  # scaled to zero


def test_a_record_without_a_template_hash_falls_back_to_its_pod():
    assert still_running({"pod": "llm-aaa-1"}, [pod("llm-aaa-1", "aaa")])
    assert not still_running({"pod": "llm-aaa-1"}, [pod("llm-aaa-2", "aaa")])


def test_a_merge_patch_removes_what_the_new_document_dropped():
    before = {"startup": {"last": {"pod": "a"}, "history": [1]}, "cache": {"key": "k", "lastHit": True}}
    after = {"startup": {"history": [1, 2]}, "cache": {"key": "k"}}
    assert merge_patch(before, after) == {
        "startup": {"history": [1, 2], "last": None},
        "cache": {"lastHit": None},
    }
    assert merge_patch({}, after) == after


def test_a_merge_patch_leaves_out_what_did_not_change():
    # The reconcile copies status.startup as it read it; the recorder may have written a newer one since.
    before = {"startup": {"last": {"pod": "a"}}, "replicas": 1}
    assert merge_patch(before, {"startup": {"last": {"pod": "a"}}, "replicas": 2}) == {"replicas": 2}
