"""The README's examples run as written in a fresh clone (a newcomer's first commands)."""
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def test_the_quickstart_runs_and_prints_latency_in_ms(capsys):
    exec(compile(blocks("python")[0], "README quickstart", "exec"), {})
    out = capsys.readouterr().out
    assert re.search(r"time to first token \d+ ms", out), out


def first_commands():
    """The first bash block after the Quickstart: the CLI commands a newcomer tries first."""
    block = README.split("## Quickstart", 1)[1]
    cmds = re.findall(r"```bash\n(.*?)```", block, re.S)[0]
    return [line.split("  #")[0].strip() for line in cmds.splitlines() if line.startswith("python -m minillm")]


@pytest.mark.parametrize("cmd", first_commands())
def test_the_first_cli_commands_run_as_written(cmd, tmp_path):
    argv = shlex.split(cmd)[1:]
    if "--busy" in argv:
        argv = [a for a in argv if a != "--quick"] + ["--steps", "8", "--repeats", "1"]   # same path, shorter
    env = dict(os.environ, MINILLM_PROGRESS="0", PYTHONPATH=os.path.abspath(ROOT))
    r = subprocess.run([sys.executable] + argv, cwd=ROOT if "--json" not in argv else tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{cmd}\n{r.stderr[-2000:]}"
    assert r.stdout.strip()
