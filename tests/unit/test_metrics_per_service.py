"""A VLLMService's own series (those labelled with its namespace and name) go with the object."""

from prometheus_client import REGISTRY

from stoker.controller import metrics


def series_of(namespace: str) -> list[str]:
    return [
        sample.name
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.labels.get("namespace") == namespace
    ]


def test_forgetting_a_service_removes_its_histograms_and_counters() -> None:
    service = ("team-forget", "svc")
    metrics.STARTUP_TOTAL_SECONDS.labels(*service, "seed").observe(112.4)
    metrics.STARTUP_TOTAL_SECONDS.labels(*service, "serve").observe(66.1)
    metrics.STARTUP_READY_GAP_SECONDS.labels(*service).observe(0.8)
    metrics.STANDBY_WAKE_SECONDS.labels(*service).observe(0.6)
    metrics.COMPILE_CACHE_RESULTS.labels(*service, "miss", "seed").inc()
    metrics.COMPILE_CACHE_RESULTS.labels(*service, "hit", "serve").inc()
    other = ("team-keep", "svc")
    metrics.STARTUP_TOTAL_SECONDS.labels(*other, "serve").observe(30.0)
    assert {"stoker_startup_total_seconds_bucket", "stoker_compile_cache_total"} <= set(series_of(service[0]))

    metrics.forget_service(*service)

    assert series_of(service[0]) == []
    assert "stoker_startup_total_seconds_count" in series_of(other[0])
    metrics.forget_service(*service)  # forgetting twice is harmless
