from stoker.controller.handlers import spec_changed


def test_a_new_object_or_a_spec_edit_is_a_change_and_a_status_write_is_not():
    assert spec_changed({"metadata": {"generation": 1}})
    assert spec_changed({"metadata": {"generation": 3}, "status": {"observedGeneration": 2}})
    assert not spec_changed({"metadata": {"generation": 3}, "status": {"observedGeneration": 3}})
