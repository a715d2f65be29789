"""The README's commands stay true: its API tour runs as written (on the shipped toy base instead of
an 8B checkpoint), and every shell command names files, configs and flags that exist. The commands
themselves run elsewhere: set-up in .ci/run, the toy job's `:tiny` form in test_main, the SLURM
script in test_launchers, serve + distill + the 8B config's `:tiny` form in test_real_format."""

import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOYBASE = os.path.join(REPO, "mocojax", "assets", "toybase")
README = open(os.path.join(REPO, "README.md")).read()


def _blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def _shell_commands():
    """Returns each README bash command as argv (continuation lines joined, comments dropped)."""
    commands = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip().rstrip("&").strip()
            for part in line.split("&&"):
                if part.strip():
                    commands.append(shlex.split(part))
    return commands


def test_api_tour_runs_as_written(tmp_path):
    (tour,) = [b for b in _blocks("python") if "hf.load_pretrained" in b]
    assert "/models/Qwen3-VL-8B-Instruct" in tour
    # The toy base for the 8B checkpoint, a temporary export folder, 8 new tokens instead of 256.
    code = (
        tour.replace("/models/Qwen3-VL-8B-Instruct", TOYBASE)
        .replace('"/tmp/export"', repr(str(tmp_path / "export")))
        .replace("max_new_tokens=256", "max_new_tokens=8")
    )
    assert code.count(TOYBASE) == 3 and "max_new_tokens=8" in code
    import jax
    import jax.numpy as jnp

    # What the tour takes as given: an image, a Generator and a Judge output, a group's rewards.
    scope = {
        "image": Image.fromarray(np.full((64, 64, 3), 200, np.uint8)),
        "generator_text": "1 | 3 | mentions a red circle | named\n2 | 1 | the background is black | black",
        "judge_text": "1 | 1 | it is named\n2 | 0 | it is white",
        "rewards": jnp.array([[0.2, 0.9, 0.5, 0.5]]),
    }
    exec(compile(code, "README.md API tour", "exec"), scope)
    assert scope["logits"].shape[:2] == scope["batch"]["input_ids"].shape
    assert scope["out"].tokens.shape[0] == 16
    assert [i.weight for i in scope["items"]] == [3.0, 1.0] and not scope["problems"]
    assert float(scope["reward"]) == pytest.approx(3 / 4)  # item 1 (weight 3) of 3 + 1
    assert scope["adv"].shape == (1, 4) and float(scope["adv"][0, 1]) > 0
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(scope["phi"]))
    assert os.path.isfile(tmp_path / "export" / "config.json")


def test_shell_commands_name_what_exists():
    commands = _shell_commands()
    assert len(commands) >= 8, commands
    for argv in commands:
        for arg in argv:
            # Repo paths (configs, launchers, requirement files) exist; a config arg may carry ":tiny".
            path = arg.split("=", 1)[-1].split(":")[0]
            if re.match(r"^(configs|launch|requirements)[\w./-]*$", path):
                assert os.path.exists(os.path.join(REPO, path)), (path, argv)
        if argv[:2] == ["python", "-m"] and argv[2].startswith("mocojax."):
            module = argv[2]
            help_text = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    module,
                    "--helpfull" if module == "mocojax.main" else "--help",
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            )
            # argparse's --help exits 0, absl's (mocojax.main) exits 1 after printing the flags.
            assert help_text.returncode in (0, 1) and "--" in help_text.stdout, (
                module,
                help_text.stderr[-2000:],
            )
            flags = [a.split("=")[0] for a in argv[3:] if a.startswith("--")]
            for flag in flags:
                name = flag.lstrip("-")
                if name.startswith("config."):
                    continue  # config overrides are checked by loading the config (test_main)
                assert re.search(rf"--(\[no\])?{re.escape(name)}\b", help_text.stdout), (
                    module,
                    flag,
                )
