"""Standby replicas: which pods to wake, demote and put to sleep (pure), and the engine calls that do it."""

from stoker.standby.client import EngineControl, EngineControlError, WakeTiming
from stoker.standby.plan import ServingPod, StandbyPlan, plan_standby, replacement_delay

__all__ = [
    "EngineControl",
    "EngineControlError",
    "ServingPod",
    "StandbyPlan",
    "WakeTiming",
    "plan_standby",
    "replacement_delay",
]
