"""Engine profiles: the one home of everything that depends on the vLLM version.

Pure code (standard library only): the API models, the renderer, the phase parser and the standby client
read profiles; nothing else compares version strings.
"""

import functools
import re

from stoker.engines.markers import Marker
from stoker.engines.profiles import (
    SUPPORTED,
    TOLERANT,
    Capabilities,
    CaptureSizeDefaults,
    EngineFlags,
    EngineProfile,
    LoaderConfigSchema,
)

# The newest release the GPU host can run as it is (torch 2.11): the default image's version.
DEFAULT_ENGINE_VERSION = "0.26.0"

VERSION_PATTERN = r"^\d+\.\d+\.\d+$"
_RELEASE = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")
# An image tag naming a release: `0.26.0`, `v0.26.0`, `0.26.0-cu130`, `v0.26.0.post1`.
_TAG_VERSION = re.compile(r"v?(\d+\.\d+\.\d+)(?:[-+._][\w.+-]*)?")
# What vLLM prints about its own version, from the first lines of every start:
# the banner (entrypoints/utils.py:322 on 0.22.1, serve/utils/api_utils.py:323 on 0.23-0.32,
# common/startup.py:16 on 0.33: "version %s" beside the logo, "vLLM server version %s, serving model %s"
# without it), the engine core (v1/engine/core.py:113 "Initializing a V1 LLM engine (v%s)"), a headless
# start (entrypoints/cli/serve.py:213) and the plain API server (entrypoints/api_server.py:129).
_ANSI = r"(?:(?:\x1b|\\u001b)\[[\d;]*m)*"
_LOGGED_VERSION = re.compile(
    r"(?:vLLM (?:API )?server version |▀▄▀ █" + _ANSI + r"\s+version " + _ANSI + r"|"
    r"Initializing a V1 LLM engine \(v|Launching vLLM \(v)(\d+\.\d+\.\d+)"
)


class UnsupportedEngineVersion(ValueError):
    """A version no profile covers (or no version at all): stoker renders nothing rather than guess."""


def supported_ranges() -> str:
    return ", ".join(profile.name for profile in SUPPORTED)


def profile_for(version: str) -> EngineProfile:
    found = _RELEASE.match(version.strip())
    if found is None:
        raise UnsupportedEngineVersion(f"{version!r} is not a vLLM version (expected X.Y.Z)")
    release = (int(found.group(1)), int(found.group(2)))
    for profile in SUPPORTED:
        if profile.covers(release):
            return profile
    raise UnsupportedEngineVersion(
        f"vLLM {version} is not supported; supported releases: {supported_ranges()}"
    )


def split_image(image: str) -> tuple[str, str | None]:
    """An image reference's repository and tag (None if untagged); a digest is dropped, a registry's port
    is part of the repository."""
    name = image.split("@", 1)[0]
    if ":" not in name.rsplit("/", 1)[-1]:
        return name, None
    repository, tag = name.rsplit(":", 1)
    return repository, tag


def version_from_image(image: str) -> str | None:
    """The release an image's tag names (`repo:0.26.0`, `repo:v0.26.0-cu130`), or None."""
    tag = split_image(image)[1]
    found = _TAG_VERSION.fullmatch(tag) if tag is not None else None
    return found.group(1) if found is not None else None


@functools.lru_cache(maxsize=1024)  # asked many times per rendering; a refusal raises again each time
def resolve_engine_version(engine_version: str | None, image: str) -> str:
    """The version a spec runs: engineVersion, else the image tag's; raises UnsupportedEngineVersion."""
    version = engine_version or version_from_image(image)
    if version is None:
        raise UnsupportedEngineVersion(
            f"spec.runtime.image {image!r} names no vLLM version in its tag: set spec.runtime.engineVersion"
            f" (supported releases: {supported_ranges()})"
        )
    try:
        profile_for(version)
    except UnsupportedEngineVersion as error:
        field = "spec.runtime.engineVersion" if engine_version else f"spec.runtime.image {image!r}"
        raise UnsupportedEngineVersion(f"{field}: {error}") from None
    return version


def detect_version_in_log(line: str) -> str | None:
    """The vLLM version a log line announces (banner, engine start), or None."""
    found = _LOGGED_VERSION.search(line)
    return found.group(1) if found is not None else None


__all__ = [
    "DEFAULT_ENGINE_VERSION",
    "SUPPORTED",
    "TOLERANT",
    "VERSION_PATTERN",
    "Capabilities",
    "CaptureSizeDefaults",
    "EngineFlags",
    "EngineProfile",
    "LoaderConfigSchema",
    "Marker",
    "UnsupportedEngineVersion",
    "detect_version_in_log",
    "profile_for",
    "resolve_engine_version",
    "split_image",
    "supported_ranges",
    "version_from_image",
]
