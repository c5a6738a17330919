"""A grid of training runs (script x envs x feedback x seeds), run on this machine or as a Slurm job array, then a
figure in the layout of C17's Figure 1 and a table of final returns.

A grid is a JSON file (benchmark/grids/*.json):

    {"script": "rlhf_ppo_mujoco.py",            # one of the repository's scripts
     "feedback": ["true", 350, 700, 1400],      # "true": --feedback true-reward; N: N synthetic labels (--labels N)
     "seeds": [1, 2, 3],
     "steps": 1000000,                          # --total-timesteps
     "flags": "",                               # more flags for every run
     "env_flag": "--env",                       # how the script takes the env (the moving dot: "--observation")
     "note": "",                                # written above the report's table: what the grid's runs are
     "envs": {"Hopper-v4": {"seeds": [1, 2, 3, 4, 5]},            # each may override seeds, steps, flags
              "Reacher-v5": {"steps": 300000, "flags": "--segment-len 15"},
              "Walker2d-v4": {"seeds_by_feedback": {"true": [1, 2, 3, 4], "350": [1, 2, 3, 4]}}}}
                                                # seeds_by_feedback (here or at the top): some feedback settings' own
                                                # seeds, keyed by the feedback as a string; the others keep "seeds" (an
                                                # env with its own seeds needs its own seeds_by_feedback if the top has one)

Every run gets its own folder, {out}/{env}__{true|labelsN}__{seed}/, where the script is started with `--threads 1
--save-model` (its runs/ folder, with TensorBoard events and checkpoints, is not for committing); its output is appended
to run.log there, and done.json is written when it has run to the end (until then a .gitignore in the folder keeps `git
add`, and `git status`, off its new files; a run whose folder holds files git tracks, a partial run.log committed by
hand, is refused until they are untracked). A run that was stopped (Ctrl-C, SIGTERM, a Slurm time limit: the scripts
save a checkpoint at the end of the iteration) is resumed from its checkpoint with the script's --resume; one that left
no checkpoint starts again. So the same command can be repeated until the grid is complete; finished runs are skipped,
and a run under way is left alone (its task and its script hold a lock on run.lock in its folder, the script also after
its task was killed; where the file system has working locks). A checkpoint resumes with the settings it was started
with, so a stopped run whose arguments the grid has changed since (steps, flags) is refused with a message, not finished
at the old ones. A finished run that ran with other settings than the grid gives it now (a grid edited after it
finished, another grid's runs in the same --out, or a default its script changed since: every setting is logged as a
run starts) stops `local`, `slurm` and `report` with a message naming it and
what differs, rather than count as done and be reported as the grid's; a true-reward run is compared without the flags
it never reads (TRUE_REWARD_RUNS_IGNORE: the MuJoCo and moving-dot scripts'; an Atari run on every flag). A grid with a
key not shown above, a key twice in one object, a seed or feedback listed twice, or flags that set what the grid sets
for each run (the env flag, --seed, --total-timesteps, --feedback, --labels: the script would take the last value;
--no-save-model) is refused. Before any run starts, `local` and `slurm` read each run's command line with its script's
own checks (tyro, validate_args): a misspelt env id or flag stops the sweep with one message.

    python benchmark/sweep.py local GRID [--workers N]          # N at once (default: one per core), then the report
                                                                # (stopped by Ctrl-C or SIGTERM: exit 130 or 143)
    python benchmark/sweep.py local GRID --envs Reacher-v5      # a batch: only these envs' runs (also for slurm)
    python benchmark/sweep.py local GRID --feedback true 700    # a batch: only these feedbacks' runs (also for slurm)
    python benchmark/sweep.py local GRID --seeds 1 2 3 4        # a batch: only these seeds' runs (the filters combine)
    python benchmark/sweep.py slurm GRID [--cpus-per-task 1 --mem 4G --time 12:00:00 --partition P]
    python benchmark/sweep.py report GRID                       # {out}/figure.png and {out}/table.md from the logs
    python benchmark/sweep.py status GRID                       # which runs are done, running, stopped, new

`local` and `slurm` start each run as `sweep.py task {out}/grid_{hash}.json --index I`, which reads a copy of the grid
taken when the sweep started (named by its content), so an edit of the grid file while a sweep runs, or a later
submission of an edited grid, leaves the runs of the sweep under way and of queued tasks alone.
`slurm` submits the runs that are not done as one job array (`sbatch --array`, one task per run). Shortly before the
time limit (--signal-seconds, 120) Slurm signals the task, which stops its run (it saves a checkpoint) and requeues
itself (`scontrol requeue`; where Slurm refuses, the task says so and fails), so a run longer than the limit goes on
where it stopped; submitting the same command again also resumes what is left. Run `report` once the array is done.
`--out` (default benchmark/sweeps/{grid name}) sets where the runs go.
"""

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import fmt, plt, progress_in, seeds_std  # noqa: E402 (plot.py sets matplotlib's file-only backend)

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
C17_CLAIM = {1400: 1.0, 700: 0.95, 350: 0.9}  # C17 3.1: labels -> the share of the true-reward return it nearly matches


# --- the grid ---------------------------------------------------------------------------------------------------------
# the flags a --feedback true-reward run never reads (tests/test_sweep.py runs one with all of them changed: the same
# run): a finished true-reward run is the grid's whatever they say, so grids that differ only in the preference
# learning share their true-reward runs (copied from one sweep to the other); a script not named here: every flag
# counts. The clips' flags (--instruction, --clip-fps, ...) are not here: a run without --feedback human refuses them
TRUE_REWARD_RUNS_IGNORE = {
    "rlhf_ppo_mujoco.py": (
        "labels", "segment_len", "pretrain_fraction", "pretrain_steps", "pretrain_epochs", "schedule_horizon",
        "selection", "candidate_multiplier", "pair_pool_rollouts", "ensemble_size", "reward_lr", "reward_dropout",
        "reward_input_norm", "reward_potential", "reward_batch_size", "reward_updates", "reward_eval_every",
        "reward_std", "anchor_absorbing", "label_noise", "teacher_beta", "teacher_gamma", "teacher_epsilon",
        "teacher_skip_threshold", "teacher_equal_margin",
    ),
    "rlhf_moving_dot.py": (
        "labels", "segment_len", "pretrain_fraction", "pretrain_steps", "pretrain_epochs", "schedule_horizon",
        "selection", "candidate_multiplier", "ensemble_size", "reward_form", "reward_lr", "reward_batch_size",
        "reward_updates", "reward_eval_every", "reward_std", "label_noise", "teacher_beta", "teacher_gamma",
        "teacher_epsilon", "teacher_skip_threshold", "teacher_equal_margin",
    ),
}  # fmt: skip
GRID_KEYS = ("script", "envs", "feedback", "seeds", "seeds_by_feedback", "steps", "flags", "env_flag", "note")
ENV_KEYS = ("seeds", "seeds_by_feedback", "steps", "flags")


