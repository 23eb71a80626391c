"""The programs stoker runs inside pods, on hostile trees: the serving pods' read-ahead
(stoker.inpod.read_ahead) and the seed Job's wrapper (stoker.inpod.seed), each taken from the container the
builders render and run as a real process from the directory `stoker programs` writes, under a wall-clock
limit and an address-space limit (RLIMIT_AS), around a stand-in `vllm` that notes when it started. On every
tree each must finish in bounded time and memory, start the server at once (the read-ahead) or before it
reads the model (the seed, which reads it once the server is healthy), and say why it skipped each thing in
exactly one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from stoker.api import KIND, VLLMService
from stoker.inpod.facts import FACTS_LOG_PREFIX, MAX_FACTS_LINE_LENGTH
from stoker.predict.facts import parse_facts_line
from stoker.render import render_children
from tests.unit.test_seed_facts import CONFIG

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pvc-weights.yaml"
MiB = 1 << 20
# What each run may take: address space (the reader alone needs less than 1 GiB) and seconds until the
# program and every process it started have closed their output.
ADDRESS_SPACE = 1 << 30
READ_AHEAD_SECONDS = 60
SEED_SECONDS = 90
# From the program's start to the server's: the read-ahead forks its reader and runs the server at once.
READ_AHEAD_SERVER_START_SECONDS = 5
# The seed starts its server once it has evicted the image's files (here this venv's: 3-14 s, with the
# machine's load), before it reads anything of the model's tree.
SEED_SERVER_START_SECONDS = 30

# A stand-in for vLLM's console script (of this interpreter, as pip writes it): notes when it first started
# (a seed that loads the mega AOT artifact starts it twice), then exits, or with STOKER_TEST_SERVE answers
# /health and a completion on vLLM's port until SIGTERM.
STAND_IN = """#!{python}
import http.server, os, signal, sys, time

if not os.path.exists(os.environ["STOKER_TEST_STARTED"]):
    with open(os.environ["STOKER_TEST_STARTED"], "w") as note:
        note.write(repr(time.time()))
if os.environ.get("STOKER_TEST_SERVE"):

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.do_GET()

        def log_message(self, *arguments):
            pass

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    http.server.HTTPServer(("127.0.0.1", 8000), Server).serve_forever()
"""


def rendered_argv(kind: str) -> list[str]:
    """The argv of the example's serving (Deployment) or seed (Job) container, as the builders render it."""
    (document,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d.get("kind") == KIND]
    (child,) = [c for c in render_children(VLLMService.model_validate(document)) if c["kind"] == kind]
    container = child["spec"]["template"]["spec"]["containers"][0]
    return [*container["command"], *container.get("args", [])]


def local_argv(kind: str, model: Path | str, listing: Path) -> list[str]:
    """The rendered argv with the local swaps only: this interpreter for python3, the tree's model path for
    the rendered one, and its page listing and the directory beside it for the cache volume's."""
    argv = rendered_argv(kind)
    rendered_model = argv[argv.index("serve") + 1]
    argv = [str(model) if arg == rendered_model else arg for arg in argv]
    argv[argv.index("--pages") + 1] = str(listing)
    if "--empty" in argv:
        volume = listing.parent / "cache-volume"
        volume.mkdir(exist_ok=True)
        argv[argv.index("--empty") + 1] = str(volume)
    assert argv[:2] == ["python3", "-m"]
    return [sys.executable, *argv[1:]]


@dataclass
class Run:
    seconds: float  # until the program and every process it started had closed their output
    server_started: float  # seconds from the program's start to the stand-in's
    returncode: int
    stdout: str
    stderr: str


def limit_address_space() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run(argv: list[str], tmp_path: Path, programs: Path, seconds: float, serve: bool = False) -> Run:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / "vllm"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    note = tmp_path / "server-started"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(programs),  # the programs volume's place
        "STOKER_TEST_STARTED": str(note),
        "HF_HUB_CACHE": str(tmp_path / "hub"),
    }
    if serve:
        # vLLM's port is the program's, 8000: in a network namespace of its own, beside other tests.
        env["STOKER_TEST_SERVE"] = "1"
        argv = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
    began, wall = time.monotonic(), time.time()
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=env,
        cwd=tmp_path,
        start_new_session=True,  # the reader the read-ahead forks is in the group, killed with it
        preexec_fn=limit_address_space,
    )
    try:
        stdout, stderr = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"still running after {seconds} s:\n{stdout}\n{stderr}")
    elapsed = time.monotonic() - began
    assert note.exists(), f"the server never started:\n{stdout}\n{stderr}"
    return Run(elapsed, float(note.read_text()) - wall, process.returncode, stdout, stderr)


