"""Run a vLLM server once to fill its compile cache, record what its imports read, then stop it.

With --empty DIR it first removes everything in DIR, the cache volume: a seed runs only where the operator
has no signed record of this key's seed for this owner, so what the volume holds was written by pods of
another key or owner, or by a seed that did not finish, and compile caches are code vLLM loads. Then it
starts COMMAND (`vllm serve ...`) and waits for it to answer /health on its --port (vLLM writes its
compile artifacts before it answers), then prints the model's facts on one `stoker-model-facts: {json}`
line for the operator, sends one completion (which JIT-compiles the first request's Triton kernels into
the cache volume), stops the server and exits 0; it exits with the server's code if the server ends
first. With --start-again it then starts the server once more, waits for /health, sends the completion
and stops it: a start that loads what the first one compiled may JIT-compile kernels of its own (vLLM's
mega AOT artifact does, under other Triton cache keys), and serving pods then find them on the volume.
With --pin-ptxas every start uses torch's ptxas (stoker.inpod.pin_ptxas), as the serving pods' read-ahead
does, so that the Triton kernels it compiles are keyed as theirs are. With --bytecode DIR, where the image
has no bytecode for vLLM, the server writes Python's under DIR, where serving pods find it
(stoker.inpod.keep_bytecode).

Before the server starts, the image's Python files (everything under sys.path) are dropped from the page
cache; once the server starts its engine process (its imports are done), the pages of them and of the files
the server mapped that are in the page cache are written to LISTING, which serving pods read first
(`python3 -m stoker.inpod.read_ahead --pages LISTING`). Whatever the seed passes by it says on stdout, one
line each behind `stoker-seed:`.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator

from stoker.inpod import (
    keep_bytecode,
    options_and_command,
    pin_ptxas,
    program_parser,
    working_directory_first,
)
from stoker.inpod.facts import (
    FACTS_LOG_PREFIX,
    IMPORT_PAGES_KEY,
    MAX_FACTS_LINE_LENGTH,
    impossible_facts,
    read_model_facts,
)
from stoker.inpod.host import HOST_FACTS_KEY, measure_host
from stoker.inpod.pagecache import SkipLines, evict_pages, files_under, resident_pages, server_has_child

# vLLM's spellings of what the seed reads from its server's argv (stoker.engines.EngineFlags renders them),
# and where `vllm serve` listens without --port.
PORT_FLAG = "--port"
VLLM_DEFAULT_PORT = "8000"
SERVED_MODEL_NAME_FLAG = "--served-model-name"
REVISION_FLAG = "--revision"
# What serving pods' probes and the seed ask vLLM.
HEALTH_PATH = "/health"
# The facts are read in a thread of their own for at most this long: a file that blocks them (on a hung
# volume) leaves the seed to finish without facts.
FACTS_SECONDS = 30
LINE_PREFIX = "stoker-seed: "
# Printed as the seed stops its first server: what follows in its log is the second start's (--start-again).
STOPPING_LINE = f"{LINE_PREFIX}stopping the server"
# Printed, before any server starts, when the model path on a volume is not there; the operator reads it in
# the failed seed's termination message (its log tail) and names the path and volume from the pod's spec.
MODEL_PATH_MISSING_LINE = f"{LINE_PREFIX}the model path does not exist:"
MODEL_PATH_MISSING_EXIT = 66  # EX_NOINPUT


def first_start(lines: Iterable[str]) -> Iterator[str]:
    """The lines of a seed's log up to its first stopping line: the start that compiled (a second start
    loads what it compiled, and is not the seed's run). The rest is read, not yielded, so that a streamed
    log ends as it would."""
    stopped = False
    for line in lines:
        if not stopped:
            yield line
        stopped = stopped or STOPPING_LINE in line


def flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def local_model_dir(argv: list[str]) -> str | None:
    """The directory the engine read the model from: the model path as given or, for a hub id, the local
    Hugging Face cache snapshot; None for a streamer URI."""
    model = argv[argv.index("serve") + 1]
    if os.path.isdir(model):
        return model
    if "://" in model:
        return None
    from huggingface_hub import snapshot_download  # the vLLM image's

    return snapshot_download(model, revision=flag_value(argv, REVISION_FLAG), local_files_only=True)


def model_facts_line(
    argv: list[str], skipped: Callable[[str, str], None], import_pages_bytes: int | None = None
) -> str | None:
    """The facts line of the model the server serves, with the host's facts and the size of the import
    pages recorded; a line that says why there are none (facts outside their physical ranges among the
    reasons: the operator would refuse them); or None where there is no local model to read (a streamer
    URI)."""
    try:
        model_dir = local_model_dir(argv)
        if not model_dir:
            return None
        facts = read_model_facts(model_dir, skipped)
        facts[HOST_FACTS_KEY] = measure_host(model_dir, skipped)
        if import_pages_bytes is not None:
            facts[IMPORT_PAGES_KEY] = import_pages_bytes
        document = json.dumps(facts, sort_keys=True)
    except Exception as error:
        return f"{LINE_PREFIX}no model facts ({error!r:.300})"
    impossible = impossible_facts(facts)
    if impossible:
        return f"{LINE_PREFIX}no model facts (impossible: {'; '.join(impossible)})"[:MAX_FACTS_LINE_LENGTH]
    if len(document) > MAX_FACTS_LINE_LENGTH:
        why = f"their line would hold {len(document)} characters, over {MAX_FACTS_LINE_LENGTH}"
        return f"{LINE_PREFIX}no model facts ({why})"
    return FACTS_LOG_PREFIX + document


def print_model_facts(
    argv: list[str],
    skipped: Callable[[str, str], None],
    seconds: float = FACTS_SECONDS,
    import_pages_bytes: int | None = None,
) -> None:
    found = []

    def read() -> None:
        found.append(model_facts_line(argv, skipped, import_pages_bytes))

    reading = threading.Thread(target=read, daemon=True)
    reading.start()
    reading.join(seconds)
    line = found[0] if found else f"{LINE_PREFIX}no model facts (still reading after {seconds} s)"
    if line:
        print(line, flush=True)


def record_import_pages(
    server: subprocess.Popen[bytes],
    listing: str,
    image_files: list[str],
    skipped: Callable[[str, str], None],
    recorded: list[int],
) -> None:
    """Once the server has started its engine process, write the resident pages of the image's files and
    of the files the server maps to `listing` (`path start end` lines), replacing it whole; their size goes
    into `recorded`."""
    while server.poll() is None and not server_has_child(server.pid, 0):
        time.sleep(0.2)
    if server.poll() is not None:
        return
    try:
        with open(f"/proc/{server.pid}/maps") as maps:
            fields = [line.split() for line in maps]
        mapped = [found[5] for found in fields if len(found) > 5 and found[5].startswith("/")]
        files = list(dict.fromkeys(files_under(mapped) + image_files))
        for path in [path for path in files if "\n" in path]:
            skipped(path, "a newline in its name, which a listing line cannot hold")
        pages = resident_pages([path for path in files if "\n" not in path], skipped)
        os.makedirs(os.path.dirname(listing), exist_ok=True)
        if os.path.lexists(listing + ".part"):
            os.unlink(listing + ".part")  # a FIFO there would block the open, a link would lead elsewhere
        with os.fdopen(os.open(listing + ".part", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as out:
            out.writelines(b"%s %d %d\n" % (os.fsencode(path), start, end) for path, start, end in pages)
        os.replace(listing + ".part", listing)
        size = sum(end - start for _, start, end in pages)
        recorded.append(size)
        print(f"{LINE_PREFIX}recorded {size} bytes of the imports' pages in {listing}", flush=True)
    except Exception as error:
        print(f"{LINE_PREFIX}no import pages recorded ({error!r:.300})", flush=True)


def empty_directory(directory: str) -> None:
    """Remove everything in `directory` (links as links, never what they point to); OSError if anything
    stays. The cache volume may hold what pods of another cache key or another owner wrote, and compile
    caches are code that vLLM loads: a seed fills it from nothing."""
    with os.scandir(directory) as entries:
        found = list(entries)
    for entry in found:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def warm_up(port: str, model: str) -> None:
    """One completion: it JIT-compiles the first request's Triton kernels into the cache volume. Its
    failure (say, an --api-key) leaves the seed successful."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps({"model": model, "prompt": "Hello", "max_tokens": 16, "temperature": 0}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            print(f"{LINE_PREFIX}warm-up completion answered {response.status}", flush=True)
    except OSError as error:
        print(f"{LINE_PREFIX}warm-up completion failed ({error}); the cache is seeded anyway", flush=True)


