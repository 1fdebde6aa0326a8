"""The package's namespace holds its API: what ``import ferrylink`` makes public is
``__all__``, and everything in ``__all__`` is there."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import Peer


def public_names_after_import() -> tuple[list[str], list[str]]:
    """The public names of a freshly imported ``ferrylink`` (no test has imported a
    subpackage into it yet), and its ``__all__``."""
    code = (
        "import json, ferrylink; "
        "print(json.dumps([sorted(n for n in dir(ferrylink) if not n.startswith('_')), sorted(ferrylink.__all__)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=Peer.child_env(), timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    public, listed = json.loads(out.stdout)
    return public, listed


def test_import_makes_public_exactly_the_names_in_all():
    public, listed = public_names_after_import()
    assert public == listed, {"public, not in __all__": sorted(set(public) - set(listed)),
                              "in __all__, missing": sorted(set(listed) - set(public))}

