"""The seed Job: one run of the serving command that fills the compile cache, then exits."""

from __future__ import annotations

import dataclasses
import inspect

from stoker.api import VLLMService
from stoker.engines import EngineFlags
from stoker.predict.facts import FACTS_LOG_PREFIX, MAX_FACTS_LINE_LENGTH, read_model_facts
from stoker.predict.host import HOST_FACTS_KEY, measure_host
from stoker.render.cachekey import SHORT_KEY_LENGTH, cache_key
from stoker.render.engine import PORT, EngineInvocation, engine_invocation
from stoker.render.names import (
    CACHE_KEY_ANNOTATION,
    COMPONENT_SEED,
    Json,
    common_labels,
    object_meta,
    seed_job_name,
)
from stoker.render.pods import HEALTH_PATH, pod_metadata, pod_spec
from stoker.render.prefetch import (
    SkipLines,
    evict_pages,
    files_under,
    import_pages_listing,
    open_regular,
    resident_pages,
    server_has_child,
    walk_files,
)

SEED_BACKOFF_LIMIT = 1
SEED_ACTIVE_DEADLINE_SECONDS = 2 * 3600

# Runs the server, waits for /health (vLLM writes its compile artifacts before it answers), sends one
# completion, stops it and exits 0; exits non-zero if the server dies first. The completion JIT-compiles
# the Triton kernels of the first request into TRITON_CACHE_DIR on the volume: measured on an H100
# (bench/results/seed-warmup-h100.json), serving pods' first completion then took 0.12 s instead of
# 1.26 s, at 1.1 s of the seed's time. Its failure (say, an --api-key) leaves the seed successful.
# The vLLM image has python3 but not curl.
#
# Once healthy, the seed prints the model's facts on one `stoker-model-facts: {json}` line, which the
# operator reads with the rest of the seed's log. read_model_facts is embedded verbatim, so the vLLM image
# needs no stoker. It reads the directory the engine read: the model path as given or, for a hub id, the
# local Hugging Face cache snapshot; nothing for a streamer URI or a model it cannot read. It reads in a
# thread of its own for at most FACTS_SECONDS: a file that blocks it (on a hung volume) leaves the seed to
# finish without facts. A line longer than the operator parses (MAX_FACTS_LINE_LENGTH) is not printed.
# The same thread then measures the host (measure_host, about two seconds while the server idles: CPU
# speed, the checkpoint volume's read bandwidth, the GPUs), reported under the line's `host` key.
FACTS_SECONDS = 30
SEED_MODEL_FACTS = (
    "from __future__ import annotations\n\n"
    "import atexit, json, os, signal, subprocess, sys, threading, time, urllib.request\n\n\n"
    + "\n\n".join(
        inspect.getsource(f)
        for f in (SkipLines, open_regular, resident_pages, read_model_facts, measure_host)
    )
    + f"""

# What the seed passes by, one line each: stdout, with the rest of the seed's lines.
skipped = SkipLines("stoker-seed: ")
atexit.register(skipped.close)


def local_model_dir(argv):
    model = argv[argv.index("serve") + 1]
    if os.path.isdir(model):
        return model
    if "://" in model:
        return None
    revision_flag = "{EngineFlags().revision}"
    revision = argv[argv.index(revision_flag) + 1] if revision_flag in argv else None
    from huggingface_hub import snapshot_download

    return snapshot_download(model, revision=revision, local_files_only=True)


def model_facts_line(argv):
    try:
        model_dir = local_model_dir(argv)
        if not model_dir:
            return None
        facts = read_model_facts(model_dir, skipped)
        facts[{HOST_FACTS_KEY!r}] = measure_host(model_dir, skipped)
        document = json.dumps(facts, sort_keys=True)
    except Exception as error:
        return f"stoker-seed: no model facts ({{error!r:.300}})"
    if len(document) > {MAX_FACTS_LINE_LENGTH}:
        why = f"their line would hold {{len(document)}} characters, over {MAX_FACTS_LINE_LENGTH}"
        return f"stoker-seed: no model facts ({{why}})"
    return {FACTS_LOG_PREFIX!r} + document


def print_model_facts(argv, seconds={FACTS_SECONDS}):
    found = []
    reading = threading.Thread(target=lambda: found.append(model_facts_line(argv)), daemon=True)
    reading.start()
    reading.join(seconds)
    line = found[0] if found else f"stoker-seed: no model facts (still reading after {{seconds}} s)"
    if line:
        print(line, flush=True)
"""
)

