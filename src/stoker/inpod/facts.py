"""A model's facts from its own directory: what the seed Job prints on its facts line (stoker.inpod.seed),
which the operator parses (stoker.predict.facts), and what `stoker predict` reads from a local model."""

from __future__ import annotations

import fnmatch
import itertools
import json
import os
import re
import stat
from collections.abc import Callable

FACTS_LOG_PREFIX = "stoker-model-facts: "
# A facts line is a few hundred characters; anything much longer is not one to parse.
MAX_FACTS_LINE_LENGTH = 4096
# The seed's import pages' size (stoker.inpod.seed), beside the model's facts.
IMPORT_PAGES_KEY = "importPagesBytes"

# Physical ranges of what a seed's facts line may claim (it is printed by the tenant's pods, so untrusted):
# generous beyond every model seen, tight enough that nothing absurd reaches status, the fleet's
# observations or a prediction. The largest checkpoints are a few TB, the deepest models a few hundred
# layers, the widest vocabularies about a million tokens. The seed refuses to print facts outside them,
# and the operator (stoker.predict.model.ModelFacts) refuses to read them: one definition for both.
MAX_CHECKPOINT_BYTES = 1 << 46  # 64 TiB
# The seed's import pages: serving pods' read-ahead reads at most 16 GiB of a listing
# (stoker.inpod.read_ahead.listed_ranges); vLLM 0.26's are 1.7 GB.
MAX_IMPORT_PAGES_BYTES = 16 << 30
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20  # hidden and intermediate sizes
MAX_HEADS = 4096
MAX_VOCABULARY = 1 << 24
MAX_TOKENIZER_BYTES = 1 << 30
MAX_EXPERTS = 1 << 16
# Each whole-number fact of a facts line and its upper bound (the lower is 0).
MODEL_FACT_BOUNDS = {
    "checkpointBytes": MAX_CHECKPOINT_BYTES,
    "layers": MAX_LAYERS,
    "hiddenSize": MAX_WIDTH,
    "intermediateSize": MAX_WIDTH,
    "attentionHeads": MAX_HEADS,
    "kvHeads": MAX_HEADS,
    "vocabSize": MAX_VOCABULARY,
    "tokenizerBytes": MAX_TOKENIZER_BYTES,
    "experts": MAX_EXPERTS,
    IMPORT_PAGES_KEY: MAX_IMPORT_PAGES_BYTES,
}


def impossible_facts(facts: dict) -> list[str]:
    """What in `facts` lies outside its physical range (MODEL_FACT_BOUNDS), one phrase each; empty if
    nothing does."""

    def shown(value: int) -> str:
        digits = str(value)
        return digits if len(digits) <= 40 else f"{digits[:12]}... ({len(digits)} digits)"

    return [
        f"{name} {shown(facts[name])} is outside 0..{bound}"
        for name, bound in MODEL_FACT_BOUNDS.items()
        if isinstance(facts.get(name), int) and not 0 <= facts[name] <= bound
    ]


