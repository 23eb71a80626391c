from stoker.controller.ownership import (
    ChildConflict,
    apply_ownership_patch,
    conflicts,
    created_by_deployment,
    foreign_template_items,
    never_shrink,
    owned_by,
    release,
    retained_cache_of,
)

UID = "1111-aaaa"


def obj(name: str, *owners: str, kind_of_owner: str = "VLLMService") -> dict:
    refs = [{"kind": kind_of_owner, "name": "x", "uid": uid} for uid in owners]
    return {"metadata": {"name": name, "namespace": "ns", **({"ownerReferences": refs} if refs else {})}}


def test_only_an_object_with_this_owner_uid_is_stokers():
    assert owned_by(obj("a", UID), UID)
    assert owned_by(obj("a", "other", UID), UID)
    assert not owned_by(obj("a"), UID)
    assert not owned_by(obj("a", "another-vllmservice-uid"), UID)
    assert not owned_by(obj("a", UID.upper()), UID)


def test_every_object_in_the_way_is_a_conflict_naming_it():
    found = conflicts(
        UID,
        "x",
        [
            ("PersistentVolumeClaim", obj("x-cache")),
            ("Service", obj("x", UID)),
            ("Deployment", obj("x", "b")),
        ],
    )
    assert found == [
        ChildConflict("PersistentVolumeClaim", "ns", "x-cache"),
        ChildConflict("Deployment", "ns", "x"),
    ]
    assert found[0].message == (
        "PersistentVolumeClaim ns/x-cache exists and is not owned by this VLLMService; rename or delete it"
    )


def claim(size: str) -> dict:
    return {
        "kind": "PersistentVolumeClaim",
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
    }


def test_a_pvc_is_never_shrunk_below_its_live_size():
    assert never_shrink(claim("20Gi"), claim("50Gi"))["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert (
        never_shrink(claim("20Gi"), claim("21474836480"))["spec"]["resources"]["requests"]["storage"]
        == "20Gi"
    )
    assert never_shrink(claim("30Gi"), claim("20Gi"))["spec"]["resources"]["requests"]["storage"] == "30Gi"
    assert never_shrink(claim("20Gi"), {"spec": {}}) == claim("20Gi")
    assert never_shrink(claim("20Gi"), claim("50Gi"))["spec"]["accessModes"] == ["ReadWriteOnce"]


def deployment(
    containers: list[dict], volumes: list[dict] | None = None, init: list[dict] | None = None
) -> dict:
    pod: dict = {"containers": containers}
    if volumes is not None:
        pod["volumes"] = volumes
    if init is not None:
        pod["initContainers"] = init
    return {"spec": {"template": {"spec": pod}}}


def test_drift_removes_exactly_the_named_items_stoker_does_not_render():
    desired = deployment(
        [{"name": "vllm", "env": [{"name": "A"}], "volumeMounts": [{"name": "cache"}]}], [{"name": "cache"}]
    )
    live = deployment(
        [
            {
                "name": "vllm",
                "env": [{"name": "A"}, {"name": "HAND"}],
                "volumeMounts": [{"name": "cache"}, {"name": "extra"}],
            },
            {"name": "sidecar"},
        ],
        [{"name": "cache"}, {"name": "extra"}],
        init=[{"name": "setup"}],
    )
    ops = foreign_template_items(live, desired)
    base = "/spec/template/spec"
    assert ops == [
        {"op": "test", "path": f"{base}/containers/0/env/1/name", "value": "HAND"},
        {"op": "remove", "path": f"{base}/containers/0/env/1"},
        {"op": "test", "path": f"{base}/containers/0/volumeMounts/1/name", "value": "extra"},
        {"op": "remove", "path": f"{base}/containers/0/volumeMounts/1"},
        {"op": "test", "path": f"{base}/containers/1/name", "value": "sidecar"},
        {"op": "remove", "path": f"{base}/containers/1"},
        {"op": "test", "path": f"{base}/initContainers/0/name", "value": "setup"},
        {"op": "remove", "path": f"{base}/initContainers/0"},
        {"op": "test", "path": f"{base}/volumes/1/name", "value": "extra"},
        {"op": "remove", "path": f"{base}/volumes/1"},
    ]


