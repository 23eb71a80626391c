"""Download a model's snapshot from the Hugging Face hub into the Hugging Face cache (HF_HOME).

The download-model init container runs it in the vLLM image (for its huggingface_hub) before the engine,
which then reads the model offline from the same cache. Once the snapshot is there it only asks the hub
what changed. Weights under `original/` (a second copy some repositories carry) are not downloaded.
"""

from __future__ import annotations

import sys

from stoker.inpod import program_parser


def main(argv: list[str] | None = None) -> int:
    described = program_parser("stoker.inpod.download", __doc__)
    described.add_argument("repo", metavar="REPO", help="the model's repository id, e.g. org/model")
    described.add_argument("revision", nargs="?", metavar="REVISION", help="a branch, tag or commit")
    options = described.parse_args(argv)
    from huggingface_hub import snapshot_download  # the vLLM image's

    path = snapshot_download(
        repo_id=options.repo, revision=options.revision, ignore_patterns=["original/**/*"]
    )
    print(f"stoker-download: {options.repo} is at {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
