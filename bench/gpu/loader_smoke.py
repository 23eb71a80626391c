"""Before a lease's runs: do the weight loaders that the profiles name work on this host? Loads one
256 MiB safetensors file to the GPU through InstantTensor (direct and buffered I/O) and fastsafetensors
(without GDS), checks the bytes, and prints one JSON line per loader with its time or its error.

usage: PYTHONPATH=<loaders> python3 loader_smoke.py DIR
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch
from safetensors.torch import save_file


def instanttensor_load(path: str, backend: str) -> dict[str, torch.Tensor]:
    import instanttensor

    os.environ["INSTANTTENSOR_BACKEND"] = backend
    with instanttensor.safe_open([path], framework="pt", device=0, copy=True) as f:
        return {name: tensor for name, tensor in f.tensors()}


def fastsafetensors_load(path: str) -> dict[str, torch.Tensor]:
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    loader = SafeTensorsFileLoader(SingleGroup(), "cuda:0", nogds=True)
    loader.add_filenames({0: [path]})
    buffer = loader.copy_files_to_device()
    try:
        return {name: buffer.get_tensor(name).clone() for name in loader.get_keys()}
    finally:
        buffer.close()
        loader.close()


def main() -> None:
    directory = sys.argv[1]
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "smoke.safetensors")
    expected = {f"w{i}": torch.randn(4096, 4096, dtype=torch.bfloat16) for i in range(8)}
    save_file(expected, path)
    loaders = {
        "instanttensor-direct": lambda: instanttensor_load(path, "URING,AIO"),
        "instanttensor-buffered": lambda: instanttensor_load(path, "BUFFERED"),
        "fastsafetensors-nogds": lambda: fastsafetensors_load(path),
    }
    for name, load in loaders.items():
        started = time.monotonic()
        try:
            loaded = load()
            same = all(torch.equal(loaded[key].cpu(), value) for key, value in expected.items())
            print(json.dumps({"loader": name, "ok": same, "seconds": round(time.monotonic() - started, 3)}))
        except Exception:
            print(json.dumps({"loader": name, "ok": False, "error": traceback.format_exc(limit=3)[-600:]}))


if __name__ == "__main__":
    main()