def test_a_template_as_rendered_needs_no_patch():
    desired = deployment([{"name": "vllm", "env": [{"name": "A"}]}], [{"name": "cache"}])
    live = deployment(
        [{"name": "vllm", "env": [{"name": "A"}], "terminationMessagePath": "/dev/x"}], [{"name": "cache"}]
    )
    assert foreign_template_items(live, desired) == []


def test_several_foreign_items_are_removed_from_the_end_so_indices_stay_valid():
    ops = foreign_template_items(
        deployment([{"name": "a"}, {"name": "vllm"}, {"name": "b"}]), deployment([{"name": "vllm"}])
    )
    assert [op["path"] for op in ops if op["op"] == "remove"] == [
        "/spec/template/spec/containers/2",
        "/spec/template/spec/containers/0",
    ]


def pod(labels: dict, owners: list[dict]) -> dict:
    return {"metadata": {"name": "p", "labels": labels, "ownerReferences": owners}}


def test_only_pods_of_the_deployments_replicasets_are_the_standby_pools():
    rs = {"kind": "ReplicaSet", "name": "x-5d8f", "controller": True, "uid": "r"}
    assert created_by_deployment(pod({"pod-template-hash": "5d8f"}, [rs]), "x")
    assert not created_by_deployment(pod({}, [rs]), "x")
    assert not created_by_deployment(pod({"pod-template-hash": "5d8f"}, []), "x")
    assert not created_by_deployment(pod({"pod-template-hash": "5d8f"}, [{**rs, "name": "y-5d8f"}]), "x")
    assert not created_by_deployment(pod({"pod-template-hash": "5d8f"}, [{**rs, "kind": "Job"}]), "x")


def test_a_created_childs_fields_become_applied_ones_so_later_applies_can_remove_them() -> None:
    created = {
        "metadata": {
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status"},
                {"manager": "stoker", "operation": "Update", "fieldsV1": {"f:metadata": {}}},
            ]
        }
    }
    assert apply_ownership_patch(created, "stoker") == [
        {"op": "test", "path": "/metadata/managedFields/1/manager", "value": "stoker"},
        {"op": "test", "path": "/metadata/managedFields/1/operation", "value": "Update"},
        {"op": "replace", "path": "/metadata/managedFields/1/operation", "value": "Apply"},
    ]


def test_fields_already_applied_or_set_by_others_need_no_patch() -> None:
    applied = {"metadata": {"managedFields": [{"manager": "stoker", "operation": "Apply"}]}}
    others = {"metadata": {"managedFields": [{"manager": "kubectl", "operation": "Update"}]}}
    assert apply_ownership_patch(applied, "stoker") is None
    assert apply_ownership_patch(others, "stoker") is None
    assert apply_ownership_patch({"metadata": {}}, "stoker") is None


def kept_claim(annotation: str | None, *owners: str) -> dict:
    claim = obj("x-cache", *owners)
    if annotation is not None:
        claim["metadata"]["annotations"] = {"stoker.dev/compile-cache-of": annotation}
    return claim


def test_a_retained_cache_is_taken_back_only_by_a_service_of_its_name():
    assert retained_cache_of("PersistentVolumeClaim", kept_claim("x"), "x")
    # A user's own claim, one kept for another VLLMService, or one with any owner is still refused.
    assert not retained_cache_of("PersistentVolumeClaim", kept_claim(None), "x")
    assert not retained_cache_of("PersistentVolumeClaim", kept_claim("y"), "x")
    assert not retained_cache_of("PersistentVolumeClaim", kept_claim("x", "another-vllmservice-uid"), "x")
    assert not retained_cache_of("Deployment", kept_claim("x"), "x")
    found = conflicts(
        UID,
        "x",
        [("PersistentVolumeClaim", kept_claim("x")), ("PersistentVolumeClaim", kept_claim(None))],
    )
    assert found == [ChildConflict("PersistentVolumeClaim", "ns", "x-cache")]


def test_release_removes_only_this_owners_reference_after_testing_it():
    assert release(obj("x-cache", "other", UID), UID) == [
        {"op": "test", "path": "/metadata/ownerReferences/1/uid", "value": UID},
        {"op": "remove", "path": "/metadata/ownerReferences/1"},
    ]
    assert release(obj("x-cache", "other"), UID) == []