def load_grid(path):
    """The grid file as a dict, with its list of runs under "runs"; a clear error for a malformed one."""

    def refuse_repeated_keys(pairs):  # json.loads would keep the last of two entries and drop the first unseen
        keys = [key for key, _ in pairs]
        for key in keys:
            if keys.count(key) > 1:
                raise SystemExit(f"error: the grid {path} names {key!r} twice in one object")
        return dict(pairs)

    try:
        text = Path(path).read_text()
        grid = json.loads(text, object_pairs_hook=refuse_repeated_keys)
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"error: cannot read the grid {path}: {error}") from None
    if not isinstance(grid, dict):
        raise SystemExit(f"error: the grid {path} must be a JSON object (see benchmark/sweep.py's docstring)")
    unknown = sorted(set(grid) - set(GRID_KEYS))
    if unknown:  # a misspelt key would leave its setting at the default, unseen
        raise SystemExit(f"error: the grid {path} has an unknown key {unknown[0]!r} (known: {', '.join(GRID_KEYS)})")
    grid["text"] = text  # what frozen_grid copies: the file as these runs were read from it
    for key in ("script", "envs", "feedback"):
        if key not in grid:
            raise SystemExit(f"error: the grid {path} has no '{key}' (see benchmark/sweep.py's docstring)")
    envs, feedbacks = grid["envs"], grid["feedback"]
    if not (isinstance(envs, dict) and all(isinstance(v, dict) or v is None for v in envs.values())):
        raise SystemExit(f"error: the grid {path}'s 'envs' must map each env id to its settings (an object), not {envs!r}")
    for env, overrides in envs.items():
        unknown = sorted(set(overrides or {}) - set(ENV_KEYS))
        if unknown:
            known = ", ".join(ENV_KEYS)
            raise SystemExit(f"error: the grid {path}'s {env} has an unknown key {unknown[0]!r} (known: {known})")
    if not isinstance(feedbacks, list):
        raise SystemExit(f"error: the grid {path}'s 'feedback' must be a list, e.g. [\"true\", 700], not {feedbacks!r}")
    steps = [setting["steps"] for setting in [grid, *[v or {} for v in envs.values()]] if "steps" in setting]
    for value in steps:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SystemExit(f"error: the grid {path}'s 'steps' must be a positive whole number, not {value!r}")
    if not isinstance(grid["script"], str):  # (a traceback of a path joined with a number, before)
        raise SystemExit(
            f"error: the grid {path}'s 'script' must be the path of a script in the repository, e.g. \"rlhf_ppo_mujoco.py\", "
            f"not {grid['script']!r}"
        )
    if not (ROOT / grid["script"]).is_file():
        raise SystemExit(f"error: the grid {path} names a script that is not in {ROOT}: {grid['script']}")
    if not isinstance(grid.get("note", ""), str):
        raise SystemExit(f"error: the grid {path}'s note must be a string (written above the report's table)")
    for feedback in grid["feedback"]:
        if feedback != "true" and not (isinstance(feedback, int) and not isinstance(feedback, bool) and feedback > 0):
            raise SystemExit(f'error: feedback must be "true" or a positive number of labels, not {feedback!r}')
    for feedback in grid["feedback"]:
        if grid["feedback"].count(feedback) > 1:  # two runs in one folder
            raise SystemExit(f"error: the grid {path} lists feedback {feedback} twice")
    env_flag = grid.get("env_flag", "--env")
    if not (isinstance(env_flag, str) and env_flag.startswith("--")):
        raise SystemExit(f'error: the grid {path}\'s env_flag must be a flag of its script, e.g. "--env", not {env_flag!r}')
    # flags the grid sets for each run (the script takes the last value given), and the checkpoints resume needs
    managed = {env_flag.replace("_", "-"), "--seed", "--total-timesteps", "--feedback", "--labels", "--no-save-model"}
    grid["runs"] = []
    flags = {"": grid.get("flags", "")} | {env: (overrides or {}).get("flags", "") for env, overrides in envs.items()}
    for env, value in flags.items():
        which = f"{env} flags" if env else "flags"
        if not isinstance(value, str):
            raise SystemExit(f"error: the grid {path}'s {which} must be a string of command-line flags, not {value!r}")
        try:
            words = shlex.split(value)
        except ValueError as error:
            raise SystemExit(f"error: the grid {path}'s {which} cannot be split into arguments ({error})") from None
        for word in words:  # the script takes the last of two values: the grid's seed, steps or labels would be lost
            name = word.split("=")[0].replace("_", "-")
            if name in managed:
                raise SystemExit(f"error: the grid {path}'s {which} set {name}, which the grid sets for each run")
    for env, overrides in grid["envs"].items():
        setting = {**grid, **(overrides or {})}
        if "seeds" in (overrides or {}) and "seeds_by_feedback" not in overrides and grid.get("seeds_by_feedback"):
            feedbacks = ", ".join(grid["seeds_by_feedback"]) if isinstance(grid["seeds_by_feedback"], dict) else "some"
            raise SystemExit(  # which of the two did the grid mean for those runs? (the grid's own, unseen, before)
                f"error: the grid {path}'s {env} sets its own seeds and the grid's seeds_by_feedback those of {feedbacks}: "
                f"give {env} its own seeds_by_feedback too (it takes the place of the grid's)"
            )
        seeds, seeds_by_feedback = setting.get("seeds", [1, 2, 3]), setting.get("seeds_by_feedback", {})
        if not isinstance(seeds_by_feedback, dict):
            raise SystemExit(
                f'error: the grid {path}\'s seeds_by_feedback must map feedback ("true", "350", ...) to lists of seeds, '
                f"not {seeds_by_feedback!r}"
            )
        for listed in [seeds, *seeds_by_feedback.values()]:
            if not (isinstance(listed, list) and all(isinstance(seed, int) for seed in listed)):
                raise SystemExit(f"error: the grid {path}'s seeds must be a list of whole numbers, not {listed!r}")
            for seed in listed:
                if listed.count(seed) > 1:  # one run counted as two seeds
                    raise SystemExit(f"error: the grid {path} lists seed {seed} twice ({env}: {listed})")
        unknown = sorted(set(seeds_by_feedback) - {str(feedback) for feedback in grid["feedback"]})
        if unknown:
            raise SystemExit(
                f"error: the grid {path}'s {env} seeds_by_feedback names feedback that is not in the grid: "
                + ", ".join(unknown)
            )
        for feedback in grid["feedback"]:
            mode = "true" if feedback == "true" else f"labels{feedback}"
            feedback_flags = ["--feedback", "true-reward"] if feedback == "true" else ["--labels", str(feedback)]
            for seed in seeds_by_feedback.get(str(feedback), seeds):
                args = [grid.get("env_flag", "--env"), env, "--seed", str(seed)]
                if "steps" in setting:
                    args += ["--total-timesteps", str(setting["steps"])]
                args += ["--threads", "1", "--save-model", "--exp-name", "sweep", *feedback_flags]
                args += shlex.split(grid.get("flags", "")) + shlex.split((overrides or {}).get("flags", ""))
                run = {"name": f"{env}__{mode}__{seed}", "env": env, "mode": mode, "seed": seed, "args": args}
                grid["runs"].append(run)
    return grid


