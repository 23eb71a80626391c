"""Snapshot and restore of a served engine between pods of a node (issue 40): the plan and the agent."""