def skip(what: object, why: str) -> str:
    """A skip line's pattern (after the program's prefix): exactly this."""
    return re.escape(f"skipped {what}: {why}")


def skip_starting(what: object, why: str) -> str:
    """A skip line's pattern whose reason starts with `why` (it quotes what it found)."""
    return re.escape(f"skipped {what}: {why}") + ".*"


def assert_one_line_per_skip(output: str, prefix: str, expected: list[str]) -> None:
    lines = [
        line.removeprefix(prefix) for line in output.splitlines() if line.startswith(f"{prefix}skipped ")
    ]
    for pattern in expected:
        matching = [line for line in lines if re.fullmatch(pattern, line)]
        assert len(matching) == 1, (pattern, lines)
    assert len(lines) == len(expected), lines


def sparse_file(path: Path, data_at: int = 0, data: bytes = b"") -> int:
    """A file of the largest size the file system takes (up to 1 PiB), holding `data` at `data_at` from
    its end and holes elsewhere; returns its size."""
    for size in (1 << 50, 1 << 43, 1 << 40, 1 << 36):
        try:
            with path.open("wb") as file:
                file.truncate(size)
                file.seek(size - data_at)
                file.write(data)
            return size
        except OSError:
            continue
    pytest.skip("no sparse files here")


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


# --- the read-ahead --------------------------------------------------------------------------------------


@dataclass
class Tree:
    """A hostile tree for the read-ahead: its model path, its page listing and what it must say."""

    model: Path | str
    listing: Path
    skips: list[str] = field(default_factory=list)
    checkpoint_bytes: int | None = None  # what the reader must read of the checkpoint, where known
    pages_bytes: int | None = None  # ...and of the listed pages