# The import pages: the seed evicts the image's Python files (everything under sys.path) from the page cache,
# and once the server starts its engine process (its imports are done) records which pages of them and of
# the files the server mapped are in the page cache (resident_pages), on the cache volume; serving pods'
# read-ahead reads them first (render.prefetch). Measured on H100 hosts (bench/results/
# coldstart-h100-v0.26.0-pages*.json): 1.7 GB recorded, the serving pods' imports 2.3-3.7 s shorter (means of
# three runs). Pages that other processes on the node keep mapped stay cached and are listed too; the others
# of the image's files are read from the disk by whatever on the node next needs them.
SEED_WRAPPER = (
    SEED_MODEL_FACTS
    + "\n\n"
    + "\n\n".join(inspect.getsource(f) for f in (walk_files, server_has_child, files_under, evict_pages))
    + f"""

listing, argv = sys.argv[2], sys.argv[sys.argv.index("--") + 1 :]  # --pages LISTING -- vllm serve ...
# The image's Python files start out of the page cache, so that what is in it when the engine process starts
# is what a cold start reads, even on a node that has just pulled the image.
image_files = files_under([path for path in sys.path if os.path.isdir(path)], skipped)
evict_pages(image_files)
server = subprocess.Popen(argv)


def record_import_pages(listing):
    while server.poll() is None and not server_has_child(server.pid, 0):
        time.sleep(0.2)
    if server.poll() is not None:
        return
    try:
        with open(f"/proc/{{server.pid}}/maps") as maps:
            fields = [line.split() for line in maps]
        mapped = [found[5] for found in fields if len(found) > 5 and found[5].startswith("/")]
        files = list(dict.fromkeys(files_under(mapped) + image_files))
        for path in [path for path in files if "\\n" in path]:
            skipped(path, "a newline in its name, which a listing line cannot hold")
        pages = resident_pages([path for path in files if "\\n" not in path], skipped)
        os.makedirs(os.path.dirname(listing), exist_ok=True)
        if os.path.lexists(listing + ".part"):
            os.unlink(listing + ".part")  # a FIFO there would block the open, a link would lead elsewhere
        with os.fdopen(os.open(listing + ".part", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as out:
            out.writelines(b"%s %d %d\\n" % (os.fsencode(path), start, end) for path, start, end in pages)
        os.replace(listing + ".part", listing)
        size = sum(end - start for _, start, end in pages)
        print(f"stoker-seed: recorded {{size}} bytes of the imports' pages in {{listing}}", flush=True)
    except Exception as error:
        print(f"stoker-seed: no import pages recorded ({{error!r:.300}})", flush=True)


threading.Thread(target=record_import_pages, args=(listing,), daemon=True).start()


def stop(*_):
    server.terminate()
    sys.exit(143)


signal.signal(signal.SIGTERM, stop)
while True:
    code = server.poll()
    if code is not None:
        print(f"stoker-seed: server exited with code {{code}} before it was healthy", flush=True)
        sys.exit(code or 1)
    try:
        with urllib.request.urlopen("http://127.0.0.1:{PORT}{HEALTH_PATH}", timeout=5) as response:
            if response.status == 200:
                break
    except OSError:
        pass
    time.sleep(2)
print("stoker-seed: server is healthy, the compile cache is seeded", flush=True)
print_model_facts(argv)
model = argv[argv.index("--served-model-name") + 1]
request = urllib.request.Request(
    "http://127.0.0.1:{PORT}/v1/completions",
    data=json.dumps({{"model": model, "prompt": "Hello", "max_tokens": 16, "temperature": 0}}).encode(),
    headers={{"Content-Type": "application/json"}},
)
try:
    with urllib.request.urlopen(request, timeout=300) as response:
        print(f"stoker-seed: warm-up completion answered {{response.status}}", flush=True)
except OSError as error:
    print(f"stoker-seed: warm-up completion failed ({{error}}); the cache is seeded anyway", flush=True)
print("stoker-seed: stopping the server", flush=True)
server.terminate()
try:
    server.wait(timeout=120)
except subprocess.TimeoutExpired:
    server.kill()
sys.exit(0)
"""
)


def seed_invocation(svc: VLLMService) -> EngineInvocation:
    """The seed's engine invocation wrapped in SEED_WRAPPER; image, env and mounts are untouched."""
    engine = engine_invocation(svc, "seed")
    recorded = ["--pages", import_pages_listing(svc), "--"]
    return dataclasses.replace(
        engine, command=["python3", "-c", SEED_WRAPPER], args=[*recorded, *engine.argv]
    )


def build_seed_job(svc: VLLMService) -> Json:
    key = cache_key(svc)
    short_key = key[:SHORT_KEY_LENGTH]
    labels = common_labels(svc.name, COMPONENT_SEED, short_key)
    annotations = {CACHE_KEY_ANNOTATION: key}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_meta(svc, seed_job_name(svc.name, short_key), labels, annotations),
        "spec": {
            "backoffLimit": SEED_BACKOFF_LIMIT,
            "activeDeadlineSeconds": SEED_ACTIVE_DEADLINE_SECONDS,
            "template": {
                "metadata": pod_metadata(svc, labels, annotations),
                "spec": pod_spec(svc, "seed", seed_invocation(svc)),
            },
        },
    }