def imported_script(grid):
    """The grid's script as a module (tyro reads the Args docstrings' source), the environment the runs inherit left as
    it was (the MuJoCo script sets MUJOCO_GL at import)."""
    import importlib.util

    name = f"checked_{Path(grid['script']).stem}"
    if name in sys.modules:  # imported once per process
        return sys.modules[name]
    environment = dict(os.environ)
    spec = importlib.util.spec_from_file_location(name, ROOT / grid["script"])
    script = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(script)
    finally:
        os.environ.clear()
        os.environ.update(environment)
    return script


def check_runs(grid, indices, sweep_dir):
    """Each run's command line read and checked by its script's own code (tyro, fill_runtime_fields, validate_args)
    before any run starts: a misspelt env id or flag, or a value the script refuses, is one message here rather than a
    failed run and a folder for each run of the grid (on Slurm, after a wait in the queue). Each is checked from its
    run folder, where it runs (a relative path in the flags is the run folder's; a folder made for the check is
    removed), and the environment the runs inherit is left as it was. What the script prints (a warning) is shown
    once, not once per run."""
    import tyro

    if not indices:
        return
    environment, printed = dict(os.environ), set()
    script = imported_script(grid)
    try:
        for i in indices:
            run, folder = grid["runs"][i], sweep_dir / grid["runs"][i]["name"]
            made = [path for path in (folder, *folder.parents) if not path.exists()]  # the deepest first
            folder.mkdir(parents=True, exist_ok=True)
            output = io.StringIO()
            try:
                with contextlib.chdir(folder), contextlib.redirect_stdout(output):
                    args = tyro.cli(script.Args, args=run["args"], prog=grid["script"])
                    script.fill_runtime_fields(args)
                    script.validate_args(args)
            except SystemExit as stop:
                why = stop.code.removeprefix("error: ") if isinstance(stop.code, str) else "its script's message is above"
                raise SystemExit(f"error: run {run['name']} of the grid {grid['path']} cannot start: {why}") from None
            finally:
                for path in made:
                    with contextlib.suppress(OSError):  # another sweep over the same folder may have filled it since
                        path.rmdir()
                for line in output.getvalue().splitlines():
                    if line not in printed:
                        printed.add(line)
                        print(line)
    finally:
        os.environ.clear()
        os.environ.update(environment)


def script_settings(grid, args):
    """Every setting of the grid's script (its Args) for these arguments, as the script reads them today (tyro: 2e5 and
    200000 are the same, a flag not given is at today's default), as JSON values; None if the script does not take
    them (its message in `output`)."""
    import tyro

    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):  # tyro's warnings and errors
            settings = vars(tyro.cli(imported_script(grid).Args, args=args, prog=grid["script"]))
    except SystemExit:
        return None, output.getvalue()
    return json.loads(json.dumps(settings, default=str)), output.getvalue()


def settings_changed(grid, run, started, started_settings=None):
    """How the arguments a run was started with (`started`, from its log) differ from those the grid gives it now: a
    list of "--flag then (the grid: now)" ([] where the run is the grid's). They are compared as the script reads them
    (tyro: 2e5 and 200000, or a flag at its default, are the same), a true-reward run's without the flags it never
    reads (TRUE_REWARD_RUNS_IGNORE). With `started_settings` (the settings the sweep logged as the run started, see
    execute), a default the script changed since shows too; a log from before that line compares the two command
    lines read with today's defaults. Where the grid's own arguments are not the script's (a misspelt flag), that is
    the error."""
    if started == run["args"] and started_settings is None:
        return []
    now, output = script_settings(grid, run["args"])
    if now is None:
        raise SystemExit(
            f"{output}error: run {run['name']} of the grid {grid['path']} cannot start: its script does not take its "
            "flags (above)"
        )
    then = script_settings(grid, started)[0]  # a setting added to the script since: as the run's command line gives it
    if then is not None and started_settings is not None:
        then |= started_settings
    if then is None:
        return [f"{shlex.join(started)}\n    (the grid: {shlex.join(run['args'])})"]  # a flag the script no longer takes
    unread = TRUE_REWARD_RUNS_IGNORE.get(Path(grid["script"]).name, ()) if run["mode"] == "true" else ()
    changed = [name for name in now if name not in unread and then.get(name) != now[name]]
    return [f"--{name.replace('_', '-')} {then.get(name)} (the grid: {now[name]})" for name in changed]


