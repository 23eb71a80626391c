"""The seed Job's facts line, as the operator reads it from the seed's log (the seed prints it with
stoker.inpod.facts.read_model_facts), and the weights the seed's log shows."""

from __future__ import annotations

import json

from pydantic import ValidationError

from stoker.inpod.facts import FACTS_LOG_PREFIX, MAX_FACTS_LINE_LENGTH
from stoker.predict.model import MAX_CHECKPOINT_BYTES, ModelFacts


def with_logged_weights(
    facts: ModelFacts, worker_weight_bytes: int | None, tensor_parallel: int
) -> ModelFacts:
    """`facts` with checkpointBytes from the seed's log when the model directory held no weights.

    The seed loads dummy weights, so a hub model's local snapshot has only config and tokenizer; the
    weights the engine allocated anyway are the model's size in its dtype, each worker holding its
    tensor-parallel share. A logged size beyond a checkpoint's physical range (the log is the tenant's
    pod's) is not taken: the facts stay as the directory gave them.
    """
    logged = (worker_weight_bytes or 0) * tensor_parallel
    if facts.checkpoint_bytes or not 0 < logged <= MAX_CHECKPOINT_BYTES:
        return facts
    return facts.model_copy(update={"checkpoint_bytes": logged, "checkpoint_bytes_source": "seedLog"})


def parse_facts_line(line: str) -> ModelFacts | None:
    """The facts a log line carries (behind any timestamp prefix), or None for any other line.

    Raises ValueError when the line carries the prefix but its facts are not valid JSON, not a model's
    facts or out of their physical ranges (stoker.predict.model), or the line is longer than any facts
    line, so that a garbled or forged line is reported, not taken for absent. The message quotes at most
    a short excerpt of what the pod printed.
    """
    _, prefix, document = line.partition(FACTS_LOG_PREFIX)
    if not prefix:
        return None
    if len(document) > MAX_FACTS_LINE_LENGTH:
        raise ValueError(
            f"model facts line of {len(document)} characters, longer than {MAX_FACTS_LINE_LENGTH}:"
            f" {document[:80]!r}..."
        )
    try:
        facts = json.loads(document)
    except ValueError as error:
        raise ValueError(f"garbled model facts line ({error}): {line.strip()[:200]!r}") from None
    try:
        return ModelFacts.model_validate(facts)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or 'facts'}: {problem['msg']}"
            for problem in error.errors(include_input=False, include_url=False)[:5]
        )
        raise ValueError(f"model facts out of range or malformed: {problems}"[:1000]) from None
