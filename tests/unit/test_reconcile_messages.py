import json

from kubernetes.client.exceptions import ApiException

from stoker.controller.act import api_error_message
from stoker.controller.conditions import Condition
from stoker.controller.decide import _changed


def test_a_refused_write_is_told_by_the_servers_own_message():
    error = ApiException(status=422, reason="Unprocessable Entity")
    error.body = json.dumps({"kind": "Status", "message": 'Deployment.apps "x" is invalid: spec.template'})
    assert api_error_message(error) == 'Deployment.apps "x" is invalid: spec.template (HTTP 422)'
    bare = ApiException(status=500, reason="Internal Server Error")
    assert api_error_message(bare) == "Internal Server Error (HTTP 500)"


def test_an_event_is_worth_posting_only_when_reason_or_message_change():
    status = {
        "conditions": [{"type": "Degraded", "status": "True", "reason": "ChildConflict", "message": "a"}]
    }
    assert not _changed(status, Condition("Degraded", True, "ChildConflict", "a"))
    assert _changed(status, Condition("Degraded", True, "ChildConflict", "b"))
    assert _changed(status, Condition("Degraded", True, "ApplyFailed", "a"))
    assert _changed({}, Condition("Degraded", True, "ChildConflict", "a"))
