"""The only part of stoker that talks to the API server: kopf handlers, apply, status, metrics."""
