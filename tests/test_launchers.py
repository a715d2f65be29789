"""The launchers in launch/ run for real.

- launch/slurm_gpu.sbatch, unchanged, on a one-node SLURM brought up here (munged, slurmctld,
  slurmd from Debian's `munge` and `slurm-wlm`; config, keys, state and logs in a temp dir):
  2 CPU tasks run SFT -> RL on configs/toyworld.py:tiny, then eval and export follow as one
  process, and one plain process resumes the 2-process SFT checkpoint. Skipped where slurmctld
  is not installed (.ci/run installs it).
- launch/local_multiprocess.sh with a `python -m mocojax.main` command: SFT on 2 processes,
  then export as one.
- launch/tpu_vm_pod.sh as a dry run: a fake `gcloud` on PATH records its arguments.
"""

import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
import pytest

from mocojax import checkpoint, config_utils, hf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config", "configs/toyworld.py:tiny"]


def _env(**extra):
    """Returns this process's environment for a launcher: CPU, this python first on PATH."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
        **extra,
    }
    env.pop("XLA_FLAGS", None)
    return env


def _stage_lines(out):
    return [line for line in out.splitlines() if line.startswith("== mocojax: stages")]


def _assert_exported(workdir, stage, step):
    """Asserts that <workdir>/hf holds the weights of the stage's checkpoint `step`, restored here in one process."""
    sys.path.insert(0, os.path.join(ROOT, "configs"))
    import toyworld

    cfg = config_utils.build_setup(toyworld.get_config("tiny"), str(workdir)).model_config
    params, restored = checkpoint.restore_params(str(workdir), stage, cfg)
    assert restored == step
    _, exported = hf.load_pretrained(workdir / "hf")
    for want, got in zip(jax.tree.leaves(params), jax.tree.leaves(exported), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# --------------------------------------------------------------------------------------- SLURM
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs):
    """Stops the daemons and everything they started (their sessions): SIGTERM, then SIGKILL."""
    sessions = {p.pid for p in procs}

    def members():
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if os.getsid(int(name)) in sessions:
                        found.append(int(name))
                except ProcessLookupError:
                    pass
        return found

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in members():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        while members() and time.time() < deadline:
            for p in procs:
                p.poll()
            time.sleep(0.2)
        if not members():
            return


