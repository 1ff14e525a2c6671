"""pystub at another git revision, for `--pystub-rev`: its tracked files exported into a folder.

`git archive REV | tar -x` into a new folder under /tmp: the repository's own state (its
worktrees, branches, index) is left as it is, and the folder is removed after the run. The
exported tree runs on this checkout's interpreter and packages, as `--baseline` does.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

_GIT_TIMEOUT = 300.0


def export(repository: Path, revision: str) -> tuple[Path, str]:
    """(the folder holding `revision`'s tree, its commit id). Raises SystemExit naming what failed."""
    resolved = subprocess.run(["git", "-C", str(repository), "rev-parse", "--verify", "--quiet",
                               f"{revision}^{{commit}}"], capture_output=True, text=True, timeout=_GIT_TIMEOUT)
    commit = resolved.stdout.strip()
    if resolved.returncode != 0 or not commit:
        raise SystemExit(f"--pystub-rev {revision}: not a commit of {repository}")
    target = Path(tempfile.mkdtemp(prefix=f"pystub-rev-{commit[:10]}-", dir="/tmp"))
    tarball = target / "tree.tar"
    try:
        for command in (["git", "-C", str(repository), "archive", "--format=tar", "-o", str(tarball), commit],
                        ["tar", "-x", "-f", str(tarball), "-C", str(target)]):
            step = subprocess.run(command, capture_output=True, text=True, timeout=_GIT_TIMEOUT)
            if step.returncode != 0:
                raise SystemExit(f"--pystub-rev {revision}: {' '.join(command[:4])} failed: "
                                 f"{step.stderr.strip()[-300:]}")
        tarball.unlink()
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target, commit
