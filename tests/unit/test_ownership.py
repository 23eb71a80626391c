from stoker.controller.ownership import (
    ChildConflict,
    SeededClaim,
    apply_ownership_patch,
    cache_owner,
    claim_signature,
    conflicts,
    covers,
    created_by_deployment,
    foreign_fields,
    foreign_list_items,
    never_shrink,
    owned_by,
    owner_signature,
    proven_seed,
    release,
    retained_cache_of,
    seeded_annotations,
    signed_for_creation,
    stokers,
)

KEY = "operator-signing-key-0123456789"

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
        KEY,
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


def template_fields(*leaves: str) -> dict:
    """A managedFields fieldsV1 tree owning these pod-template paths ('|' between parts)."""
    return spec_fields(*(f"f:template|{leaf}" for leaf in leaves))


def spec_fields(*leaves: str) -> dict:
    """A managedFields fieldsV1 tree owning these paths under spec ('|' between parts)."""
    tree: dict = {}
    for leaf in leaves:
        node = tree.setdefault("f:spec", {})
        for part in leaf.split("|"):
            node = node.setdefault(part, {})
    return tree


def live_deployment(pod: dict, *managers: tuple[str, dict]) -> dict:
    entries = [{"manager": m, "operation": "Apply", "fieldsV1": f} for m, f in managers]
    return {"metadata": {"managedFields": entries}, "spec": {"template": {"spec": pod}}}


VLLM = 'k:{"name":"vllm"}'


def test_drift_removes_every_template_field_only_others_set():
    pod = {
        "containers": [
            {"name": "vllm", "env": [{"name": "A"}, {"name": "HAND"}], "image": "i"},
            {"name": "sidecar", "image": "s"},
        ],
        "hostNetwork": True,
        "serviceAccountName": "admin",
        "dnsPolicy": "ClusterFirst",  # defaulted by the server: no manager, stays
    }
    ours = template_fields(
        f"f:spec|f:containers|{VLLM}|.",
        f"f:spec|f:containers|{VLLM}|f:image",
        f'f:spec|f:containers|{VLLM}|f:env|k:{{"name":"A"}}|.',
    )
    theirs = template_fields(
        f'f:spec|f:containers|{VLLM}|f:env|k:{{"name":"HAND"}}|.',
        'f:spec|f:containers|k:{"name":"sidecar"}|f:image',
        "f:spec|f:hostNetwork",
        "f:spec|f:serviceAccountName",
    )
    ops = foreign_fields(
        "Deployment", live_deployment(pod, ("stoker", ours), ("kubectl-edit", theirs)), "stoker"
    )
    base = "/spec/template/spec"
    assert [op["path"] for op in ops if op["op"] == "remove"] == [
        f"{base}/serviceAccountName",
        f"{base}/hostNetwork",
        f"{base}/containers/1",
        f"{base}/containers/0/env/1",
    ]
    # Each removal inside a list tests the keys of the items on its way, so a moved template fails it.
    assert {"op": "test", "path": f"{base}/containers/1/name", "value": "sidecar"} in ops
    assert {"op": "test", "path": f"{base}/containers/0/env/1/name", "value": "HAND"} in ops


def test_a_field_both_set_and_a_rollout_restart_stay():
    pod = {"containers": [{"name": "vllm", "image": "i"}]}
    both = template_fields(f"f:spec|f:containers|{VLLM}|f:image")
    restart = template_fields("f:metadata|f:annotations|f:kubectl.kubernetes.io/restartedAt")
    live = live_deployment(pod, ("stoker", both), ("kubectl", both), ("kubectl-rollout", restart))
    live["spec"]["template"]["metadata"] = {"annotations": {"kubectl.kubernetes.io/restartedAt": "t"}}
    assert foreign_fields("Deployment", live, "stoker") == []


def live_child(spec: dict, *managers: tuple[str, dict]) -> dict:
    entries = [{"manager": m, "operation": "Update", "fieldsV1": f} for m, f in managers]
    return {"metadata": {"managedFields": entries}, "spec": spec}