SLURM_CONF = """\
ClusterName=mocojaxtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm():
    """Brings up munged, slurmctld and slurmd (one node, 2 CPUs) as this user (root or not) in a temp
    dir; returns the environment whose SLURM_CONF names it. Stops every daemon and what it started
    (by PID) and removes the dir after."""
    missing = [
        tool for tool in ("slurmctld", "slurmd", "sbatch", "munged") if shutil.which(tool) is None
    ]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed (Debian: apt-get install slurm-wlm munge; .ci/run does it)"
        )
    # Short path: the munge socket's path must fit a unix socket address.
    root = tempfile.mkdtemp(prefix="mocojax-slurm-")
    os.makedirs(os.path.join(root, "state"))
    os.makedirs(os.path.join(root, "spool"))
    key = os.path.join(root, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, stat.S_IRUSR)
    host = socket.gethostname().split(".")[0]
    conf = os.path.join(root, "slurm.conf")
    with open(conf, "w") as f:
        f.write(
            SLURM_CONF.format(
                host=host,
                dir=root,
                user=pwd.getpwuid(os.getuid()).pw_name,
                ctld_port=_free_port(),
                d_port=_free_port(),
            )
        )
    env = _env(SLURM_CONF=conf)
    procs = []
    try:
        # --force: munged refuses to run as root without it. Each daemon in the foreground, in a
        # session of its own; stderr to <name>.err.
        for command in (
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={root}/munge.socket",
                f"--pid-file={root}/munged.pid",
                f"--log-file={root}/munged.log",
                f"--seed-file={root}/munged.seed",
            ],
            ["slurmctld", "-D", "-f", conf],
            ["slurmd", "-D", "-f", conf, "-N", host],
        ):
            with open(os.path.join(root, f"{command[0]}.err"), "w") as err:
                procs.append(
                    subprocess.Popen(
                        command,
                        env=env,
                        start_new_session=True,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                    )
                )
            if command[0] == "munged":
                deadline = time.time() + 20
                while not os.path.exists(f"{root}/munge.socket") and time.time() < deadline:
                    time.sleep(0.1)
        deadline, state = time.time() + 60, ""
        while time.time() < deadline and state != "idle":
            assert all(p.poll() is None for p in procs), _logs(root)
            state = subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True
            ).stdout.strip()
            time.sleep(0.5)
        assert state == "idle", f"node state {state!r}\n" + _logs(root)
        yield env
    finally:
        if len(procs) == 3:
            subprocess.run(["scancel", "--full", "--partition=test"], env=env, capture_output=True)
        _stop(procs)
        shutil.rmtree(root, ignore_errors=True)


def _logs(root):
    text = ""
    for name in sorted(os.listdir(root)):
        if name.endswith((".log", ".err")):
            with open(os.path.join(root, name)) as f:
                text += f"--- {name}\n" + f.read()[-3000:]
    return text


def _job_field(env, job, field):
    info = subprocess.run(
        ["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True
    ).stdout
    return next((kv.split("=", 1)[1] for kv in info.split() if kv.startswith(field + "=")), None)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """One persistent compilation cache for this file's runs: the local launcher's 2-process SFT
    reuses the SLURM job's programs."""
    return {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax_cache")),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


@pytest.fixture(scope="module")
def slurm_job(slurm, compile_cache, tmp_path_factory):
    """Submits launch/slurm_gpu.sbatch as it is, with CPU overrides: 2 tasks on the one node run SFT -> RL
    (2 steps each) on the tiny config, then export follows as one process (the 8B config's stages).
    Returns (job id, its output, workdir)."""
    tmp = tmp_path_factory.mktemp("slurm_job")
    workdir, log = tmp / "run", tmp / "slurm-%j.out"
    submit = [
        "sbatch",
        "--parsable",
        "--wait",
        "--nodes=1",
        "--ntasks-per-node=2",
        "--gpus-per-node=0",
        "--cpus-per-task=1",
        f"--output={log}",
        "launch/slurm_gpu.sbatch",
        *TINY,
        "--workdir",
        str(workdir),
        "--config.stages=('sft','rl','export')",
        "--config.sft.num_steps=2",
        "--config.rl.num_steps=2",
    ]
    env = dict(
        slurm, **compile_cache, MOCOJAX_SETUP=f"export PATH={os.path.dirname(sys.executable)}:$PATH"
    )
    result = subprocess.run(submit, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    job = result.stdout.strip().split(";")[0]
    out = open(str(log).replace("%j", job)).read() if job.isdigit() else ""
    assert result.returncode == 0, result.stderr + out[-8000:]
    return job, out, workdir


def test_slurm_sbatch_two_tasks_sft_rl_then_export(slurm, slurm_job):
    job, out, workdir = slurm_job
    assert (_job_field(slurm, job, "JobState"), _job_field(slurm, job, "ExitCode")) == (
        "COMPLETED",
        "0:0",
    ), out[-8000:]
    # jax.distributed found both SLURM tasks by itself; process 0 alone printed the summaries.
    for rank in (0, 1):
        assert f"[Gloo] Rank {rank} is connected to 1 peer ranks" in out, out[-8000:]
    assert out.count("== sft summary") == 1 and out.count("== rl summary") == 1, out[-8000:]
    assert _stage_lines(out) == [
        "== mocojax: stages ('sft', 'rl'), multi-process",
        "== mocojax: stages ('export',), single-process",
    ]
    for stage in ("sft", "rl"):
        assert sorted(os.listdir(checkpoint.stage_dir(workdir, stage))) == ["2"]
    # The single-process export holds the 2-process RL checkpoint's weights (read here by one process too).
    _assert_exported(workdir, "rl", 2)


def test_slurm_checkpoint_resumes_in_one_process(slurm_job):
    """One plain process resumes the 2-process SFT checkpoint (params, Adam state, rng, data position)."""
    _, _, workdir = slurm_job
    resume = subprocess.run(
        [
            sys.executable,
            "-m",
            "mocojax.main",
            *TINY,
            "--workdir",
            str(workdir),
            "--config.stages=('sft',)",
            "--config.sft.num_steps=3",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resume.returncode == 0, resume.stdout[-4000:] + resume.stderr[-4000:]
    assert sorted(os.listdir(checkpoint.stage_dir(workdir, "sft"))) == ["2", "3"]
    rows = [
        row
        for row in map(json.loads, open(workdir / "metrics.jsonl"))
        if row["stage"] == "sft" and "loss" in row
    ]
    assert [row["step"] for row in rows] == [1, 2, 3]


# ------------------------------------------------------------------------------------- local
def test_stage_groups_keep_the_config_order():
    sys.path.insert(0, os.path.join(ROOT, "launch"))
    import stage_groups

    assert stage_groups.groups(("vision", "sft", "rl", "eval", "export")) == [
        ("single", ("vision",)),
        ("multi", ("sft", "rl")),
        ("single", ("eval", "export")),
    ]
    assert stage_groups.groups(("export",)) == [("single", ("export",))]
    assert stage_groups.without_stages(
        [
            "--config",
            "c.py",
            "--config.stages=('sft',)",
            "--config.stages",
            "('rl',)",
            "-config.stages=x",
            "--config.seed=1",
        ]
    ) == ["--config", "c.py", "--config.seed=1"]


def test_local_multiprocess_any_command_on_n_processes():
    script = 'echo "$MOCOJAX_PROCESS_ID/$MOCOJAX_NUM_PROCESSES $JAX_PLATFORMS"; exit "$MOCOJAX_PROCESS_ID"'
    result = subprocess.run(
        ["launch/local_multiprocess.sh", "3", "--", "bash", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sorted(result.stdout.splitlines()) == ["[0] 0/3 cpu", "[1] 1/3 cpu", "[2] 2/3 cpu"]
    assert result.returncode == 1  # processes 1 and 2 failed


def test_local_multiprocess_sft_on_two_processes_then_export_on_one(tmp_path, compile_cache):
    workdir = tmp_path / "run"
    command = [
        "launch/local_multiprocess.sh",
        "2",
        "--",
        "python",
        "-m",
        "mocojax.main",
        *TINY,
        "--workdir",
        str(workdir),
        "--config.stages=('sft','export')",
        "--config.export.stage=sft",
        "--config.sft.num_steps=2",
    ]
    result = subprocess.run(
        command, cwd=ROOT, env=_env(**compile_cache), capture_output=True, text=True, timeout=900
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-8000:]
    for rank in (0, 1):
        assert f"[{rank}] [Gloo] Rank {rank} is connected to 1 peer ranks" in out, out[-8000:]
    assert _stage_lines(out) == [
        "== mocojax: stages ('sft',), multi-process",
        "== mocojax: stages ('export',), single-process",
    ]
    assert sorted(os.listdir(checkpoint.stage_dir(workdir, "sft"))) == ["2"]
    _assert_exported(workdir, "sft", 2)


# --------------------------------------------------------------------------------------- TPU
FAKE_GCLOUD = """#!/usr/bin/env python3
# Records its arguments, one JSON list a line; runs worker 0's stage planning here (the fake
# worker's home is $HOME); succeeds without doing anything for every other call.
import json, os, subprocess, sys
with open(os.environ["FAKE_GCLOUD_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
command = sys.argv[sys.argv.index("--command") + 1] if "--command" in sys.argv else ""
if "--worker=0" in sys.argv and "launch/stage_groups.py" in command:
    sys.exit(subprocess.run(["bash", "-c", command]).returncode)
"""


@pytest.mark.parametrize("setup", [False, True])
def test_tpu_vm_pod_dry_run_commands(tmp_path, setup):
    """launch/tpu_vm_pod.sh against a fake gcloud: the exact copy, set-up and per-worker commands."""
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(FAKE_GCLOUD)
    (bin_dir / "gcloud").chmod(0o755)
    # Worker 0's copy of the repository, with a .venv/bin/python that is this python.
    src = home / "mocojax-src"
    (src / ".venv" / "bin").mkdir(parents=True)
    for name in ("mocojax", "configs", "launch"):
        (src / name).symlink_to(os.path.join(ROOT, name))
    (src / ".venv" / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (src / ".venv" / "bin" / "python").chmod(0o755)
    log = tmp_path / "gcloud.jsonl"
    env = _env(HOME=str(home), FAKE_GCLOUD_LOG=str(log), **({"SETUP": "1"} if setup else {}))
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    args = [
        *TINY,
        "--workdir",
        "gs://bucket/runs/tiny",
        "--config.data.train_path=/data/my train.jsonl",
        "--config.stages=('sft','rl','eval','export')",
    ]
    result = subprocess.run(
        ["launch/tpu_vm_pod.sh", "my-tpu", "us-central2-b", "--", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]

    def ssh(worker, command):
        return [
            "compute",
            "tpus",
            "tpu-vm",
            "ssh",
            "my-tpu",
            "--zone",
            "us-central2-b",
            f"--worker={worker}",
            "--command",
            "cd ~/mocojax-src && " + command,
        ]

    quoted = (
        "--config configs/toyworld.py:tiny --workdir gs://bucket/runs/tiny "
        "--config.data.train_path=/data/my\\ train.jsonl "
        "--config.stages=\\(\\'sft\\'\\,\\'rl\\'\\,\\'eval\\'\\,\\'export\\'\\) "
    )
    want = [
        [
            "compute",
            "tpus",
            "tpu-vm",
            "scp",
            "--zone",
            "us-central2-b",
            "--worker=all",
            "--recurse",
            *(
                os.path.join(ROOT, name)
                for name in ("mocojax", "configs", "launch", "requirements.txt")
            ),
            "my-tpu:~/mocojax-src/",
        ]
    ]
    if setup:
        want.append(
            ssh(
                "all",
                "python3 -m venv .venv && .venv/bin/pip install -q -U pip     "
                "&& .venv/bin/pip install -q -r requirements.txt 'jax[tpu]'",
            )
        )
    else:
        want.append(ssh("all", "test -d .venv"))
    # The user's arguments less their --config.stages, then each group's stages.
    kept = args[:-1]
    want += [
        ssh(0, ".venv/bin/python launch/stage_groups.py " + quoted),
        ssh(
            "all",
            ".venv/bin/python -m mocojax.main "
            + shlex.join(
                [*kept, "--config.stages=('sft', 'rl')", "--config.distributed.enabled=True"]
            ),
        ),
        ssh(
            0,
            ".venv/bin/python -m mocojax.main "
            + shlex.join(
                [*kept, "--config.stages=('eval', 'export')", "--config.distributed.enabled=False"]
            ),
        ),
    ]
    assert calls == want
    # What each worker's shell runs, word for word.
    assert shlex.split(calls[-2][-1]) == [
        "cd",
        "~/mocojax-src",
        "&&",
        ".venv/bin/python",
        "-m",
        "mocojax.main",
        *kept,
        "--config.stages=('sft', 'rl')",
        "--config.distributed.enabled=True",
    ]