def in_a_process_of_its_own(function, *arguments):
    """`function(*arguments)` (a function of this file, its arguments and result JSON) in a short-lived Python process:
    a run's task, which waits beside its run for hours (a Slurm task within its --mem), does not keep what reading the
    run's settings imports (the script: torch and the simulator, about 220 MB)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import sweep; function, arguments = json.load(sys.stdin); "
        "print('\\n' + json.dumps(getattr(sweep, function)(*arguments)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).resolve().parent)],
        input=json.dumps([function, arguments]),
        stdout=subprocess.PIPE,
        text=True,
    )
    if done.returncode != 0:  # its traceback went to stderr, as this process's would have
        raise SystemExit(f"error: reading the run's settings failed (exit {done.returncode}; the reason above)")
    return json.loads(done.stdout.splitlines()[-1])  # (the script may print as it is imported)


def changed_since_start(grid, run, folder, apart=False):
    """How the settings of the run's last start (from its log) differ from those the grid gives it now
    (settings_changed; nothing for a log without a start line, written by hand); `apart`: read in a process of its
    own (in_a_process_of_its_own), as a run's task does."""
    started = started_args(folder / "run.log")
    if started is None:
        return []
    arguments = (grid, run, started, started_settings(folder / "run.log"))
    return in_a_process_of_its_own("settings_changed", *arguments) if apart else settings_changed(*arguments)


def finished_otherwise(grid, sweep_dir):
    """The grid's finished runs whose last start had other settings than the grid gives them now (a grid edited after
    they finished, or another grid's runs in the same folder), each as (name, "name: how") (settings_changed). A log without
    its start line (written by hand) is taken as the grid's."""
    found = []
    for run in grid["runs"]:
        folder = sweep_dir / run["name"]
        changed = changed_since_start(grid, run, folder) if run_state(folder) == "done" else []
        if changed:
            found.append((run["name"], f"{run['name']}: {', '.join(changed)}"))
    return found


def refuse_finished_otherwise(grid, sweep_dir):
    found = [how for _, how in finished_otherwise(grid, sweep_dir)]
    if found:
        raise SystemExit(
            f"error: {len(found)} finished run{'s' if len(found) > 1 else ''} of the grid {grid['path']} ran with other "
            "settings than the grid gives them now (a grid edited since they finished, or another grid's runs in the "
            "same --out); they would count as done and be reported as the grid's:\n  "
            + "\n  ".join(found)
            + f"\n  delete their folders in {sweep_dir} to run them at the grid's settings, or restore the grid's old ones"
        )


def sweep_folder(grid_path, out):
    return Path(out) if out else ROOT / "benchmark" / "sweeps" / Path(grid_path).stem


def run_state(folder):
    """The run's state: "done", "running" (a process holds its lock), "stopped" (a checkpoint to resume from) or
    "new"."""
    if (folder / "done.json").exists():
        return "done"
    if (folder / "run.lock").exists():
        with open(folder / "run.lock") as lock:  # a shared lock, for a moment: free unless a run holds it
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return "running"
            except OSError:  # a file system without locks
                pass
    return "stopped" if saved_run(folder) else "new"


def lock_run(folder):
    """The run's lock file, locked and naming its holder, or None where another process holds it (tried for 2 s: a
    `status` may hold it for a moment). A task holds it, and hands it to its script, while the run goes on: the lock
    ends with the last of them, a killed one too."""
    lock = open(folder / "run.lock", "a+")
    for attempt in range(20):
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == 19:
                lock.close()
                return None
            time.sleep(0.1)
        except OSError as error:  # a file system without locks (Lustre mounted without flock, say): run unguarded
            print(
                f"warning: cannot lock {folder / 'run.lock'} ({error}): nothing keeps a second sweep off this run",
                file=sys.stderr,
            )
            break
    lock.truncate(0)
    job = f", Slurm job {os.environ['SLURM_JOB_ID']}" if "SLURM_JOB_ID" in os.environ else ""
    lock.write(f"{socket.gethostname()}, process {os.getpid()}{job}\n")
    lock.flush()
    return lock


def saved_run(folder):
    """The script's run folder (runs/NAME) under this run's folder, if it holds a checkpoint."""
    found = sorted((folder / "runs").glob("*/checkpoint.pt"))
    return found[-1].parent if found else None


def started_args(log_path):
    """The script's arguments of the run's last start (the one its checkpoint comes from: a start that died before its
    first checkpoint is started again), from its log (None without one)."""
    if not log_path.exists():
        return None
    starts = re.findall(r"^# .* UTC, started: (.*)$", log_path.read_text(), re.MULTILINE)
    return shlex.split(starts[-1])[2:] if starts else None  # after the interpreter and the script


def started_settings(log_path):
    """The settings the sweep logged as the run's last start began (`# settings: {...}`, the line after it: every
    setting of its script as it read them then), or None (a log from before that line, or none)."""
    if not log_path.exists():
        return None
    found = re.findall(r"^# .* UTC, (started|resumed): .*\n(?:# settings: (.*)\n)?", log_path.read_text(), re.MULTILINE)
    starts = [settings for kind, settings in found if kind == "started"]
    try:
        settings = json.loads(starts[-1]) if starts and starts[-1] else None
    except ValueError:  # a line cut short (a full disk, an edit): the command line is compared instead
        return None
    return settings if isinstance(settings, dict) else None


def code_version(script):
    """The repository's commit, and whether the run's script differs from it: the code a run started or resumed with
    (a resumed run goes on with the code of its resumption, not its start's)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        changed = subprocess.run(  # (without the index lock: tasks starting together, a user's commit)
            ["git", "--no-optional-locks", "status", "--porcelain", "--", script], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return "unknown (no git)"
    if head.returncode != 0:
        return "unknown (not in a git repository)"
    return f"commit {head.stdout.strip()}" + (f", {Path(script).name} changed since" if changed.stdout.strip() else "")


def files_git_tracks(folder):
    """The files in `folder` that git tracks (none outside a repository, or without git)."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=folder, capture_output=True, text=True)
    except OSError:
        return []
    return listed.stdout.splitlines() if listed.returncode == 0 else []


def since_last_start(log_text):
    """A run's log from its last start on (`# ... UTC, started: `; resumptions go on from it, a new start does not)."""
    return log_text[max([0] + [m.start() for m in re.finditer(r"^# .* UTC, started: ", log_text, re.MULTILINE)]) :]


