#!/usr/bin/env python3
"""hack/image.py -- a container image as a docker-archive tarball, from layer tarballs, offline.

    hack/image.py OUT.tar --tag REF --layer base.tar [--layer more.tar ...] [--entrypoint JSON] [--cmd JSON]
                  [--env K=V ...] [--user UID:GID] [--workdir DIR]
    hack/image.py --tree LAYER.tar SRC_DIR [--venv-python INTERPRETER]
                  a layer holding SRC_DIR at its own absolute path, parents world-traversable (0755);
                  with --venv-python, SRC_DIR is a virtual environment whose interpreter in the image is
                  INTERPRETER (bin/python and pyvenv.cfg's home point there, not at the building host's)

The archive is what `docker save` writes (manifest.json, the config, one uncompressed tar per layer) and what
`ctr images import` reads. crane can append layers offline but sets an image's entrypoint, user and
environment only against a registry; this writes the config itself. Needs only the standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_archive(out: Path, tag: str, layers: list[Path], config: dict[str, object]) -> None:
    diff_ids = [sha256_of(layer) for layer in layers]
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]},
        "history": [{"created_by": f"hack/image.py layer {layer.name}"} for layer in layers],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [f"{d}/layer.tar" for d in diff_ids]}]
    partial = out.with_suffix(".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
        for digest, layer in zip(diff_ids, layers, strict=True):
            archive.add(layer, arcname=f"{digest}/layer.tar")
        for name, data in ((config_name, config_bytes), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    partial.rename(out)


def write_tree_layer(out: Path, source: Path, venv_python: str | None = None) -> None:
    source = source.resolve()
    if not source.is_dir():
        sys.exit(f"image.py: {source} is not a directory")
    root = str(source).lstrip("/")
    config = source / "pyvenv.cfg"
    if venv_python and not config.is_file():
        sys.exit(f"image.py: {source} is not a virtual environment (no pyvenv.cfg)")

    def in_image(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not venv_python:
            return info
        if info.name == f"{root}/pyvenv.cfg":
            return None  # added below, rewritten
        if info.name == f"{root}/bin/python" and info.issym():
            info.linkname = venv_python  # the host's interpreter (pyenv, uv) is not in the image
        return info

    partial = out.with_suffix(".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as layer:
        # Parents such as /root are 0700 in the base: the image's non-root user must reach SRC_DIR.
        for parent in reversed(source.parents[:-1]):
            info = tarfile.TarInfo(str(parent).lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            layer.addfile(info)
        layer.add(source, arcname=root, filter=in_image)  # hard links inside stay links
        if venv_python:
            lines = config.read_text().splitlines()
            home = f"home = {Path(venv_python).parent}"
            data = "\n".join(home if line.startswith("home =") else line for line in lines).encode() + b"\n"
            info = tarfile.TarInfo(f"{root}/pyvenv.cfg")
            info.size, info.mode = len(data), 0o644
            layer.addfile(info, io.BytesIO(data))
    partial.rename(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--tree", type=Path, help="write OUT as a layer of this directory instead")
    parser.add_argument("--venv-python", help="with --tree: the venv's interpreter inside the image")
    parser.add_argument("--tag")
    parser.add_argument("--layer", type=Path, action="append", default=[])
    parser.add_argument("--entrypoint", type=json.loads)
    parser.add_argument("--cmd", type=json.loads)
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--user")
    parser.add_argument("--workdir")
    args = parser.parse_args()
    if args.tree:
        write_tree_layer(args.out, args.tree, args.venv_python)
        return
    if not args.tag or not args.layer:
        parser.error("--tag and at least one --layer are required")
    for layer in args.layer:
        if not tarfile.is_tarfile(layer):
            sys.exit(f"image.py: {layer} is not a tar archive")
    config = {
        "Entrypoint": args.entrypoint,
        "Cmd": args.cmd,
        "Env": args.env,
        "User": args.user,
        "WorkingDir": args.workdir,
    }
    write_archive(args.out, args.tag, args.layer, {k: v for k, v in config.items() if v})


if __name__ == "__main__":
    main()