def parser() -> argparse.ArgumentParser:
    usage = (
        "%(prog)s --pages LISTING [--empty DIR] [--start-again] [--pin-ptxas] [--bytecode DIR]"
        " [--group-worker ENV [--worker-arg=ARG]...] -- COMMAND..."
    )
    described = program_parser("stoker.inpod.seed", __doc__, usage)
    described.add_argument(
        "--pages",
        required=True,
        metavar="LISTING",
        help="where to write the pages the server's imports read (a file on the cache volume)",
    )
    described.add_argument(
        "--empty",
        metavar="DIR",
        help="first remove everything in DIR (the cache volume): what it held was written by pods of"
        " another cache key or owner, or by a seed that did not finish; exits 1 if that fails",
    )
    described.add_argument(
        "--start-again",
        action="store_true",
        help="once the first server stopped, start it again (loading what the first compiled), wait for it"
        " to be healthy, send the completion and stop it",
    )
    described.add_argument(
        "--pin-ptxas",
        action="store_true",
        help="set TRITON_PTXAS_PATH to torch's ptxas for COMMAND, unless it is set (Triton keys its kernel"
        " cache by the ptxas version)",
    )
    described.add_argument(
        "--bytecode",
        metavar="DIR",
        help="where the image has no bytecode for vLLM, COMMAND writes Python's under DIR (on the cache"
        " volume) for serving pods to load",
    )
    described.add_argument(
        "--group-worker",
        metavar="ENV",
        help="a multi-node seed's pod: unless the variable ENV (its index) is 0, run COMMAND and the"
        " --worker-arg arguments as a rank of the leader's group instead of seeding (nothing emptied,"
        " recorded or stopped: the Job ends when the leader has seeded)",
    )
    described.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="with --group-worker, an argument after COMMAND on a worker index; as --worker-arg=ARG when ARG"
        " starts with '-'",
    )
    return described