# --- one run ----------------------------------------------------------------------------------------------------------
def found_done(grid, run, folder):
    """ "done" for a run found finished, or "failed" (saying why) where it ran with other settings than the grid gives
    it: a sweep of another grid in the same --out finished it after this sweep's check (refuse_finished_otherwise)."""
    (folder / ".gitignore").unlink(missing_ok=True)  # a task killed between done.json and the unlink in execute
    changed = changed_since_start(grid, run, folder, apart=True)
    if changed:
        print(
            f"error: {run['name']} was finished with other settings than the grid's (another grid's sweep in the same "
            f"--out?): {', '.join(changed)}\n  run this grid with another --out (deleting {folder} would delete the "
            "other grid's run)",
            file=sys.stderr,
        )
        return "failed"
    return "done"


def execute(grid, run, sweep_dir, on_signal_requeue=False):
    """Run (or resume) one run to its end, or until this process is signalled; returns its state afterwards."""
    folder = sweep_dir / run["name"]
    if run_state(folder) == "done":
        return found_done(grid, run, folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = lock_run(folder)  # two processes of one run would write one log and one checkpoint
    if lock is None:
        holder = (folder / "run.lock").read_text().strip() or "unknown"
        print(f"error: {run['name']} is running already ({folder / 'run.lock'} is held: {holder})", file=sys.stderr)
        return "running"
    if run_state(folder) == "done":  # finished while this task waited for the lock
        lock.close()
        return found_done(grid, run, folder)
    tracked = files_git_tracks(folder)
    if tracked:  # the .gitignore below cannot untrack them: `git add benchmark` would commit a partial log
        print(
            f"error: git tracks {', '.join(tracked)} in {folder}: the next `git add` would commit the log of the run "
            f"under way.\n  `git rm -r --cached {folder}` and commit (the files stay here), then run it again",
            file=sys.stderr,
        )
        lock.close()
        return "failed"
    # git skips the folder until the run is done: a partial run.log is not committed by `git add benchmark`
    (folder / ".gitignore").write_text("# sweep.py: this run is not done (removed with done.json)\n*\n")
    previous = saved_run(folder)
    script = str(ROOT / grid["script"])
    if previous:
        changed = changed_since_start(grid, run, folder, apart=True)
        if changed:  # the checkpoint would keep the old settings
            print(
                f"error: {run['name']} was started with other settings than the grid's, and its checkpoint resumes "
                f"with the old ones: {', '.join(changed)}\n"
                f"  delete {folder} to start it again with the grid's settings, or restore the grid's old ones",
                file=sys.stderr,
            )
            lock.close()
            return "failed"
        command = [sys.executable, script, "--resume", str(previous.relative_to(folder))]
    else:
        command = [sys.executable, script, *run["args"]]
        for stale in (folder / "runs").glob("*"):  # a start that died before its first checkpoint: start again
            if ".failed-" not in stale.name:  # (not one put aside by an earlier start)
                stale.rename(folder / "runs" / f"{stale.name}.failed-{int(time.time())}")
    log_path = folder / "run.log"
    with open(log_path, "a") as log:
        log.write(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC, {'resumed' if previous else 'started'}: ")
        log.write(f"{shlex.join(command)}\n")
        if not previous:  # every setting as the script reads them now: a default it changes later shows (settings_changed)
            log.write(f"# settings: {json.dumps(in_a_process_of_its_own('script_settings', grid, run['args'])[0])}\n")
        log.write(f"# code: {code_version(script)}\n")
        log.flush()
        attempt_starts = log.tell()
        signalled, children = [], []

        def stop_child(signum, frame):  # the scripts stop at the end of the iteration and save
            signalled.append(signum)
            for child in children:
                child.send_signal(signal.SIGTERM)

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(signum, stop_child)
        started = time.monotonic()
        children.append(subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, pass_fds=(lock.fileno(),)))
        if signalled:  # signalled while it started
            children[0].send_signal(signal.SIGTERM)
    returncode = children[0].wait()
    wall_s = time.monotonic() - started
    with open(log_path, "a") as log:
        log.write(f"# exit {returncode}, wall_s {wall_s:.1f}\n")
    with open(log_path) as log:
        log.seek(attempt_starts)
        interrupted = "interrupted at step" in log.read()
    finished = returncode == 0 and not interrupted and not signalled
    if finished:
        # the run's attempts: its last start (one that died before its first checkpoint was started again) and every
        # resume, one that died after a checkpoint too (killed, or SIGTERMed while it shut down); the wall time is of
        # those that logged their exit (a task killed outright, with its machine say, logs none)
        text = log_path.read_text()
        this_run = since_last_start(text)
        attempts = len(re.findall(r"^# .* UTC, (?:started|resumed): ", this_run, re.MULTILINE))
        walls = [float(w) for w in re.findall(r"^# exit -?\d+, wall_s ([\d.]+)$", this_run, re.MULTILINE)]
        record = {"wall_s": round(sum(walls), 1), "attempts": attempts}
        if len(walls) < attempts:
            record["untimed_attempts"] = attempts - len(walls)
        (folder / "done.json").write_text(json.dumps(record) + "\n")
        (folder / ".gitignore").unlink(missing_ok=True)
    lock.close()  # after done.json (a task waiting for the lock must see it), before a requeue (the next start needs it)
    if finished:
        return "done"
    if on_signal_requeue and signal.SIGUSR1 in signalled and "SLURM_ARRAY_JOB_ID" in os.environ:
        task = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        try:  # runs again, and resumes, when scheduled
            requeue = subprocess.run(["scontrol", "requeue", task], capture_output=True, text=True)
            why = (requeue.stderr or requeue.stdout).strip() or f"exit {requeue.returncode}"
        except OSError as error:
            requeue, why = None, str(error)
        if requeue is None or requeue.returncode != 0:  # nothing would resume the run: fail, for sacct to show
            print(  # (grid['path'] is the sweep's copy of the grid, {out}/grid_{hash}.json)
                f"error: Slurm did not requeue {run['name']} ({why}); its run stopped (its run.log says how). To go "
                f"on, submit the grid again: python benchmark/sweep.py slurm GRID --out {sweep_dir}",
                file=sys.stderr,
            )
            return "failed"
    return "failed" if returncode != 0 and not signalled else "stopped"


# --- commands ---------------------------------------------------------------------------------------------------------
def frozen_grid(grid, sweep_dir):
    """A copy of the grid file as it was loaded, named by its content ({out}/grid_{hash}.json), for the task processes
    to read: an edit of the grid file while a local sweep runs, or a later submission of an edited grid to the same
    folder, never changes what a task runs (a seed added in the middle shifts the runs' indices)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    frozen = sweep_dir / f"grid_{hashlib.sha256(grid['text'].encode()).hexdigest()[:12]}.json"
    if not frozen.exists():  # a resubmission of the same grid leaves the copy its queued tasks read alone
        partial = frozen.with_name(f"{frozen.name}.{os.getpid()}.tmp")
        partial.write_text(grid["text"])
        partial.replace(frozen)
    return frozen


def not_done(grid, sweep_dir, indices):
    return [i for i in indices if run_state(sweep_dir / grid["runs"][i]["name"]) != "done"]


def run_local(grid, sweep_dir, workers, indices):
    """The runs at `indices` not done, `workers` at a time, each as a `task` process (Ctrl-C or SIGTERM stops them
    all; they save). Returns the signal that stopped it (None where it ran to the end) and the names of the runs that
    failed."""
    todo = not_done(grid, sweep_dir, indices)
    print(f"{len(indices) - len(todo)} of {len(indices)} runs done; running {len(todo)}, {workers} at a time")
    running = {}
    stopping, failed = [], []
    grid_copy = frozen_grid(grid, sweep_dir) if todo else None
    # `kill` or a scheduler; not through Ctrl-C's handler: a shell starts a background job (`nohup ... &`) without one
    previous_handler = signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    try:
        while (todo or running) and not stopping:
            while todo and len(running) < workers and not stopping:
                index = todo.pop(0)
                command = [sys.executable, __file__, "task", str(grid_copy), "--index", str(index), "--out", str(sweep_dir)]
                running[subprocess.Popen(command, start_new_session=True)] = grid["runs"][index]["name"]
            for task in [task for task in running if task.poll() is not None]:
                name = running.pop(task)
                print(f"{name}: {run_state(sweep_dir / name)} (exit {task.returncode})")
                if task.returncode != 0 or run_state(sweep_dir / name) != "done":  # (a script stopped by a `kill` of
                    failed.append(name)  # its own saves and exits 0, its task too: not done all the same)
            time.sleep(0.5)
    except KeyboardInterrupt:
        stopping.append(signal.SIGINT)
    if stopping:  # the tasks run in sessions of their own (Ctrl-C does not reach them): each stops its run
        print("stopping: each run saves at the end of its iteration; run the same command to resume")
        for task in running:
            task.send_signal(signal.SIGTERM)
        for task, name in running.items():
            if task.wait() != 0:  # it failed before the stop reached it (a task the stop ends exits 0)
                failed.append(name)
            print(f"{name}: {run_state(sweep_dir / name)}")
    signal.signal(signal.SIGTERM, previous_handler)
    return (stopping[0] if stopping else None), failed


def index_ranges(indices):
    """Sorted array indices in sbatch's form: [0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    ranges = []
    for index in indices:
        if ranges and index == ranges[-1][1] + 1:
            ranges[-1][1] = index
        else:
            ranges.append([index, index])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in ranges)


