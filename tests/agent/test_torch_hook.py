"""The hook's sitecustomize: it must not hide the one the user (or the distribution) has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rankscope.agent.torch_hook import ENV, SITECUSTOMIZE, write_atomic

PROBE = "import sys; print(sys.modules['sitecustomize'].__file__)"


def _run(tmp_path: Path, hook_env: str | None) -> subprocess.CompletedProcess:
    boot, user = tmp_path / "boot", tmp_path / "user"
    boot.mkdir()
    user.mkdir()
    write_atomic(boot / "sitecustomize.py", SITECUSTOMIZE)
    (user / "sitecustomize.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('user')\n")
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(boot), str(user)])
    if hook_env is not None:
        env[ENV] = hook_env
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)


def test_the_users_sitecustomize_still_runs(tmp_path: Path) -> None:
    done = _run(tmp_path, None)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").read_text() == "user"
    assert done.stdout.strip() == str(tmp_path / "user" / "sitecustomize.py")


def test_a_hook_that_cannot_install_says_so_and_the_users_still_runs(tmp_path: Path) -> None:
    done = _run(tmp_path, json.dumps({"spool": str(tmp_path / "spool")}))  # no rank fields: install fails
    assert done.returncode == 0, done.stderr
    assert "rankscope: torch hook not installed" in done.stderr
    assert (tmp_path / "ran").read_text() == "user"