def wait_until_healthy(server: subprocess.Popen[bytes], port: str) -> int | None:
    """None once the server answers /health; the exit code to exit with if it ends first."""
    while True:
        code = server.poll()
        if code is not None:
            print(f"{LINE_PREFIX}server exited with code {code} before it was healthy", flush=True)
            return code or 1
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{HEALTH_PATH}", timeout=5) as response:
                if response.status == 200:
                    return None
        except OSError:
            pass
        time.sleep(2)


def stop_server(server: subprocess.Popen[bytes]) -> None:
    print(STOPPING_LINE, flush=True)
    server.terminate()
    try:
        server.wait(timeout=120)
    except subprocess.TimeoutExpired:
        server.kill()


def main(argv: list[str] | None = None) -> int:
    options, command = options_and_command(sys.argv[1:] if argv is None else argv)
    described = parser()
    settings = described.parse_args(options)
    listing = settings.pages
    if not command:
        described.error("no COMMAND after --")
    port = flag_value(command, PORT_FLAG) or VLLM_DEFAULT_PORT
    model = command[command.index("serve") + 1] if "serve" in command[:-1] else ""
    if model.startswith("/") and not os.path.exists(model):
        # A volume's model path (hub ids and URIs are not paths): vLLM would take it for a hub id.
        print(f"{MODEL_PATH_MISSING_LINE} {model}", flush=True)
        return MODEL_PATH_MISSING_EXIT
    if settings.bytecode:
        print(f"{LINE_PREFIX}{keep_bytecode(settings.bytecode)}", flush=True)
    if settings.group_worker is not None:
        index = os.environ.get(settings.group_worker, "")
        if index != "0":
            worker = [*command, *settings.worker_arg]
            print(
                f"{LINE_PREFIX}index {index or '?'} of the group runs its rank: {' '.join(worker)}",
                flush=True,
            )
            if settings.pin_ptxas:
                print(f"{LINE_PREFIX}{pin_ptxas()}", flush=True)
            os.execvp(worker[0], worker)
    skipped = SkipLines(LINE_PREFIX)
    atexit.register(skipped.close)
    if settings.empty:
        try:
            empty_directory(settings.empty)
        except OSError as error:
            why = f"cannot empty the cache volume {settings.empty}, so no seed: {error}"
            print(f"{LINE_PREFIX}{why}", flush=True)
            return 1
        print(f"{LINE_PREFIX}emptied the cache volume {settings.empty}", flush=True)
    # The image's Python files start out of the page cache, so that what is in it when the engine process
    # starts is what a cold start reads, even on a node that has just pulled the image; the working
    # directory is not the image's.
    import_paths = sys.path[1:] if working_directory_first() else sys.path
    image_files = files_under([path for path in import_paths if os.path.isdir(path)], skipped)
    evict_pages(image_files)
    if settings.pin_ptxas:
        print(f"{LINE_PREFIX}{pin_ptxas()}", flush=True)
    server = subprocess.Popen(command)
    recorded: list[int] = []
    recording = threading.Thread(
        target=record_import_pages, args=(server, listing, image_files, skipped, recorded), daemon=True
    )
    recording.start()

    def stop(*_: object) -> None:
        server.terminate()
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    code = wait_until_healthy(server, port)
    if code is not None:
        return code
    print(f"{LINE_PREFIX}server is healthy, the compile cache is seeded", flush=True)
    if server_has_child(server.pid, 0):
        recording.join(FACTS_SECONDS)  # the engine process has started, so the listing is being written
    print_model_facts(command, skipped, import_pages_bytes=recorded[0] if recorded else None)
    model = command[command.index(SERVED_MODEL_NAME_FLAG) + 1]
    warm_up(port, model)
    stop_server(server)
    if settings.start_again:
        began = time.monotonic()
        server = subprocess.Popen(command)
        code = wait_until_healthy(server, port)
        if code is not None:
            return code
        print(f"{LINE_PREFIX}started again, healthy in {time.monotonic() - began:.1f} s", flush=True)
        warm_up(port, model)
        stop_server(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