def submit_slurm(grid, sweep_dir, options, indices):
    """One array task per run at `indices` not done; returns the job id (None with --dry-run)."""
    todo = not_done(grid, sweep_dir, indices)
    if not todo:
        print("every run is done: nothing to submit")
        return None
    frozen = frozen_grid(grid, sweep_dir)  # what a task still queued or requeued reads, whatever happens to the grid file
    task = [sys.executable, str(Path(__file__).resolve()), "task", str(frozen.resolve())]
    task += ["--out", str(sweep_dir.resolve()), "--requeue-on-signal"]
    lines = ["#!/bin/bash", f"#SBATCH --job-name=sweep-{sweep_dir.name}", f"#SBATCH --array={index_ranges(todo)}"]
    lines += [f"#SBATCH --cpus-per-task={options.cpus_per_task}", f"#SBATCH --mem={options.mem}"]
    lines += [f"#SBATCH --time={options.time}", f"#SBATCH --output={sweep_dir.resolve()}/slurm-%A_%a.out"]
    lines += ["#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{options.signal_seconds}"]
    if options.partition:
        lines.append(f"#SBATCH --partition={options.partition}")
    lines += [f"#SBATCH {extra}" for extra in options.sbatch_arg]
    # exec: the task is the batch shell's process, so Slurm's signal (B:USR1) reaches it
    lines += [f"cd {shlex.quote(str(ROOT))}", f'exec {shlex.join(task)} --index "$SLURM_ARRAY_TASK_ID"']
    batch = sweep_dir / "slurm_array.sh"
    batch.write_text("\n".join(lines) + "\n")
    if options.dry_run:
        print(f"{batch} written ({len(todo)} tasks); submit with: sbatch {batch}")
        return None
    try:
        submitted = subprocess.run(["sbatch", "--parsable", str(batch)], capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit("error: sbatch not found: is this a Slurm login node? (--dry-run writes the script only)")
    if submitted.returncode != 0:
        raise SystemExit(f"error: sbatch refused {batch}: {submitted.stderr.strip()}")
    job = submitted.stdout.strip().split(";")[0]
    print(
        f"submitted job array {job}: {len(todo)} runs ({batch}); when it is done: python benchmark/sweep.py report "
        f"{shlex.quote(str(grid['path']))} --out {shlex.quote(str(sweep_dir))}"
    )
    return job


def status(grid, sweep_dir):
    """How many of the grid's runs are in each state (run_state), with their names; finished runs whose settings are
    not the grid's (finished_otherwise) apart, with how they differ: local, slurm and report refuse them."""
    otherwise = dict(finished_otherwise(grid, sweep_dir))
    other = "done with other settings than the grid's (local, slurm and report refuse them)"
    states = {state: [] for state in ("done", "running", "stopped", "new", other)}
    for run in grid["runs"]:
        name = run["name"]
        states[other if name in otherwise else run_state(sweep_dir / name)].append(otherwise.get(name, name))
    for state, names in states.items():
        if names or state != other:
            print(f"{state}: {len(names)}" + "".join(f"\n  {name}" for name in names[:50]))


# --- the report -------------------------------------------------------------------------------------------------------
def curves(grid, sweep_dir):
    """{env: {mode: [(steps, returns, done) per seed that logged progress]}}, from the runs' logs."""
    found = {}
    for run in grid["runs"]:
        log = sweep_dir / run["name"] / "run.log"
        if log.exists():  # a start that died before its first checkpoint was started again: its lines are not the run's
            steps, returns, _ = progress_in(since_last_start(log.read_text()))
            if len(steps):
                done = run_state(sweep_dir / run["name"]) == "done"
                found.setdefault(run["env"], {}).setdefault(run["mode"], []).append((steps, returns, done))
    return found


def on_common_steps(runs):
    """Seeds' curves cut to the steps every one of them reached: (steps, returns (seeds, steps))."""
    shared = set(runs[0][0])
    for steps, _ in runs[1:]:
        shared &= set(steps)
    steps = np.array(sorted(shared), dtype=int)
    return steps, np.array([[dict(zip(s.tolist(), r))[step] for step in steps] for s, r in runs])


def ratio_to_true(final, true_final, start):
    """A run's final return over the true-reward runs'; where that is negative (Reacher), a plain ratio would call a
    worse return better, so the ratio counts from `start`, the returns the runs began with."""
    if true_final is None:
        return None
    if true_final > 0:
        return final / true_final
    return (final - start) / (true_final - start) if true_final > start else None  # no progress to measure against


def ratio_standard_error(ratio, finals, true_finals, start):
    """The standard error over seeds of `ratio` (ratio_to_true of the two modes' mean finals): each mean's standard
    error (the seeds' sample std over the square root of their number), relative to the mean counted from `start`
    where the ratio is, added in quadrature (first-order propagation). None where either mode has a single seed."""
    if len(finals) < 2 or len(true_finals) < 2:
        return None
    shift = 0.0 if true_finals.mean() > 0 else start
    relative = [(values.std(ddof=1) / np.sqrt(len(values))) / (values.mean() - shift) for values in (finals, true_finals)]
    return abs(ratio) * float(np.hypot(*relative))


def mode_order(mode):
    return -1 if mode == "true" else int(mode[len("labels") :])


def write_report(grid, sweep_dir):
    """figure.png (a panel per env: mean true return over seeds, shaded +- one standard deviation, per mode) and
    table.md (final return per env and mode, its ratio to the true-reward runs with its standard error, C17's claim
    and, where it is not met, by how many standard errors).
    A mode with finished runs is drawn and judged on those alone; one with none yet on its runs so far, cut to the
    steps all reached, and a budget is judged only once it and the true reward both have finished runs."""
    found = curves(grid, sweep_dir)
    if not found:
        print("no run has logged progress yet")
        return None
    steps_of = {
        run["env"]: run["args"][run["args"].index("--total-timesteps") + 1]
        for run in grid["runs"]
        if "--total-timesteps" in run["args"]
    }
    envs = [env for env in grid["envs"] if env in found]
    planned = Counter((run["env"], run["mode"]) for run in grid["runs"])  # the seeds the grid names per env and mode
    columns = min(4, len(envs))
    rows_n = -(-len(envs) // columns)
    figure, axes = plt.subplots(rows_n, columns, figsize=(4 * columns, 3.2 * rows_n), squeeze=False)
    table = [grid["note"], ""] if grid.get("note") else []
    table += [
        "| env | steps | feedback | seeds (done) | final true return, mean ± std | ratio to true reward | C17's claim |",
        "|---|---|---|---|---|---|---|",
    ]
    from_start = []  # envs whose ratio counts from the start (negative returns)
    budgets = [f"labels{feedback}" for feedback in grid["feedback"] if feedback != "true"]
    colors = {"true": "black"} | {mode: f"C{i}" for i, mode in enumerate(budgets)}  # a budget's colour in every panel
    for axis, env in zip(axes.flat, envs):
        true_final, true_finals, true_finished = None, None, False
        start = np.mean([returns[0] for runs in found[env].values() for _, returns, _ in runs])
        for mode in sorted(found[env], key=mode_order):
            # the finished seeds where there are any: cut to a stopped run's last step, they would read as early returns
            finished = [(steps, returns) for steps, returns, done in found[env][mode] if done]
            steps, returns = on_common_steps(finished or [(steps, returns) for steps, returns, _ in found[env][mode]])
            label = "true reward" if mode == "true" else f"{mode[len('labels') :]} labels"
            if not len(steps):  # e.g. a run under way started with other settings (`local` refuses to resume it)
                seeds = f"{len(returns)} seeds{'' if finished else ' under way'}"
                row = f"| {env} | {steps_of.get(env, 'default')} | {label} | {planned[env, mode]} ({len(finished)}) |"
                table.append(f"{row} its {seeds} logged no step in common | | |")
                continue
            mean, std = returns.mean(0), seeds_std(returns)
            axis.plot(steps, mean, label=label, color=colors[mode])
            axis.fill_between(steps, mean - std, mean + std, alpha=0.2, color=colors[mode])
            final = returns[:, -1]
            if mode == "true":
                true_final, true_finals, true_finished = final.mean(), final, bool(finished)
            ratio = None if mode == "true" else ratio_to_true(final.mean(), true_final, start)
            error = None if ratio is None else ratio_standard_error(ratio, final, true_finals, start)
            shown_ratio = "" if ratio is None else f"{ratio:.2f}" + ("" if error is None else f" ± {error:.2f}")
            claim = C17_CLAIM.get(mode_order(mode))
            # runs under way, or true-reward runs under way, are shown, not judged
            judged = claim is not None and ratio is not None and finished and true_finished
            verdict = f"{claim:.2f}: {'met' if ratio >= claim else 'not met'}" if judged else ""
            if judged and ratio < claim and error:  # how far short, in the ratio's standard errors over the seeds
                verdict += f", {(claim - ratio) / error:.1f} standard errors short"
            table.append(
                f"| {env} | {steps_of.get(env, 'default')} (at {steps[-1]}) | {label} | {planned[env, mode]} ({len(finished)}) | "
                f"{fmt(final.mean())} ± {fmt(seeds_std(final))} | {shown_ratio} | "
                f"{verdict} |"
            )
        if true_final is not None and true_final <= 0:
            from_start.append(f"{env} (start {fmt(start)})")
        axis.set_title(env)
        axis.set_xlabel("steps")
        axis.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))  # 1e5 or 1e6 at the end: labels never collide
        axis.set_ylabel("true return")
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(envs) :]:
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(sweep_dir / "figure.png", dpi=100)
    plt.close(figure)
    table += [
        "",
        "± after a mean: the seeds' sample std (the figure's band too). ± after a ratio: its standard error over the"
        " seeds (each mode's sample std over the square root of its seeds,"
        " propagated to the ratio to first order); the claim is judged on the ratio itself, and a cell not met says how"
        " many standard errors short of the claim its ratio is (one or two: a few more seeds can change the verdict).",
    ]
    if from_start:
        table += [
            "",
            "The true-reward return is not positive on " + ", ".join(from_start) + ": there the ratio is (R - start) /"
            " (true - start), start the mean first logged return of the env's runs (the untrained policy).",
        ]
    (sweep_dir / "table.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    print(f"figure: {sweep_dir / 'figure.png'}, table: {sweep_dir / 'table.md'}")
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("local", "slurm", "report", "status", "task"):
        command = commands.add_parser(name)
        command.add_argument("grid", help="the grid's JSON file (benchmark/grids/*.json)")
        command.add_argument("--out", default=None, help="the sweep's folder (default benchmark/sweeps/{grid name})")
        if name in ("local", "slurm"):
            command.add_argument("--envs", nargs="+", default=None, help="only the runs of these envs (a batch)")
            command.add_argument(
                "--feedback", nargs="+", default=None, help='only the runs of these feedbacks: "true", label counts'
            )
            command.add_argument("--seeds", nargs="+", type=int, default=None, help="only the runs of these seeds")
        if name == "local":
            command.add_argument("--workers", type=int, default=os.cpu_count(), help="runs at once (default: cores)")
        if name == "slurm":
            command.add_argument("--cpus-per-task", type=int, default=1)
            command.add_argument("--mem", default="4G", help="memory per run (sbatch --mem)")
            command.add_argument("--time", default="12:00:00", help="time limit per run (sbatch --time)")
            command.add_argument("--partition", default=None)
            command.add_argument("--signal-seconds", type=int, default=120, help="stop and requeue this long before the limit")
            command.add_argument("--sbatch-arg", action="append", default=[], help="another #SBATCH line, e.g. --account=X")
            command.add_argument("--dry-run", action="store_true", help="write the batch script, do not submit")
        if name == "task":
            command.add_argument("--index", type=int, required=True, help="the run's place in the grid (the array index)")
            command.add_argument("--requeue-on-signal", action="store_true", help="on SIGUSR1 (Slurm), requeue this task")
    options = parser.parse_args()
    if options.command == "local" and options.workers < 1:
        parser.error("--workers must be at least 1")
    if options.command == "slurm" and options.cpus_per_task < 1:
        parser.error("--cpus-per-task must be at least 1")
    if options.command == "slurm" and not 0 <= options.signal_seconds <= 65535:
        parser.error("--signal-seconds must be 0-65535 (seconds before the time limit)")
    grid = load_grid(options.grid)
    grid["path"] = options.grid
    if getattr(options, "envs", None):
        unknown = sorted(set(options.envs) - set(grid["envs"]))
        if unknown:
            parser.error(f"--envs {' '.join(unknown)}: not in the grid ({', '.join(grid['envs'])})")
    envs, modes = getattr(options, "envs", None), None
    if getattr(options, "feedback", None):
        known = [str(feedback) for feedback in grid["feedback"]]  # "true", "350", ...
        unknown = [feedback for feedback in options.feedback if feedback not in known]
        if unknown:
            parser.error(f"--feedback {' '.join(unknown)}: not in the grid ({', '.join(known)})")
        modes = ["true" if f == "true" else f"labels{f}" for f in options.feedback]
    seeds = getattr(options, "seeds", None)
    if seeds:
        known = sorted({run["seed"] for run in grid["runs"]})
        unknown = [seed for seed in seeds if seed not in known]
        if unknown:
            parser.error(f"--seeds {' '.join(map(str, unknown))}: not in the grid ({', '.join(map(str, known))})")
    batch = [
        i
        for i, run in enumerate(grid["runs"])
        if (not envs or run["env"] in envs) and (not modes or run["mode"] in modes) and (not seeds or run["seed"] in seeds)
    ]
    if not batch:  # e.g. a seed that only other feedback settings have (seeds_by_feedback)
        filters = (("envs", envs), ("feedback", getattr(options, "feedback", None)), ("seeds", seeds))
        chosen = " ".join(f"--{name} {' '.join(map(str, values))}" for name, values in filters if values)
        parser.error(f"no run of the grid is {chosen}" if chosen else f"the grid {options.grid} has no runs")
    sweep_dir = sweep_folder(options.grid, options.out)
    if options.command in ("local", "slurm", "report"):
        refuse_finished_otherwise(grid, sweep_dir)  # the report takes every finished run of the grid
    if options.command in ("local", "slurm"):
        check_runs(grid, not_done(grid, sweep_dir, batch), sweep_dir)
    if options.command == "local":
        stopped_by, failed = run_local(grid, sweep_dir, options.workers, batch)
        if stopped_by is None:
            refuse_finished_otherwise(grid, sweep_dir)  # (another grid's sweep in the same --out, meanwhile)
            write_report(grid, sweep_dir)
        if failed:
            print(
                f"error: {len(failed)} run(s) not done: {', '.join(failed)} (why: above, and in their run.log)",
                file=sys.stderr,
            )
        if stopped_by is not None:  # as a killed program ends: `sweep.py local A && sweep.py local B` stops at A
            sys.exit(128 + stopped_by)
        if failed:
            sys.exit(1)
    elif options.command == "slurm":
        submit_slurm(grid, sweep_dir, options, batch)
    elif options.command == "report":
        write_report(grid, sweep_dir)
    elif options.command == "status":
        status(grid, sweep_dir)
    else:
        if not 0 <= options.index < len(grid["runs"]):
            raise SystemExit(f"error: --index {options.index}: the grid has runs 0-{len(grid['runs']) - 1}")
        state = execute(grid, grid["runs"][options.index], sweep_dir, options.requeue_on_signal)
        sys.exit(0 if state in ("done", "stopped") else 1)


if __name__ == "__main__":
    main()
