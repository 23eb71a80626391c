"""`stoker run`: start the operator with validated settings, a liveness endpoint and metrics."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys

import kopf
import prometheus_client
import urllib3
from kubernetes.client.exceptions import ApiException
from pydantic import SecretStr, ValidationError

from stoker.api import KIND
from stoker.controller import cache as object_cache
from stoker.controller import handlers, scalefromzero
from stoker.controller.cache import ObjectCache
from stoker.controller.controlkey import ControlKeyError, ensure_control_key
from stoker.controller.kube import Kube, load_config
from stoker.controller.leader import Leadership
from stoker.controller.reconcile import Reconciler
from stoker.controller.settings import OperatorSettings, settings_help
from stoker.controller.startups import StartupRecorder
from stoker.controller.workqueue import WorkQueue

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="stoker run",
        description="Run the operator. Settings come from STOKER_* environment variables.",
        epilog=settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    try:
        settings = OperatorSettings()
    except ValidationError as error:
        print(f"invalid STOKER_* settings:\n{error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
    load_config()
    # A connection for each worker and each endpoint-picker reader, none discarded.
    kube = Kube(settings.field_manager, connections=settings.workers + 4 + scalefromzero.READERS)
    if settings.control_key is None and settings.control_key_secret:
        try:
            key = ensure_control_key(kube, settings.operator_namespace, settings.control_key_secret)
        except (ApiException, ControlKeyError, urllib3.exceptions.HTTPError) as error:
            print(f"cannot get the control key: {error}", file=sys.stderr)
            return 2
        settings = settings.model_copy(update={"control_key": SecretStr(key)})
    queue: WorkQueue
    cache = ObjectCache()
    startups = StartupRecorder(kube, settings, cache, recorded=lambda key: queue.add(key, resync=False))
    reconciler = Reconciler(kube, settings, cache, startups)
    queue = WorkQueue(
        reconciler.reconcile,
        settings.workers,
        resync_interval=settings.drift_interval_seconds,
        retry_initial=settings.retry_initial_seconds,
        retry_max=settings.retry_max_seconds,
    )
    reconciler.others_waiting = queue.urgent_waiting
    watched = scalefromzero.Watched(lambda namespace, name: cache.get(KIND, namespace, name))
    from_zero = scalefromzero.ScaleFromZero(kube, watched.services, settings.scale_from_zero_period_seconds)

    def start_working() -> None:
        queue.start()
        startups.start()
        from_zero.start()  # the leader's alone: it scales

    if settings.leader_election:
        leadership = Leadership(settings, start_working)
        kube.fence = leadership.fence  # before the first write of a term
        leadership.start()
    else:
        start_working()
    object_cache.register(cache)  # before the handlers that queue work, so a pass finds what woke it
    handlers.register(queue, startups.queue)
    scalefromzero.register(watched)
    kopf_settings = kopf.OperatorSettings()
    handlers.configure(kopf_settings)
    prometheus_client.start_http_server(settings.metrics_port, addr=str(settings.metrics_bind_address))
    logging.getLogger(__name__).info(
        "Starting operator namespaces=%s metrics=%s liveness=%s",
        settings.namespaces or "all",
        f"{settings.metrics_bind_address}:{settings.metrics_port}",
        settings.liveness_endpoint,
    )
    # The imports' objects (about 80,000) live as long as the process: kept out of every full collection,
    # which stops all threads (see stoker.controller.cache).
    gc.freeze()
    try:
        asyncio.run(
            kopf.operator(
                settings=kopf_settings,
                standalone=True,
                clusterwide=not settings.namespaces,
                namespaces=settings.namespaces,
                liveness_endpoint=settings.liveness_endpoint,
            )
        )
    finally:
        queue.stop()
        startups.stop()
        from_zero.stop()
    return 0