def read_model_facts(
    model_dir: str,
    skipped: Callable[[str, str], None] | None = None,
) -> dict:
    """Shapes and sizes of the model in `model_dir` (a Hugging Face layout), camelCase keys.

    Reads regular files only (a FIFO would block the read, a device never end it), JSON files up to a
    bound, the first 100,000 names of the directory and a dtype of at most 32 letters, digits, `_` or `.`;
    what it passes by (an index, a weight file, a dtype) it tells `skipped(what, why)`, if given. Raises
    ValueError naming the directory and what is missing when it holds no usable config.json.
    """
    max_entries = 100_000

    def report(what: str, why: str) -> None:
        if skipped is not None:
            skipped(what, why)

    def not_regular(mode: int) -> str:
        kinds = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device"}
        kinds.update({stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"})
        return f"{kinds.get(stat.S_IFMT(mode), 'not a regular file')}, not a regular file"

    def load_json(path: str, limit: int) -> object:
        """The JSON document in regular file `path` of at most `limit` bytes; OSError or ValueError says
        why not."""
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(not_regular(mode))
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise OSError(not_regular(mode))
            document = file.read(limit + 1)
        if len(document) > limit:
            raise ValueError(f"larger than {limit >> 20} MiB")
        try:
            return json.loads(document.decode("utf-8"))
        except RecursionError:
            raise ValueError("not valid JSON (nested too deeply)") from None
        except ValueError as error:
            raise ValueError(f"not valid JSON ({str(error)[:200]})") from None

    config_path = os.path.join(model_dir, "config.json")
    try:
        config = load_json(config_path, 4 << 20)
    except OSError as error:
        raise ValueError(f"{model_dir}: cannot read config.json ({error.strerror or error})") from None
    except ValueError as error:
        raise ValueError(f"{config_path}: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: not a JSON object")
    # Multimodal configs keep the language model's shape under text_config; it wins where both say.
    text_config = config.get("text_config")
    merged = {**config, **text_config} if isinstance(text_config, dict) else config

    def first(*names: str, default: object = None) -> object:
        for name in names:
            value = merged.get(name)
            if value is not None:
                return value
        return default

    def whole(*names: str, default: int | None = None) -> int:
        value = first(*names, default=default)
        if value is None:
            raise ValueError(f"{config_path}: no {' / '.join(names)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"{config_path}: {' / '.join(names)} must be a non-negative integer, got {value!r:.100}"
            )
        return value

    try:
        with os.scandir(model_dir) as scan:
            names = sorted(entry.name for entry in itertools.islice(scan, max_entries + 1))
    except OSError as error:
        names = []
        report(model_dir, error.strerror or str(error))
    if len(names) > max_entries:
        names = names[:max_entries]
        report(model_dir, f"more than {max_entries} entries, the rest not counted")

    def total_bytes(*patterns: str) -> int:
        # As glob would: names that start with a dot are hidden from the patterns.
        matched = {name for pattern in patterns for name in fnmatch.filter(names, pattern) if name[0] != "."}
        total = 0
        for name in sorted(matched):
            path = os.path.join(model_dir, name)
            try:
                found = os.stat(path)  # follows the links of a Hugging Face cache snapshot to the blobs
            except OSError as error:
                report(path, error.strerror or str(error))
                continue
            if stat.S_ISREG(found.st_mode):
                total += found.st_size
            elif not stat.S_ISDIR(found.st_mode):
                report(path, not_regular(found.st_mode))
        return total

    def indexed_bytes() -> int:
        """The shards' tensor bytes a sharded checkpoint's index states (its shards need not be here)."""
        for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            path = os.path.join(model_dir, name)
            try:
                index = load_json(path, 32 << 20)  # a 1T-parameter MoE's index is ~12 MiB
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as error:
                report(path, getattr(error, "strerror", None) or str(error))
                continue
            metadata = index.get("metadata") if isinstance(index, dict) else None
            size = metadata.get("total_size") if isinstance(metadata, dict) else None
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                return size
        return 0

    attention_heads = whole("num_attention_heads", "n_head", "num_heads")
    experts = 0
    for name in ("num_local_experts", "num_experts", "n_routed_experts"):
        count = merged.get(name)
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            experts = count
            break
    tokenizer_bytes = total_bytes("tokenizer.json") or total_bytes(
        "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "*.tiktoken"
    )
    dtype = first("torch_dtype", "dtype")
    if dtype is not None and not (isinstance(dtype, str) and re.fullmatch(r"[A-Za-z0-9_.]{1,32}", dtype)):
        report(f"{config_path} dtype", f"not a dtype name of at most 32 characters ({dtype!r:.60})")
        dtype = None
    facts = {
        "checkpointBytes": total_bytes("*.safetensors") or total_bytes("*.bin", "*.pt", "*.pth"),
        "layers": whole("num_hidden_layers", "n_layer", "num_layers"),
        "hiddenSize": whole("hidden_size", "n_embd", "d_model"),
        "intermediateSize": whole("intermediate_size", "ffn_dim", "n_inner", default=0),
        "attentionHeads": attention_heads,
        "kvHeads": whole("num_key_value_heads", "num_kv_heads", default=attention_heads),
        "vocabSize": whole("vocab_size"),
        "tokenizerBytes": tokenizer_bytes,
        "moe": experts > 0,
        "experts": experts,
        "dtype": dtype,
    }
    indexed = 0 if facts["checkpointBytes"] else indexed_bytes()
    if indexed:
        facts.update(checkpointBytes=indexed, checkpointBytesSource="indexMetadata")
    return facts