def test_a_service_is_compared_whole_but_keeps_what_the_server_allocates():
    spec = {
        "selector": {"app": "x", "hand": "added"},
        "ports": [{"port": 8000, "protocol": "TCP"}, {"port": 9000, "protocol": "TCP"}],
        "clusterIP": "10.0.0.1",
        "sessionAffinity": "None",  # defaulted: no manager, stays
    }
    ours = spec_fields("f:selector|f:app", 'f:ports|k:{"port":8000,"protocol":"TCP"}|.')
    theirs = spec_fields(
        "f:selector|f:hand", 'f:ports|k:{"port":9000,"protocol":"TCP"}|.', "f:clusterIP", "f:type"
    )
    ops = foreign_fields("Service", live_child(spec, ("stoker", ours), ("kubectl-edit", theirs)), "stoker")
    assert [op["path"] for op in ops if op["op"] == "remove"] == ["/spec/selector/hand", "/spec/ports/1"]
    assert {"op": "test", "path": "/spec/ports/1/port", "value": 9000} in ops


def test_a_list_with_an_item_of_others_is_put_back_as_rendered_before_the_apply():
    """A port changed by hand is an item of another key that keeps the name `http`: merged with stoker's
    re-added port by the apply, the two would collide, so the list is replaced first."""
    rendered = [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    edited = [{"name": "http", "port": 9000, "targetPort": "http", "protocol": "TCP"}]
    spec = {"selector": {"app": "x"}, "ports": edited, "clusterIP": "10.0.0.1"}
    ours = spec_fields("f:selector|f:app", "f:type")
    theirs = spec_fields('f:ports|k:{"port":9000,"protocol":"TCP"}|f:name', "f:clusterIP")
    live = live_child(spec, ("stoker", ours), ("kubectl-edit", theirs))
    desired = {"spec": {"type": "ClusterIP", "selector": {"app": "x"}, "ports": rendered}}
    assert foreign_list_items("Service", live, desired, "stoker") == [
        {"op": "test", "path": "/spec/ports", "value": edited},
        {"op": "replace", "path": "/spec/ports", "value": rendered},
    ]
    # A list stoker does not render, or one whose items are all stoker's too, is left to the apply.
    assert foreign_list_items("Service", live, {"spec": {"selector": {"app": "x"}}}, "stoker") == []
    both = live_child(spec, ("stoker", theirs), ("kubectl-edit", theirs))
    assert foreign_list_items("Service", both, desired, "stoker") == []


def test_a_list_put_back_takes_the_lists_in_it_along():
    """A sidecar and an env variable added by hand: the containers are put back whole, and no second
    replacement of the env (which the first already replaced) makes the patch's `test` fail."""
    vllm = {"name": "vllm", "image": "i", "env": [{"name": "A", "value": "1"}]}
    pod = {
        "containers": [{**vllm, "env": [*vllm["env"], {"name": "HAND"}]}, {"name": "sidecar", "image": "s"}]
    }
    ours = template_fields(
        f"f:spec|f:containers|{VLLM}|f:image", f'f:spec|f:containers|{VLLM}|f:env|k:{{"name":"A"}}|.'
    )
    theirs = template_fields(
        f'f:spec|f:containers|{VLLM}|f:env|k:{{"name":"HAND"}}|.',
        'f:spec|f:containers|k:{"name":"sidecar"}|.',
    )
    live = live_deployment(pod, ("stoker", ours), ("kubectl-edit", theirs))
    desired = {"spec": {"template": {"spec": {"containers": [vllm]}}}}
    assert foreign_list_items("Deployment", live, desired, "stoker") == [
        {"op": "test", "path": "/spec/template/spec/containers", "value": pod["containers"]},
        {"op": "replace", "path": "/spec/template/spec/containers", "value": [vllm]},
    ]


def test_a_claim_keeps_its_binding_and_a_hand_expansion():
    spec = {"volumeName": "pv-1", "resources": {"requests": {"storage": "64Gi"}}, "accessModes": ["x"]}
    theirs = spec_fields("f:volumeName", "f:resources|f:requests|f:storage")
    live = live_child(spec, ("stoker", spec_fields("f:accessModes")), ("kube-controller-manager", theirs))
    assert foreign_fields("PersistentVolumeClaim", live, "stoker") == []


def test_the_live_object_covers_what_is_rendered_despite_defaults_and_quantity_spellings():
    desired = {
        "spec": {"containers": [{"name": "v", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}
    }
    live = {
        "spec": {
            "containers": [
                {
                    "name": "v",
                    "resources": {"limits": {"cpu": "1000m", "memory": "1073741824"}},
                    "terminationMessagePath": "/dev/termination-log",
                }
            ],
            "dnsPolicy": "ClusterFirst",
        }
    }
    assert covers(live, desired)
    assert not covers(live, {"spec": {"containers": [{"name": "v", "image": "x"}]}})
    assert not covers(live, {"spec": {"containers": []}})
    assert not covers({"spec": {"replicas": 2}}, {"spec": {"replicas": 3}})
    assert not covers({"spec": {"paused": True}}, {"spec": {"paused": 1}})


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


def kept_claim(
    annotation: str | None,
    *owners: str,
    uid: str = "claim-uid",
    signed: bool = True,
    owner: str | None = UID,
) -> dict:
    claim = obj("x-cache", *owners)
    claim["metadata"]["uid"] = uid
    if annotation is not None:
        claim["metadata"]["annotations"] = {"stoker.dev/compile-cache-of": annotation}
        if signed:
            annotations = claim["metadata"]["annotations"]
            annotations["stoker.dev/claim-signature"] = claim_signature(KEY, claim)
            if owner is not None:
                annotations["stoker.dev/compile-cache-owner"] = owner
                signature = owner_signature(KEY, claim, owner)
                annotations["stoker.dev/compile-cache-owner-signature"] = signature
    return claim


def test_a_retained_cache_is_taken_back_only_by_its_own_service_with_the_operators_signature():
    assert retained_cache_of("PersistentVolumeClaim", kept_claim("x"), "x", KEY, UID)
    # A user's own claim, one kept for another VLLMService, or one with any owner is still refused.
    assert not retained_cache_of("PersistentVolumeClaim", kept_claim(None), "x", KEY, UID)
    assert not retained_cache_of("PersistentVolumeClaim", kept_claim("y"), "x", KEY, UID)
    assert not retained_cache_of(
        "PersistentVolumeClaim", kept_claim("x", "another-vllmservice-uid"), "x", KEY, UID
    )
    assert not retained_cache_of("Deployment", kept_claim("x"), "x", KEY, UID)
    # Planted: stoker's annotations without a signature, a signature copied onto another claim (uid), or
    # one made with another key.
    assert not retained_cache_of("PersistentVolumeClaim", kept_claim("x", signed=False), "x", KEY, UID)
    copied = kept_claim("x")
    copied["metadata"]["uid"] = "planted-uid"
    assert not retained_cache_of("PersistentVolumeClaim", copied, "x", KEY, UID)
    assert not retained_cache_of("PersistentVolumeClaim", kept_claim("x"), "x", "another-operators-key", UID)
    assert not retained_cache_of("PersistentVolumeClaim", kept_claim("x"), "x", None, UID)
    found = conflicts(
        UID,
        "x",
        [("PersistentVolumeClaim", kept_claim("x")), ("PersistentVolumeClaim", kept_claim(None))],
        KEY,
    )
    assert found == [ChildConflict("PersistentVolumeClaim", "ns", "x-cache")]


def test_a_retained_cache_of_a_deleted_service_goes_to_a_new_one_of_its_name_only_if_it_asks():
    """Hostile: a tenant deletes another's VLLMService and makes one of the same name (another uid). The
    retained claim is a conflict that says what it is and how to take it, never the new service's."""
    admins = kept_claim("x", owner="admins-uid")
    assert not stokers("PersistentVolumeClaim", admins, UID, "x", KEY)
    (conflict,) = conflicts(UID, "x", [("PersistentVolumeClaim", admins)], KEY)
    assert conflict.retained and "reuseRetained" in conflict.message and "`use`" in conflict.message
    # Asked for (admitted only from an author who may `use` the claim): it is taken over.
    assert stokers("PersistentVolumeClaim", admins, UID, "x", KEY, reuse_retained=True)
    assert conflicts(UID, "x", [("PersistentVolumeClaim", admins)], KEY, reuse_retained=True) == []
    # An owner a tenant wrote, or an owner signature copied from another claim, proves nothing.
    forged = kept_claim("x", owner="admins-uid")
    forged["metadata"]["annotations"]["stoker.dev/compile-cache-owner"] = UID
    assert not stokers("PersistentVolumeClaim", forged, UID, "x", KEY)
    assert cache_owner(forged, KEY) is None
    copied = kept_claim("x", uid="another-claim", owner=None)
    copied["metadata"]["annotations"].update(
        {n: v for n, v in kept_claim("x")["metadata"]["annotations"].items() if "owner" in n}
    )
    assert cache_owner(copied, KEY) is None
    # A claim retained before owners were recorded: only a service that asks takes it.
    unowned = kept_claim("x", owner=None)
    assert not stokers("PersistentVolumeClaim", unowned, UID, "x", KEY)
    assert stokers("PersistentVolumeClaim", unowned, UID, "x", KEY, reuse_retained=True)


def test_an_owner_reference_alone_does_not_make_a_claim_stokers():
    # Anyone who may create claims can write a VLLMService's owner reference on one; the signature over the
    # claim's uid is made only by the operator, right after it created the claim.
    assert stokers("PersistentVolumeClaim", kept_claim("x", UID), UID, "x", KEY)
    assert not stokers("PersistentVolumeClaim", kept_claim("x", UID, signed=False), UID, "x", KEY)
    assert not stokers("PersistentVolumeClaim", obj("x-model", UID), UID, "x", KEY)
    copied = kept_claim("x", UID)
    copied["metadata"]["uid"] = "planted-uid"
    assert not stokers("PersistentVolumeClaim", copied, UID, "x", KEY)
    assert stokers("Service", obj("x", UID), UID, "x", KEY)


def test_a_seeded_key_counts_only_with_the_operators_signature_over_this_claim_and_owner():
    claim = kept_claim("x")
    facts = '{"layers":32}'
    seeded = SeededClaim("k" * 64, "2026-11-28T06:00:00Z", facts)
    annotations = claim["metadata"]["annotations"]
    annotations.update(seeded_annotations(KEY, claim, UID, seeded))
    assert proven_seed(claim, KEY, UID) == seeded
    for forged_name, forged_value in (
        ("stoker.dev/model-facts", '{"layers":9223372036854775807}'),
        ("stoker.dev/seeded-at", "2020-01-01T00:00:00Z"),
        ("stoker.dev/seeded-key", "f" * 64),
    ):
        forged = {**claim, "metadata": {**claim["metadata"], "annotations": dict(annotations)}}
        forged["metadata"]["annotations"][forged_name] = forged_value
        assert proven_seed(forged, KEY, UID) is None, forged_name
    other_claim = {**claim, "metadata": {**claim["metadata"], "uid": "planted"}}
    assert proven_seed(other_claim, KEY, UID) is None
    assert proven_seed(claim, None, UID) is None
    # Seeded for another owner of the claim (before it was taken over): proves nothing for this one.
    assert proven_seed(claim, KEY, "the-next-owners-uid") is None
    del annotations["stoker.dev/seeded-signature"]
    assert proven_seed(claim, KEY, UID) is None


def test_release_removes_only_this_owners_reference_after_testing_it():
    assert release(obj("x-cache", "other", UID), UID) == [
        {"op": "test", "path": "/metadata/ownerReferences/1/uid", "value": UID},
        {"op": "remove", "path": "/metadata/ownerReferences/1"},
    ]
    assert release(obj("x-cache", "other"), UID) == []


def test_a_claim_signed_in_its_create_is_stokers_until_the_uid_signature_replaces_it():
    # The operator stopped between the create and the uid signature (a leader killed mid-burst): its
    # successor proves the claim by the create's signature and the API server's creationTimestamp.
    sent = 1_795_000_000  # 2026-11-18T11:06:40Z
    claim = signed_for_creation(obj("x-cache", UID), KEY, sent + 0.4)
    claim["metadata"].update(uid="claim-uid", creationTimestamp="2026-11-18T11:06:41Z")
    assert stokers("PersistentVolumeClaim", claim, UID, "x", KEY)
    # The same annotations copied onto a claim created later (deleted and made again by a tenant), a time
    # that is not the one signed, or another key: not stoker's.
    later = {**claim, "metadata": {**claim["metadata"], "creationTimestamp": "2026-11-18T11:10:00Z"}}
    assert not stokers("PersistentVolumeClaim", later, UID, "x", KEY)
    moved = signed_for_creation(obj("x-cache", UID), KEY, sent)
    moved["metadata"].update(uid="claim-uid", creationTimestamp="2026-11-18T11:06:41Z")
    moved["metadata"]["annotations"]["stoker.dev/claim-created-at"] = str(sent + 600)
    assert not stokers("PersistentVolumeClaim", moved, UID, "x", KEY)
    assert not stokers("PersistentVolumeClaim", claim, UID, "x", "another-key")
    # Once signed over its uid, the create's annotations no longer matter.
    claim["metadata"]["annotations"]["stoker.dev/claim-signature"] = claim_signature(KEY, claim)
    assert stokers("PersistentVolumeClaim", later | {"metadata": {**claim["metadata"]}}, UID, "x", KEY)
