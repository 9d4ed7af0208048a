"""The image's build context (.dockerignore) holds every file docker/Dockerfile copies and
nothing the image must not see: without an engine here to build it, a COPY of a path the
context leaves out would only fail at someone's first build.
"""

from __future__ import annotations

import re

from tests.daemon_fixture import ROOT

DOCKERFILE = ROOT / "docker" / "Dockerfile"
IGNORE = ROOT / ".dockerignore"


def copied_sources() -> list[str]:
    sources = []
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\s*COPY\s+(?!--from)(.*)$", line)
        if m:
            sources += m.group(1).split()[:-1]  # the last word is the destination
    return sources


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    rules = [r.strip() for r in IGNORE.read_text(encoding="utf-8").splitlines()
             if r.strip() and not r.startswith("#")]
    assert rules[0] == "*", "an allowlist: everything is left out unless named"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    sources = copied_sources()
    assert sources, "no COPY found"
    for source in sources:
        assert source.rstrip("/") in allowed, f"COPY {source} is not in the build context"
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
    assert "docker" not in allowed  # docker/secrets/ (the demo's passwords) stays out