def model_with(tmp_path: Path, *names: str) -> Path:
    """A model directory with one real 1 MiB weight file besides what the tree adds."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model-00001-of-00001.safetensors").write_bytes(os.urandom(MiB))
    for name in names:
        (model / name).write_bytes(b"{}")
    return model


def empty_listing(tmp_path: Path) -> Path:
    listing = tmp_path / "import-pages"
    listing.write_bytes(b"")
    return listing


def symlink_loops(tmp_path: Path) -> Tree:
    model = model_with(tmp_path)
    (model / "a").symlink_to(".")
    (model / "b").symlink_to("..")
    (model / "sub").mkdir()
    (model / "sub" / "up").symlink_to("../..")
    why = "a link to a directory, not followed"
    skips = [skip(model / "a", why), skip(model / "b", why), skip(model / "sub" / "up", why)]
    return Tree(model, empty_listing(tmp_path), skips, checkpoint_bytes=MiB)


def link_to_the_root(tmp_path: Path) -> Tree:
    model = model_with(tmp_path)
    (model / "everything").symlink_to("/")
    skips = [skip(model / "everything", "a link to a directory, not followed")]
    return Tree(model, empty_listing(tmp_path), skips, checkpoint_bytes=MiB)


def deep_nesting(tmp_path: Path) -> Tree:
    model = model_with(tmp_path)
    deepest = model.joinpath(*["d"] * 200)
    deepest.mkdir(parents=True)
    (deepest / "deep.safetensors").write_bytes(b"x")
    skips = [skip(model.joinpath(*["d"] * 33), f"more than 32 directories below {model}")]
    return Tree(model, empty_listing(tmp_path), skips, checkpoint_bytes=MiB)


def a_hundred_thousand_files(tmp_path: Path) -> Tree:
    model = model_with(tmp_path)
    for number in range(100_000):
        (model / f"empty-{number:06}.safetensors").touch()
    skips = [skip(model, "more than 100000 entries, the rest not read")]
    return Tree(model, empty_listing(tmp_path), skips)


def fifo_weights(tmp_path: Path) -> Tree:
    model = model_with(tmp_path)
    fifo(model / "model-00002-of-00002.safetensors")
    skips = [skip(model / "model-00002-of-00002.safetensors", "a FIFO, not a regular file")]
    return Tree(model, empty_listing(tmp_path), skips, checkpoint_bytes=MiB)


def fifo_model_path(tmp_path: Path) -> Tree:
    model = fifo(tmp_path / "model")
    return Tree(model, empty_listing(tmp_path), [skip(model, "a FIFO, not a regular file")], 0)


def dev_zero_weights(tmp_path: Path) -> Tree:
    model = model_with(tmp_path)
    (model / "zeros.safetensors").symlink_to("/dev/zero")
    skips = [skip(model / "zeros.safetensors", "a character device, not a regular file")]
    return Tree(model, empty_listing(tmp_path), skips, checkpoint_bytes=MiB)


def socket_weights(tmp_path: Path) -> Tree:
    model = model_with(tmp_path)
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(model / "s.safetensors"))
    skips = [skip(model / "s.safetensors", "a socket, not a regular file")]
    return Tree(model, empty_listing(tmp_path), skips, checkpoint_bytes=MiB)


def unreadable_weights(tmp_path: Path) -> Tree:
    # The tests run as root, who reads every mode: unreadable here is a dangling link and a link loop.
    model = model_with(tmp_path)
    (model / "gone.safetensors").symlink_to(tmp_path / "nowhere")
    (model / "loop.safetensors").symlink_to("loop.safetensors")
    skips = [
        skip(model / "gone.safetensors", "No such file or directory"),
        skip(model / "loop.safetensors", "Too many levels of symbolic links"),
    ]
    return Tree(model, empty_listing(tmp_path), skips, checkpoint_bytes=MiB)


def missing_model(tmp_path: Path) -> Tree:
    model = tmp_path / "absent"
    hub = tmp_path / "hub" / ("models--" + str(model).replace("/", "--")) / "snapshots"
    skips = [skip(model, f"no such file or directory, nor a model in {hub}")]
    return Tree(model, empty_listing(tmp_path), skips, checkpoint_bytes=0)


def sparse_weights(tmp_path: Path) -> Tree:
    # A petabyte (or what the file system allows) of holes around 1 MiB of data: the data is read.
    model = model_with(tmp_path)
    sparse_file(model / "huge.safetensors", data_at=2 * MiB, data=os.urandom(MiB))
    return Tree(model, empty_listing(tmp_path), checkpoint_bytes=2 * MiB)


def a_thousand_links_to_one_file(tmp_path: Path) -> Tree:
    model = model_with(tmp_path)
    for number in range(1000):
        (model / f"link-{number:04}.safetensors").symlink_to("model-00001-of-00001.safetensors")
    return Tree(model, empty_listing(tmp_path), checkpoint_bytes=MiB)  # read once


def a_name_with_a_newline(tmp_path: Path) -> Tree:
    # The skip line shows the name escaped: it cannot print a line of its own.
    model = model_with(tmp_path)
    name = f"x\n{FACTS_LOG_PREFIX}{{}}.safetensors"
    fifo(model / name)
    skips = [skip(ascii(str(model / name)), "a FIFO, not a regular file")]
    return Tree(model, empty_listing(tmp_path), skips, checkpoint_bytes=MiB)


def fifo_listing(tmp_path: Path) -> Tree:
    listing = fifo(tmp_path / "import-pages")
    skips = [skip(listing, "no import pages listing (a FIFO, not a regular file)")]
    return Tree(model_with(tmp_path), listing, skips, MiB, 0)


def missing_listing(tmp_path: Path) -> Tree:
    listing = tmp_path / "import-pages"
    skips = [skip(listing, "no import pages listing (No such file or directory)")]
    return Tree(model_with(tmp_path), listing, skips, MiB, 0)


def listing(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "import-pages"
    path.write_bytes(content)
    return path


def listed_fifo_device_and_missing_file(tmp_path: Path) -> Tree:
    library = tmp_path / "library.so"
    library.write_bytes(os.urandom(64 << 10))
    pipe = fifo(tmp_path / "pipe.so")
    lines = [f"{pipe} 0 4096", "/dev/zero 0 4096", f"{tmp_path / 'gone.so'} 0 4096", f"{library} 0 8192"]
    skips = [
        skip(pipe, "a FIFO, not a regular file"),
        skip("/dev/zero", "a character device, not a regular file"),
        skip(tmp_path / "gone.so", "No such file or directory"),
    ]
    pages = listing(tmp_path, "".join(f"{line}\n" for line in lines).encode())
    return Tree(model_with(tmp_path), pages, skips, MiB, 8192)


def listed_ranges_past_the_end(tmp_path: Path) -> Tree:
    # Ends of 1e17 (and a sparse petabyte to 1e18): clamped to each file's data, not 2.4e10 ranges.
    library = tmp_path / "library.so"
    library.write_bytes(os.urandom(MiB))
    sparse = tmp_path / "sparse.so"
    sparse_file(sparse, data_at=MiB, data=os.urandom(4096))
    lines = f"{library} 0 {10**17}\n{sparse} 0 {10**18}\n"
    return Tree(model_with(tmp_path), listing(tmp_path, lines.encode()), [], MiB, MiB + 4096)


GARBLED = {
    "binary": os.urandom(MiB),
    "negative": b"/lib/a.so -5 10\n",
    "start-after-end": b"/lib/a.so 10 5\n",
    "twenty-digits": b"/lib/a.so 0 99999999999999999999\n",
    "relative-path": b"lib/a.so 0 4096\n",
    "nul-in-path": b"/lib/a\0.so 0 4096\n",
    "one-10-MB-line": b"/" + b"a" * (10 * MiB) + b" 0 4096\n",
}


def garbled_listing(kind: str) -> Callable[[Path], Tree]:
    def tree(tmp_path: Path) -> Tree:
        library = tmp_path / "library.so"
        library.write_bytes(os.urandom(8192))
        # A good line, then the garbled one: what came before is read, nothing after.
        pages = listing(
            tmp_path, f"{library} 0 8192\n".encode() + GARBLED[kind] + f"{library} 0 8192\n".encode()
        )
        skips = [skip_starting(f"{pages} from line 2", "not `path start end` (")]
        return Tree(model_with(tmp_path), pages, skips, MiB, 8192)

    tree.__name__ = f"garbled_listing_{kind}"
    return tree


def a_million_and_one_lines(tmp_path: Path) -> Tree:
    gone = "/g"  # short lines: 10 MB, under the listing's size bound
    pages = listing(tmp_path, f"{gone} 0 4096\n".encode() * 1_000_001)
    skips = [
        skip(gone, "No such file or directory"),
        skip(f"{pages} from line 1000001", "more than 1000000 lines"),
    ]
    return Tree(model_with(tmp_path), pages, skips, MiB, 0)


def a_listing_of_70_mb(tmp_path: Path) -> Tree:
    gone = tmp_path / ("g" * 4000)
    line = f"{gone} 0 4096\n".encode()
    pages = listing(tmp_path, line * (70 * MiB // len(line)))
    first_over = 64 * MiB // len(line) + 1
    skips = [skip(gone, "File name too long"), skip(f"{pages} from line {first_over}", "over 64 MiB")]
    return Tree(model_with(tmp_path), pages, skips, MiB, 0)


def a_hundred_missing_files(tmp_path: Path) -> Tree:
    # 20 lines, then one that counts the rest: a listing cannot flood the log.
    lines = "".join(f"{tmp_path / f'gone-{number:03}.so'} 0 4096\n" for number in range(100))
    skips = [skip(tmp_path / f"gone-{number:03}.so", "No such file or directory") for number in range(20)]
    return Tree(model_with(tmp_path), listing(tmp_path, lines.encode()), skips, MiB, 0)


TREES = [
    symlink_loops,
    link_to_the_root,
    deep_nesting,
    a_hundred_thousand_files,
    fifo_weights,
    fifo_model_path,
    dev_zero_weights,
    socket_weights,
    unreadable_weights,
    missing_model,
    sparse_weights,
    a_thousand_links_to_one_file,
    a_name_with_a_newline,
    fifo_listing,
    missing_listing,
    listed_fifo_device_and_missing_file,
    listed_ranges_past_the_end,
    *(garbled_listing(kind) for kind in GARBLED),
    a_million_and_one_lines,
    a_listing_of_70_mb,
    a_hundred_missing_files,
]


@pytest.mark.timeout(READ_AHEAD_SECONDS * 3)
@pytest.mark.parametrize("tree", TREES, ids=lambda tree: tree.__name__)
def test_the_read_ahead_finishes_on_a_hostile_tree_and_says_why_it_skipped(
    tmp_path: Path, programs: Path, tree: Callable[[Path], Tree]
) -> None:
    hostile = tree(tmp_path)
    argv = local_argv("Deployment", hostile.model, hostile.listing)
    result = run(argv, tmp_path, programs, READ_AHEAD_SECONDS)
    assert result.returncode == 0, result.stderr
    assert result.server_started < READ_AHEAD_SERVER_START_SECONDS, result.stderr
    prefix = "stoker read-ahead: "
    assert_one_line_per_skip(result.stderr, prefix, hostile.skips)
    if tree is a_hundred_missing_files:
        assert f"{prefix}and 80 more skipped, not listed" in result.stderr.splitlines()
    # The reader finished (not stopped by its address-space limit, nor by an error).
    assert "stoker read-ahead: stopped" not in result.stderr
    (pages,) = re.findall(r"^stoker read-ahead: (\d+) bytes of the imports' pages in ", result.stderr, re.M)
    (checkpoint,) = re.findall(r"^stoker read-ahead: (\d+) bytes in .*, one reader$", result.stderr, re.M)
    if hostile.pages_bytes is not None:
        assert int(pages) == hostile.pages_bytes
    if hostile.checkpoint_bytes is not None:
        assert int(checkpoint) == hostile.checkpoint_bytes


# --- the seed --------------------------------------------------------------------------------------------


@dataclass
class Model:
    """A hostile model directory for the seed: what it must skip, and its facts line or why it has none."""

    directory: Path | str
    skips: list[str] = field(default_factory=list)
    facts: dict[str, object] | None = None  # fields the facts line must carry
    no_facts: str | None = None  # ...or what the line that says there are none must contain


def seed_model(tmp_path: Path, config: dict[str, object] | None = None) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    if config is not None:
        (model / "config.json").write_text(json.dumps(config))
    (model / "tokenizer.json").write_text("{}")
    return model


def good_model(tmp_path: Path) -> Model:
    model = seed_model(tmp_path, CONFIG)
    (model / "model.safetensors").write_bytes(bytes(4096))
    return Model(model, facts={"layers": 2, "checkpointBytes": 4096, "dtype": "bfloat16"})


def fifo_config(tmp_path: Path) -> Model:
    model = seed_model(tmp_path)
    fifo(model / "config.json")
    return Model(model, no_facts="cannot read config.json (a FIFO, not a regular file)")


def fifo_index(tmp_path: Path) -> Model:
    model = seed_model(tmp_path, CONFIG)
    fifo(model / "model.safetensors.index.json")
    skips = [skip(model / "model.safetensors.index.json", "a FIFO, not a regular file")]
    return Model(model, skips, facts={"checkpointBytes": 0})


def a_100_mb_config(tmp_path: Path) -> Model:
    model = seed_model(tmp_path)
    with (model / "config.json").open("wb") as config:
        config.truncate(100 * MiB)
    return Model(model, no_facts="config.json: larger than 4 MiB")


def an_index_of_a_million_entries(tmp_path: Path) -> Model:
    model = seed_model(tmp_path, CONFIG)
    weights = {
        f"model.layers.{number}.mlp.weight": "model-00001-of-00002.safetensors" for number in range(10**6)
    }
    index = {"metadata": {"total_size": 16 << 30}, "weight_map": weights}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    skips = [skip(model / "model.safetensors.index.json", "larger than 32 MiB")]
    return Model(model, skips, facts={"checkpointBytes": 0})


def an_enormous_dtype(tmp_path: Path) -> Model:
    model = seed_model(tmp_path, {**CONFIG, "torch_dtype": "b" * 200_000})
    skips = [skip_starting(f"{model / 'config.json'} dtype", "not a dtype name of at most 32 characters (")]
    return Model(model, skips, facts={"dtype": None, "layers": 2})


def a_dtype_that_is_an_object(tmp_path: Path) -> Model:
    model = seed_model(tmp_path, {**CONFIG, "torch_dtype": {"nested": list(range(10_000))}})
    skips = [skip_starting(f"{model / 'config.json'} dtype", "not a dtype name of at most 32 characters (")]
    return Model(model, skips, facts={"dtype": None})


def enormous_integers(tmp_path: Path) -> Model:
    # Fields of 4,000 digits each (under Python's 4,300): no model is that, and the line would be far over
    # what the operator parses. The seed says which facts are impossible, briefly.
    huge = int("9" * 4000)
    config = {**CONFIG, **{name: huge for name in ("num_hidden_layers", "hidden_size", "vocab_size")}}
    model = seed_model(tmp_path)
    (model / "config.json").write_text(json.dumps(config))
    return Model(model, no_facts="impossible: layers 999999999999... (4000 digits) is outside 0..4096")


def deeply_nested_config(tmp_path: Path) -> Model:
    model = seed_model(tmp_path)
    (model / "config.json").write_text("[" * 1_000_000)
    return Model(model, no_facts="not valid JSON (nested too deeply)")


def dev_zero_and_fifo_weights(tmp_path: Path) -> Model:
    model = seed_model(tmp_path, CONFIG)
    (model / "model.safetensors").symlink_to("/dev/zero")
    fifo(model / "tokenizer.model")
    (model / "tokenizer.json").unlink()  # else the other tokenizer files are not looked at
    skips = [
        skip(model / "model.safetensors", "a character device, not a regular file"),
        skip(model / "tokenizer.model", "a FIFO, not a regular file"),
    ]
    return Model(model, skips, facts={"checkpointBytes": 0, "tokenizerBytes": 0})


def a_config_link_loop(tmp_path: Path) -> Model:
    model = seed_model(tmp_path)
    (model / "config.json").symlink_to("config.json")
    return Model(model, no_facts="cannot read config.json (Too many levels of symbolic links)")


def a_hundred_thousand_and_one_entries(tmp_path: Path) -> Model:
    model = seed_model(tmp_path, CONFIG)
    for number in range(100_000):
        (model / f"shard-{number:06}.bin").touch()
    skips = [skip(model, "more than 100000 entries, the rest not counted")]
    return Model(model, skips, facts={"layers": 2})


MODELS = [
    fifo_config,
    fifo_index,
    a_100_mb_config,
    an_index_of_a_million_entries,
    an_enormous_dtype,
    a_dtype_that_is_an_object,
    enormous_integers,
    deeply_nested_config,
    dev_zero_and_fifo_weights,
    a_config_link_loop,
    a_hundred_thousand_and_one_entries,
]


def run_seed(tmp_path: Path, programs: Path, model: Path | str) -> Run:
    if not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("no unshare or ip: the seed's port 8000 needs a network namespace of its own")
    argv = local_argv("Job", model, tmp_path / "import-pages")
    result = run(argv, tmp_path, programs, SEED_SECONDS, serve=True)
    if "unshare: unshare failed" in result.stderr:
        pytest.skip("no network namespaces here")
    return result


@pytest.mark.timeout(SEED_SECONDS * 3)
@pytest.mark.parametrize("hostile", MODELS, ids=lambda model: model.__name__)
def test_the_seed_completes_on_a_hostile_model_and_says_why_it_skipped(
    tmp_path: Path, programs: Path, hostile: Callable[[Path], Model]
) -> None:
    model = hostile(tmp_path)
    result = run_seed(tmp_path, programs, model.directory)
    assert result.returncode == 0, result.stdout
    assert result.server_started < SEED_SERVER_START_SECONDS
    lines = result.stdout.splitlines()
    assert "stoker-seed: stopping the server" in lines
    assert_one_line_per_skip(result.stdout, "stoker-seed: ", model.skips)
    facts_lines = [line for line in lines if line.startswith(FACTS_LOG_PREFIX)]
    no_facts = [line for line in lines if line.startswith("stoker-seed: no model facts")]
    if model.facts is not None:
        assert not no_facts
        (line,) = facts_lines
        assert len(line) <= len(FACTS_LOG_PREFIX) + MAX_FACTS_LINE_LENGTH
        facts = json.loads(line.removeprefix(FACTS_LOG_PREFIX))
        assert {name: facts[name] for name in model.facts} == model.facts
        assert parse_facts_line(line) is not None
    else:
        assert not facts_lines
        (line,) = no_facts
        assert model.no_facts is not None and model.no_facts in line, line
        assert len(line) < 1000


def test_the_seed_of_a_good_model_prints_its_facts(tmp_path: Path, programs: Path) -> None:
    model = good_model(tmp_path)
    result = run_seed(tmp_path, programs, model.directory)
    assert result.returncode == 0, result.stdout
    assert_one_line_per_skip(result.stdout, "stoker-seed: ", [])
    (line,) = [line for line in result.stdout.splitlines() if line.startswith(FACTS_LOG_PREFIX)]
    facts = parse_facts_line(line)
    assert facts is not None and (facts.layers, facts.checkpoint_bytes, facts.dtype) == (2, 4096, "bfloat16")


def test_there_are_at_least_twenty_hostile_trees_of_each_program_together() -> None:
    assert len(TREES) >= 20 and len(TREES) + len(MODELS) >= 30
