# PPO from preferences on the moving-dot problem (C17's method on a toy task that learns in minutes on a laptop):
# docs in README.md "The moving dot", results in benchmark/README.md "Moving dot"
import copy
import json
import math
import os
import pathlib
import random
import re
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import http.client
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, Optional

import gymnasium as gym
import imageio
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=False`"""
    cuda: bool = False
    """if toggled, cuda will be used when available"""
    threads: int = 1
    """torch CPU threads (1 lets several runs share a machine)"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (check out `videos` folder)"""
    save_model: bool = False
    """whether to save a checkpoint (agent, reward ensemble, optimisers, random generators, environments) to
    `runs/{run_name}`"""
    checkpoint_every: int = 50
    """with --save-model, write the checkpoint every this many iterations (and at the end)"""
    resume: Optional[str] = None
    """a run folder `runs/{run_name}` to continue from its checkpoint and saved labels (asking only the labels the
    schedule still misses)"""
    eval_only: bool = False
    """evaluate the checkpoint of --resume (most likely action) for --eval-episodes episodes and exit"""
    eval_episodes: int = 10
    """number of episodes for --eval-only"""

    # Algorithm specific arguments
    observation: Literal["position", "pixels"] = "position"
    """what the agent and the reward model see: the dot's position (the blog's) or a 42x32 grey frame (mrahtz's)"""
    episode_steps: int = 2000
    """steps per episode (the blog's 2000; episodes never end early)"""
    total_timesteps: int = 200000
    """total timesteps of the experiments (RLHF pretraining rollouts included)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold"""

    # Preference learning arguments
    feedback: Literal["synthetic", "human", "true-reward"] = "synthetic"
    """where the reward comes from: preferences of the synthetic teacher, of people through label_server.py, or the
    environment's reward (baseline)"""
    offline: bool = False
    """the blog's offline variant: label random-policy segment pairs into an SQLite database, fit the reward model
    once, then run RL on the frozen model (C17 3.3: an offline reward can be exploited); synthetic teacher only"""
    preference_db: Optional[str] = None
    """with --offline: the SQLite preference database (default `runs/{run_name}/preferences.sqlite`); pairs already in
    it are reused and only the missing ones are labelled; it records its teacher's flags, and a run with others is
    refused it"""
    labels: int = 1000
    """total number of preference labels to query over the run (a pair the teacher skips is no label: another is
    asked in its place)"""
    segment_len: int = 10
    """steps per segment (the blog: 1, C17: 15-60): short segments say more about each step, and 10 steps still
    show people a movement"""
    pretrain_fraction: float = 0.25
    """share of the labels queried from the initial policy before RL starts (C17 A.1: 25%; at least 1 label)"""
    pretrain_steps: int = 8192
    """environment steps of the initial policy from which the pretraining labels are drawn (count in total_timesteps)"""
    pretrain_epochs: int = 200
    """epochs of reward-model training on the pretraining labels (or the offline database) before RL starts (C17
    A.2: 200); an epoch: as many minibatches as the labels fill, each drawn at random (with replacement)"""
    schedule_horizon: float = 2e5
    """labels after pretraining arrive at a rate proportional to horizon / (T + horizon) (C17 A.1: 2e6 for runs of
    millions of steps; scaled down to this problem's runs)"""
    selection: Literal["variance", "random"] = "variance"
    """how pairs are chosen once RL runs: highest ensemble disagreement among candidates (C17 2.2.4), or at random
    (ablation); pretraining pairs are always random (the untrained ensemble's disagreement is noise)"""
    candidate_multiplier: int = 10
    """candidate pairs drawn per queried pair for variance-based selection (C17 A: 10x)"""
    ensemble_size: int = 3
    """number of reward predictors in the ensemble (C17: 3)"""
    reward_form: Optional[Literal["action", "progress"]] = None
    """what each member scores: a step's observation and action, r(o, a) (C17), or its progress f(o') - f(o), one
    learned function of the observation before and after the step, so that staying, pushing against the border and
    any loop earn exactly what staying earns (0 before the normalisation, which shifts every step alike) (default:
    progress on pixels, action on positions; README "The moving dot")"""
    reward_lr: float = 1e-3
    """learning rate of the reward model (Adam)"""
    reward_batch_size: int = 64
    """preference pairs per reward-model gradient step"""
    reward_updates: int = 10
    """reward-model gradient steps per PPO iteration (the model keeps training as labels arrive, C17 2.2)"""
    reward_eval_every: int = 10
    """reward-model training rounds (one per iteration; one per epoch in pretraining) between validations (losses,
    accuracy, then the reward normalisation refitted and the L2 coefficients adapted)"""
    reward_std: float = 1.0
    """standard deviation of the normalised learned reward given to PPO (C17 A.1: 1)"""
    label_noise: float = 0.1
    """C17 2.2.3: the preference model assumes the teacher answers uniformly at random with this probability"""
    teacher_beta: float = float("inf")
    """synthetic teacher rationality: P(left) = sigmoid(beta * (R_left - R_right)); inf = always the better one"""
    teacher_gamma: float = 1.0
    """synthetic teacher myopia: reward at step t weighted gamma^(L-1-t) (B-Pref); 1 = undiscounted"""
    teacher_epsilon: float = 0.0
    """synthetic teacher mistake probability: the answer is flipped (B-Pref)"""
    teacher_skip_threshold: float = float("-inf")
    """synthetic teacher skips a pair when both segments' undiscounted returns are below this (B-Pref); skipped pairs are not
    counted in --labels: new pairs are asked in their place"""
    teacher_equal_margin: float = 0.0
    """synthetic teacher answers 'equal' when the undiscounted returns differ by at most this (B-Pref); 0 = exact ties only"""
    label_server: str = "http://127.0.0.1:8000"
    """with --feedback human: the address of label_server.py"""
    label_token: Optional[str] = None
    """with --feedback human: the label server's --token, if it has one"""
    instruction: str = "Which clip shows the dot moving towards the centre (the grey cross)?"
    """with --feedback human: the question raters are asked"""
    clip_fps: int = 6
    """with --feedback human: playback frame rate; 10 steps (11 frames) at 6 frames/s is a 1.8 s clip (C17 B: 1-2 s)"""

    # to be filled in runtime (not flags: a value given would be overwritten unseen)
    batch_size: tyro.conf.Suppress[int] = 0
    """the batch size (computed in runtime)"""
    minibatch_size: tyro.conf.Suppress[int] = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """the number of iterations (computed in runtime)"""
    pretrain_iterations: tyro.conf.Suppress[int] = 0
    """rollouts of the initial policy used only for pretraining labels (computed in runtime)"""


# The moving-dot environment (the blog seed's numbers; mrahtz/learning-from-human-preferences)
FIELD_HEIGHT, FIELD_WIDTH = 210, 160
LOW, HIGH = np.array([4, 4]), np.array([205, 155])  # the dot's (row, column) stays inside these, inclusive
CENTRE = np.array([105, 80])
MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])  # stay, up, down, left, right; one pixel
DOT_RADIUS = 2  # the dot is drawn 5x5 pixels
PIXEL_SCALE = 5  # pixel observations average 5x5 blocks: 42x32


def dot_coverage(centres, size):
    """Share of each PIXEL_SCALE-wide cell along one axis covered by a dot centred at `centres` (...,): (..., cells)."""
    edges = np.arange(size // PIXEL_SCALE) * PIXEL_SCALE
    low = centres[..., None] - DOT_RADIUS
    high = centres[..., None] + DOT_RADIUS + 1
    return np.clip(np.minimum(high, edges + PIXEL_SCALE) - np.maximum(low, edges), 0, None) / PIXEL_SCALE


def observe(positions, observation):
    """The observation of dot positions (..., 2) (row, column): the position scaled to about [-1, 1], or the field
    drawn with a 5x5 dot and averaged over 5x5 blocks (a 1-pixel move still changes the frame), uint8 (..., 1, 42, 32)."""
    positions = np.asarray(positions)
    if observation == "position":
        return ((positions - CENTRE) / CENTRE).astype(np.float32)
    rows = dot_coverage(positions[..., 0], FIELD_HEIGHT)
    cols = dot_coverage(positions[..., 1], FIELD_WIDTH)
    return np.round(255 * rows[..., None, :, None] * cols[..., None, None, :]).astype(np.uint8)


def render_frame(position):
    """What people see (RGB, 210x160): a grey cross at the centre, the dot in white."""
    frame = np.full((FIELD_HEIGHT, FIELD_WIDTH, 3), 24, np.uint8)
    row, col = CENTRE
    frame[row - 6 : row + 7, col, :] = frame[row, col - 6 : col + 7, :] = 110
    row, col = position
    frame[row - DOT_RADIUS : row + DOT_RADIUS + 1, col - DOT_RADIUS : col + DOT_RADIUS + 1, :] = 255
    return frame


def move(positions, actions):
    """Where the dot is after `actions` from `positions` (..., 2): one pixel, stopped at the border. What the
    environment steps with, and what makes the next observation of a labelled step (the reward model's progress form)."""
    return np.clip(positions + MOVES[actions], LOW, HIGH)


class MovingDotEnv(gym.Env):
    """A dot starts at a random position and should move to the centre. Reward +1 for a step that brings it closer
    (Euclidean distance), -1 for one that takes it further, 0 otherwise (staying, or pushing against the border).
    Episodes last --episode-steps steps (2000 by default; make_env's TimeLimit); there is no termination."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(self, observation="position", render_mode=None):
        if observation not in ("position", "pixels"):
            raise ValueError(f"observation must be 'position' or 'pixels', not {observation!r}")
        self.observation, self.render_mode = observation, render_mode
        self.action_space = gym.spaces.Discrete(len(MOVES))
        if observation == "position":
            self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        else:
            shape = (1, FIELD_HEIGHT // PIXEL_SCALE, FIELD_WIDTH // PIXEL_SCALE)
            self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.position = CENTRE.copy()

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.np_random.integers(LOW, HIGH + 1)
        return observe(self.position, self.observation), {}

    def step(self, action):
        before = np.linalg.norm(self.position - CENTRE)
        self.position = move(self.position, action)
        reward = float(np.sign(before - np.linalg.norm(self.position - CENTRE)))
        return observe(self.position, self.observation), reward, False, False, {}

    def render(self):
        return render_frame(self.position)


if "MovingDot-v0" not in gym.registry:
    gym.register("MovingDot-v0", entry_point=MovingDotEnv, max_episode_steps=2000)


def fill_runtime_fields(args: Args) -> None:
    """Compute the fields Args leaves to run time (batch sizes, iteration counts) from the settings; impossible
    settings are left for validate_args to report."""
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // max(args.num_minibatches, 1)
    args.num_iterations = args.total_timesteps // max(args.batch_size, 1)
    rlhf = args.feedback != "true-reward"
    args.pretrain_iterations = math.ceil(args.pretrain_steps / max(args.batch_size, 1)) if rlhf else 0
    if args.reward_form is None:
        args.reward_form = "progress" if args.observation == "pixels" else "action"


def fewest_segment_starts(num_steps, segment_len, episode_len=None):
    """The fewest steps a segment can start at in one environment's rollout of `num_steps` steps, over every step of an
    episode the rollout can begin at, with episodes of `episode_len` steps (None: no time limit); a segment never
    crosses an episode's end (the dot's episodes all run to the time limit)."""
    if episode_len is None:
        return num_steps - segment_len + 1
    fewest = num_steps
    for offset in range(episode_len):  # the rollout begins `offset` steps into an episode
        starts, left, piece = 0, num_steps, min(num_steps, episode_len - offset)
        while left > 0:
            starts, left = starts + max(0, piece - segment_len + 1), left - piece
            piece = min(episode_len, left)
        fewest = min(fewest, starts)
    return fewest


def flag_list(names):
    """'--a is' or '--a, --b are': argument names as the command line spells them, for an error message."""
    return ", ".join(f"--{name.replace('_', '-')}" for name in names) + (" is" if len(names) == 1 else " are")


def validate_args(args: Args, run_dir=None) -> None:
    """Reject impossible settings with a message (no traceback) before anything is created; changes nothing."""
    for flag in ("num_envs", "num_steps", "num_minibatches", "update_epochs", "total_timesteps", "episode_steps"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"error: --{flag.replace('_', '-')} must be positive (got {getattr(args, flag)})")
    if args.batch_size % args.num_minibatches:
        raise SystemExit(
            f"error: the batch ({args.num_envs} envs x {args.num_steps} steps = {args.batch_size}) "
            f"must divide into --num-minibatches {args.num_minibatches}"
        )
    if args.norm_adv and args.minibatch_size < 2:  # one step's advantage has no std: a NaN update
        raise SystemExit(
            f"error: --num-minibatches {args.num_minibatches} makes minibatches of 1 step: --norm-adv needs 2 or more "
            "(fewer --num-minibatches, or --no-norm-adv)"
        )
    if args.num_iterations <= args.pretrain_iterations:
        raise SystemExit(
            f"error: --total-timesteps {args.total_timesteps} leaves no RL after {args.pretrain_iterations} "
            f"pretraining rollouts of {args.batch_size} steps; use at least "
            f"{(args.pretrain_iterations + 1) * args.batch_size}"
        )
    if args.offline and args.feedback != "synthetic":
        raise SystemExit("error: --offline labels its database with the synthetic teacher; use it with --feedback synthetic")
    if args.preference_db and not args.offline:
        raise SystemExit("error: --preference-db is the database of --offline; add --offline")
    if args.preference_db:
        folder = os.path.dirname(args.preference_db)
        if folder and not os.path.isdir(folder):
            raise SystemExit(f"error: --preference-db {args.preference_db}: no folder {folder}")
        if os.path.isfile(args.preference_db) and os.path.getsize(args.preference_db):  # an empty file becomes one
            with open(args.preference_db, "rb") as database:
                if database.read(16) != b"SQLite format 3\x00":
                    raise SystemExit(f"error: --preference-db {args.preference_db} is not an SQLite database")
            recorded = PreferenceDatabase.recorded_teacher(args.preference_db)
            if recorded is not None:
                refuse_another_teacher(args.preference_db, recorded, {name: getattr(args, name) for name in TEACHER_FLAGS})
    if args.offline and args.teacher_skip_threshold > float("-inf"):
        raise SystemExit(
            "error: --offline labels every pair before RL; a skipping teacher would leave pairs to be asked again during "
            "RL, of the RL policy's segments, into the database: drop --teacher-skip-threshold"
        )
    not_numbers = [f"--{name.replace('_', '-')}" for name, value in vars(args).items() if value != value]  # nan only
    if not_numbers:
        raise SystemExit(f"error: {', '.join(not_numbers)} must be a number, not nan")
    if args.threads < 1 or not 0 <= args.seed < 2**32:
        raise SystemExit(f"error: --threads must be positive and --seed in [0, 2**32 - 1] (got {args.threads}, {args.seed})")
    if not 0 < args.learning_rate < math.inf or min(args.checkpoint_every, args.eval_episodes) < 1:
        raise SystemExit("error: --learning-rate (finite), --checkpoint-every and --eval-episodes must be positive")
    if args.checkpoint_every != Args.checkpoint_every and not (args.save_model or args.resume):
        raise SystemExit("error: --checkpoint-every is for --save-model (no checkpoint is written without it)")
    if args.eval_episodes != Args.eval_episodes and not args.eval_only:  # a training run evaluates nothing
        raise SystemExit("error: --eval-episodes is for --eval-only")
    new_preference_run = args.feedback != "true-reward" and not args.resume  # (a true-reward run reads none of these)
    if args.candidate_multiplier != Args.candidate_multiplier and args.selection != "variance" and new_preference_run:
        raise SystemExit("error: --candidate-multiplier is for --selection variance (random selection draws no candidates)")
    if not (0 <= args.gamma <= 1 and 0 <= args.gae_lambda <= 1 and args.clip_coef > 0 and args.max_grad_norm > 0):
        raise SystemExit("error: --gamma and --gae-lambda must be in [0, 1], --clip-coef and --max-grad-norm positive")
    # settings that only one kind of teacher reads: given to another, they would be silently ignored (a resumed run's
    # are its own, which it cannot change, but for where its label server is now)
    changed = [name for name, value in vars(args).items() if value != getattr(Args, name)]
    if args.resume:
        changed = [name for name in changed if name in ("label_server", "label_token")]
    human_flags = [name for name in changed if name in ("label_server", "label_token", "instruction", "clip_fps")]
    if args.feedback != "human" and human_flags:
        raise SystemExit(f"error: {flag_list(human_flags)} for --feedback human")
    teacher_flags = [name for name in changed if name.startswith("teacher_")]
    if args.feedback == "human" and teacher_flags:
        raise SystemExit(f"error: {flag_list(teacher_flags)} for the synthetic teacher, not for --feedback human")
    if args.feedback == "true-reward":
        return
    if args.feedback == "human":
        if not args.label_server.startswith(("http://", "https://")):
            raise SystemExit(f"error: --label-server must be an http:// or https:// address (got '{args.label_server}')")
        if not 1 <= args.clip_fps <= 240:
            raise SystemExit("error: --clip-fps must be in [1, 240]")
        if run_dir is not None:
            experiment_name(run_dir)
    if args.labels <= 0:
        raise SystemExit(f"error: --labels must be positive (got {args.labels})")
    if args.pretrain_steps < 1:  # the initial policy's rollouts are where the reward model is first fitted
        raise SystemExit(f"error: --pretrain-steps must be positive (got {args.pretrain_steps})")
    if not 0 < args.schedule_horizon < math.inf:
        raise SystemExit(f"error: --schedule-horizon must be a positive number of steps (got {args.schedule_horizon})")
    if not args.teacher_beta > 0:  # a random teacher is --teacher-epsilon 0.5
        raise SystemExit("error: --teacher-beta must be positive (inf: the teacher always prefers the better clip)")
    if not args.teacher_equal_margin >= 0:
        raise SystemExit("error: --teacher-equal-margin must be at least 0 (0: exact ties only)")
    reward_step_counts = (args.reward_batch_size, args.reward_updates, args.reward_eval_every)
    if not (0 < args.reward_std < math.inf and 0 < args.reward_lr < math.inf) or min(reward_step_counts) < 1:
        raise SystemExit(
            "error: --reward-std, --reward-lr (both finite), --reward-batch-size, --reward-updates and --reward-eval-every "
            "must be positive"
        )
    if not 1 <= args.segment_len <= args.num_steps:
        raise SystemExit(
            f"error: --segment-len {args.segment_len} must be between 1 and the rollout length --num-steps {args.num_steps}"
        )
    if args.segment_len > args.episode_steps:  # a segment never crosses the end of an episode
        raise SystemExit(
            f"error: --segment-len {args.segment_len} is longer than an episode (--episode-steps {args.episode_steps})"
        )
    if not 0 < args.pretrain_fraction <= 1:
        raise SystemExit("error: --pretrain-fraction must be in (0, 1]")
    if args.ensemble_size < 1 or args.candidate_multiplier < 1 or args.pretrain_epochs < 1:
        raise SystemExit("error: --ensemble-size, --candidate-multiplier and --pretrain-epochs must be positive")
    if args.selection == "variance" and args.ensemble_size < 2 and not (args.offline or args.resume):  # (offline: random)
        raise SystemExit("error: --selection variance needs --ensemble-size 2 or more (or --selection random)")
    if not 0 <= args.label_noise < 1 or not 0 <= args.teacher_epsilon <= 1 or not 0 < args.teacher_gamma <= 1:
        raise SystemExit("error: --label-noise must be in [0, 1), --teacher-epsilon in [0, 1], --teacher-gamma in (0, 1]")
    # (B-Pref's margin compares the plain sums, whatever --teacher-gamma; a step's true reward is -1, 0 or 1)
    if args.teacher_equal_margin >= 2 * args.segment_len and not args.resume:
        raise SystemExit(
            f"error: --teacher-equal-margin {args.teacher_equal_margin:g} makes every answer equal: two "
            f"{args.segment_len}-step segments' true returns differ by at most {2 * args.segment_len}"
        )
    # a rollout holds this many pairs of distinct segments (sample_segments draws without repeats while it can; the 10x
    # candidates of variance selection, pairs asked in place of skipped ones and offline pairs may repeat a segment;
    # select_pairs redraws the right side of a pair that would show one segment twice)
    per_iteration = label_schedule(args)
    segments = args.num_envs * fewest_segment_starts(args.num_steps, args.segment_len, args.episode_steps)
    capacity, within = segments // 2, f" (episodes of {args.episode_steps} steps)"
    if args.offline and segments < 2 and not args.resume:  # its pairs may repeat a segment, but need two
        raise SystemExit(
            f"error: --offline needs two {args.segment_len}-step segments in a rollout, and one can hold as few as "
            f"{segments} segments{within}. Use a shorter --segment-len or a longer rollout."
        )
    if not args.offline and per_iteration.max() > capacity:
        peak_in_pretraining = per_iteration.argmax() < args.pretrain_iterations
        where, longer = ("a pretraining", "--pretrain-steps") if peak_in_pretraining else ("an RL", "--total-timesteps")
        raise SystemExit(
            f"error: --labels {args.labels} is too large for this run: a rollout can hold as few as {capacity} pairs of "
            f"{args.segment_len}-step segments{within}, and the schedule asks for {per_iteration.max()} in {where} "
            f"rollout. Use fewer labels, a shorter --segment-len, more {longer}, or a longer rollout."
        )


# RLHF: C17 A.1 label schedule
def label_schedule(args: Args) -> np.ndarray:
    """Labels to query after each iteration's rollout: `pretrain_fraction` of the budget (at least 1: the reward model
    is fitted on them before RL starts) spread over the initial policy's rollouts, the rest at a rate proportional to
    horizon / (T + horizon), T = steps so far. Sums exactly to args.labels, whatever --total-timesteps is. The
    offline variant (the blog's) asks every label from the initial policy, before RL."""
    per_iteration = np.zeros(args.num_iterations, dtype=np.int64)
    pretrain = args.labels if args.offline else min(args.labels, max(1, round(args.labels * args.pretrain_fraction)))
    per_iteration[: args.pretrain_iterations] = np.diff(np.round(np.linspace(0, pretrain, args.pretrain_iterations + 1)))
    if args.offline:
        return per_iteration
    steps_so_far = np.arange(args.pretrain_iterations + 1, args.num_iterations + 1) * args.batch_size
    rate = args.schedule_horizon / (steps_so_far + args.schedule_horizon)
    cumulative = np.round((args.labels - pretrain) * np.cumsum(rate) / rate.sum())
    per_iteration[args.pretrain_iterations :] = np.diff(cumulative, prepend=0)
    return per_iteration


class RecordEpisodeVideo(gym.Wrapper):
    """Saves episodes 0, 1, 8, 27, ... (cubes, then every 1000th) as MP4 with imageio."""

    def __init__(self, env, folder):
        super().__init__(env)
        self.folder, self.episode, self.frames = folder, -1, None
        os.makedirs(folder, exist_ok=True)

    def reset(self, **kwargs):
        self._flush()
        obs, info = self.env.reset(**kwargs)
        self.renumber(self.episode + 1)
        return obs, info

    def renumber(self, episode, record=True):
        """Call the episode under way `episode` and, if its number is one to save and `record`, record it from this
        frame on. --resume uses it so that a resumed run's videos follow the earlier ones instead of replacing them."""
        cube = round(episode ** (1 / 3)) ** 3 == episode
        self.episode = episode
        self.frames = [self.env.render()] if record and ((cube and episode < 1000) or episode % 1000 == 0) else None

    def step(self, action):
        result = self.env.step(action)
        if self.frames is not None:
            self.frames.append(self.env.render())
        return result

    def video_path(self, episode):
        return f"{self.folder}/episode-{episode}.mp4"

    def _flush(self):
        if self.frames:
            fps = self.env.metadata["render_fps"]
            imageio.mimsave(self.video_path(self.episode), self.frames, fps=fps, macro_block_size=1)
        self.frames = None

    def close(self):
        self._flush()
        super().close()


def make_env(observation, episode_steps, idx, capture_video, run_dir):
    def thunk():
        env = gym.make("MovingDot-v0", observation=observation, render_mode="rgb_array", max_episode_steps=episode_steps)
        if capture_video and idx == 0:
            env = RecordEpisodeVideo(env, f"{run_dir}/videos")
        env = gym.wrappers.RecordEpisodeStatistics(env)  # charts/episodic_return is the true return
        return env

    return thunk


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def as_input(obs):
    """Network input: positions as they are, frames scaled from uint8 to [0, 1]."""
    return obs.float() / 255.0 if obs.dtype == torch.uint8 else obs


def conv_features(obs_shape):
    """The agent's small CNN for the 42x32 frames, flattened: (module, output size)."""
    conv = nn.Sequential(
        layer_init(nn.Conv2d(obs_shape[0], 16, 3, stride=2)),
        nn.ReLU(),
        layer_init(nn.Conv2d(16, 16, 3, stride=2)),
        nn.ReLU(),
        nn.Flatten(),
    )
    with torch.no_grad():
        return conv, conv(torch.zeros(1, *obs_shape)).shape[1]


class Agent(nn.Module):
    """Actor and critic over one shared torso: 2 x 64 tanh for positions, the small CNN + 64 ReLU units for frames."""

    def __init__(self, obs_shape, num_actions):
        super().__init__()
        if len(obs_shape) == 1:
            self.network = nn.Sequential(
                layer_init(nn.Linear(obs_shape[0], 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh()
            )
        else:
            conv, size = conv_features(obs_shape)
            self.network = nn.Sequential(conv, layer_init(nn.Linear(size, 64)), nn.ReLU())
        self.actor = layer_init(nn.Linear(64, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(64, 1), std=1.0)

    def get_value(self, x):
        return self.critic(self.network(as_input(x)))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(as_input(x))
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


# PPO change (README "Changes to PPO"): the time limit cuts an episode that could go on, so its last step is bootstrapped
@torch.no_grad()
def truncation_values(agent, infos, truncated, device):
    """The critic's value of the state each environment's episode was cut at by the time limit in this step (0
    elsewhere; the vector env resets in the same step and keeps the cut state in infos["final_obs"])."""
    values = np.zeros(len(truncated), np.float32)
    cut = infos["_final_obs"] & truncated if "final_obs" in infos else np.zeros(len(truncated), bool)
    if cut.any():
        final_obs = torch.as_tensor(np.stack(infos["final_obs"][cut])).to(device)
        values[cut] = agent.get_value(final_obs).flatten().cpu().numpy()
    return values


# RLHF: the reward model (C17 2.2.3, A.1 for positions; for frames keypoints in place of A.2's CNN: README "The moving dot")
def map_coordinates(conv, obs_shape):
    """The (row, column) in [-1, 1] of each position of `conv`'s output maps for frames of `obs_shape`: (positions, 2)."""
    with torch.no_grad():
        height, width = conv(torch.zeros(1, *obs_shape)).shape[2:]
    rows, cols = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
    return torch.stack([rows.flatten(), cols.flatten()], 1)


class Keypoints(nn.Module):
    """Frames to a few coordinates: a 3x3 convolution (stride 2) makes `channels` feature maps, and each map gives the
    expected (row, column) of a softmax over its positions, in [-1, 1] (a spatial soft-argmax). The softmax's
    inverse temperature (its scale) is learned per map, starting sharp enough (10) that a bright dot stands out of an empty
    field."""

    def __init__(self, obs_shape, channels=8):
        super().__init__()
        self.conv = nn.Conv2d(obs_shape[0], channels, 3, stride=2, padding=1)
        self.log_temperature = nn.Parameter(torch.full((channels, 1), math.log(10.0)))
        self.register_buffer("grid", map_coordinates(self.conv, obs_shape))
        self.size = 2 * channels

    def forward(self, frames):
        maps = self.conv(frames).flatten(2)  # (n, channels, positions)
        weights = torch.softmax(maps * self.log_temperature.exp(), -1)
        return (weights @ self.grid).flatten(1)  # (n, 2 * channels)


class CentroidKeypoints(nn.Module):
    """Frames to a few coordinates that move with a one-pixel step (what a difference f(o') - f(o) needs): the
    centroid of each squared map of a bias-free 3x3 convolution (stride 2), in [-1, 1]; the empty field adds nothing
    to it, and a map is never all zero where the dot is (as a rectified one can be). Not smooth everywhere: a
    coordinate can step back by a little as the dot crosses a cell, and a dot in the last cells at the bottom and
    right borders reaches only the map's last row (column), so the coordinates stop there and f sees no move
    (benchmark/notes/moving_dot_issue24.md, sixth session)."""

    def __init__(self, obs_shape, channels=8):
        super().__init__()
        self.conv = nn.Conv2d(obs_shape[0], channels, 3, stride=2, padding=1, bias=False)
        self.register_buffer("grid", map_coordinates(self.conv, obs_shape))
        self.size = 2 * channels

    def forward(self, frames):
        maps = self.conv(frames).flatten(2) ** 2  # (n, channels, positions)
        return (maps / (maps.sum(-1, keepdim=True) + 1e-6) @ self.grid).flatten(1)  # (n, 2 * channels)


class RewardNet(nn.Module):
    """r(observation, action) with leaky ReLU: an MLP 2 x 64 over (features, one-hot action), where the features are
    the position (C17 A.1) or, for frames, the frame's keypoints (a CNN of C17 A.2's shape overfitted the pretraining
    labels: README "The moving dot"). In the progress form the MLP scores the features alone, f(o), and a step's
    reward is f(next observation) - f(observation)."""

    def __init__(self, obs_shape, num_actions, progress=False):
        super().__init__()
        self.num_actions, self.progress = num_actions, progress
        if len(obs_shape) == 1:
            self.features = nn.Flatten()
        else:
            self.features = CentroidKeypoints(obs_shape) if progress else Keypoints(obs_shape)
        size = (obs_shape[0] if len(obs_shape) == 1 else self.features.size) + (0 if progress else num_actions)
        self.head = nn.Sequential(
            nn.Linear(size, 64), nn.LeakyReLU(0.01), nn.Linear(64, 64), nn.LeakyReLU(0.01), nn.Linear(64, 1)
        )

    def forward(self, obs, act, next_obs):
        """(n, *obs_shape), (n,) action indices, (n, *obs_shape) -> (n,)"""
        if self.progress:
            return (self.head(self.features(as_input(next_obs))) - self.head(self.features(as_input(obs)))).squeeze(-1)
        one_hot = nn.functional.one_hot(act.long(), self.num_actions).float()
        return self.head(torch.cat([self.features(as_input(obs)), one_hot], -1)).squeeze(-1)


class RewardEnsemble(nn.Module):
    """`size` independent RewardNets; each normalised separately, then averaged and scaled to zero mean and a fixed
    standard deviation (C17 2.2.1, A)."""

    def __init__(self, obs_shape, num_actions, size=3, progress=False):
        super().__init__()
        self.members = nn.ModuleList(RewardNet(obs_shape, num_actions, progress) for _ in range(size))
        self.register_buffer("member_mean", torch.zeros(size))
        self.register_buffer("member_std", torch.ones(size))
        self.register_buffer("ensemble_mean", torch.zeros(()))
        self.register_buffer("ensemble_std", torch.ones(()))
        self.size = size

    def forward(self, obs, act, next_obs):
        """Raw reward of each member: (..., *obs_shape), (...), (..., *obs_shape) -> (size, ...)."""
        lead = act.shape
        obs, act = obs.reshape(-1, *obs.shape[len(lead) :]), act.reshape(-1)
        next_obs = next_obs.reshape(obs.shape)
        return torch.stack([member(obs, act, next_obs) for member in self.members]).reshape(self.size, *lead)

    def l2_penalty(self):
        """Sum of squared weights (biases excluded) of each member: (size,)."""
        return torch.stack([sum((p**2).sum() for n, p in m.named_parameters() if "weight" in n) for m in self.members])

    @torch.no_grad()
    def fit_normalization(self, raw, target_std=1.0):
        """Set the normalisation from raw member rewards (size, n) of the steps the teacher has judged."""
        if raw.shape[1] < 2:  # no spread to measure yet: keep the normalisation as it is
            return
        self.member_mean.copy_(raw.mean(1))
        self.member_std.copy_(raw.std(1) + 1e-8)
        averaged = ((raw - self.member_mean[:, None]) / self.member_std[:, None]).mean(0)
        self.ensemble_mean.copy_(averaged.mean())
        self.ensemble_std.copy_((averaged.std() + 1e-8) / target_std)

    @torch.no_grad()
    def normalized_reward(self, obs, act, next_obs):
        """The reward PPO optimises: members normalised, averaged, scaled to zero mean and the target std."""
        raw = self(obs, act, next_obs)
        shape = (self.size,) + (1,) * (raw.dim() - 1)
        averaged = ((raw - self.member_mean.view(shape)) / self.member_std.view(shape)).mean(0)
        return (averaged - self.ensemble_mean) / self.ensemble_std


def reward_inputs(positions, act, observation):
    """What the reward model sees of steps given by dot positions (..., 2) and actions (...): the observation, the
    action and the next observation, as tensors (frames are made here, so labels store only positions)."""
    return (
        torch.as_tensor(observe(positions, observation)),
        torch.as_tensor(act),
        torch.as_tensor(observe(move(positions, act), observation)),
    )


def preference_loss(returns_left, returns_right, mu, label_noise=0.1):
    """C17 2.2.3 Bradley-Terry cross-entropy. P[left > right] = softmax over summed rewards, mixed with a
    `label_noise` chance of a uniformly random answer; mu = 1 left preferred, 0 right, 0.5 equal. Computed in log
    space: with --label-noise 0 a sure model's sigmoid rounds to 1, and log(1 - 1) made the loss and its gradient NaN."""
    margin = returns_left - returns_right
    log_sure = math.log1p(-label_noise)
    log_random = torch.tensor(label_noise / 2, dtype=margin.dtype, device=margin.device).log()  # -inf without noise
    log_p_left = torch.logaddexp(log_sure + nn.functional.logsigmoid(margin), log_random)
    log_p_right = torch.logaddexp(log_sure + nn.functional.logsigmoid(-margin), log_random)
    return -(mu * log_p_left + (1 - mu) * log_p_right)


# RLHF: segments and pair selection (C17 2.2.4). A segment is its dot positions, actions and true rewards; the
# observations the reward model sees are made from the positions (observe), so labels stay small in pixel mode too.
SEGMENT_KEYS = ("position", "act", "true_reward")
SEGMENT_DTYPES = {"position": np.int16, "act": np.int64, "true_reward": np.float32}
SEGMENT_SHAPES = {"position": (2,), "act": (), "true_reward": ()}  # per step


def segment_returns(ensemble, segments, observation):
    """Each member's undiscounted predicted return of each segment: (size, ...)."""
    return ensemble(*reward_inputs(segments["position"], segments["act"], observation)).sum(-1)


def sample_segments(rng, rollout, segment_len, count):
    """Draw `count` segments of `segment_len` steps from a rollout (arrays shaped (steps, envs, ...)); a segment
    never crosses the end of an episode."""
    position, act, true_reward, truncated = rollout["position"], rollout["act"], rollout["true_reward"], rollout["truncated"]
    num_steps, num_envs = true_reward.shape
    ends_before = np.concatenate([np.zeros((1, num_envs), int), np.cumsum(truncated, 0)])  # episode ends before step t
    starts = np.arange(num_steps - segment_len + 1)
    # an episode end at any step but the segment's last would split it
    valid = ends_before[starts + segment_len - 1] == ends_before[starts]
    valid_t, valid_e = np.nonzero(valid)
    if len(valid_t) == 0:
        raise RuntimeError("no valid segment in the rollout: use a shorter --segment-len")
    pick = rng.choice(len(valid_t), size=count, replace=count > len(valid_t))
    t = valid_t[pick, None] + np.arange(segment_len)
    e = np.broadcast_to(valid_e[pick, None], t.shape)
    return {"position": position[t, e], "act": act[t, e], "true_reward": true_reward[t, e]}


def index_segments(segments, idx):
    return {k: v[idx] for k, v in segments.items()}


def select_pairs(rng, ensemble, observation, rollout, segment_len, num_pairs, multiplier, selection):
    """C17 2.2.4: draw `multiplier` x more candidate pairs than needed and keep those whose predicted preference
    varies most across the ensemble members (or a random subset for --selection random)."""
    num_candidates = num_pairs * (multiplier if selection == "variance" else 1)
    left = sample_segments(rng, rollout, segment_len, num_candidates)
    right = sample_segments(rng, rollout, segment_len, num_candidates)
    if selection == "variance":
        scores = disagreement(ensemble, observation, left, right)
        chosen = np.argsort(-scores, kind="stable")[:num_pairs]
    else:
        chosen = np.arange(num_pairs)
    left, right = index_segments(left, chosen), index_segments(right, chosen)
    for _ in range(3):  # the sides are drawn apart: a pair that would show one clip twice gets another right side
        same_clip = [(left[k] == right[k]).reshape(num_pairs, -1).all(1) for k in ("position", "act")]
        same = np.flatnonzero(np.all(same_clip, 0))
        if len(same) == 0:
            break
        redrawn = sample_segments(rng, rollout, segment_len, len(same))
        for key in right:
            right[key][same] = redrawn[key]
    return left, right


@torch.no_grad()
def disagreement(ensemble, observation, left, right):
    """Variance across members of each member's P[left > right]."""
    returns_left = segment_returns(ensemble, left, observation)
    returns_right = segment_returns(ensemble, right, observation)
    return torch.sigmoid(returns_left - returns_right).var(0, unbiased=False).numpy()


def stack_segments(segments):
    """A list of single segments (dicts of arrays) -> one dict of arrays with a leading batch axis."""
    return {k: np.stack([s[k] for s in segments]) for k in segments[0]}


# RLHF: the synthetic teacher, and the interface every teacher has
class SyntheticTeacher:
    """Prefers the segment with more true reward, i.e. the one that brought the dot closer to the centre (the blog's
    heuristic; equal movement is a tie), optionally with the noise of B-Pref's simulated teachers (Lee et al. 2021).

    Every teacher has this interface (the methods to write for a new one, e.g. a scripted function of two segments;
    the training loop never asks which teacher it has, make_teacher builds it):
        start() -> teacher       begin answering (a synthetic teacher needs nothing)
        ask(left, right)         queue pairs: two dicts of segments (SEGMENT_KEYS, a leading pair axis)
        poll()                   the pairs answered since the last poll, as [(left, right, mu), ...]: mu = 1 left
                                 better, 0 right better, 0.5 equal; a pair the teacher skips is never handed over (it
                                 is no label: the schedule asks a new one in its place)
        pending                  pairs asked and not yet handed over by poll() (they count as on their way)
        wait_for_answers(stop)   block until every asked pair is answered (True) or the threading.Event `stop` is set
                                 or the teacher fails (False); a synthetic teacher answers when asked
        save(), load(consumed_seq_in_labels)
                                 keep the unanswered pairs of a stopped run for --resume (nothing to keep here)
        consumed_seq             the label server's number of the last answer poll() handed over, saved with the
                                 labels (0: no server)
        failure                  why the teacher cannot go on (None: it can); the run then stops as at Ctrl-C, saves,
                                 and exits with it
        close()                  stop answering
    """

    pending = 0  # it answers when asked: nothing is ever on its way
    consumed_seq = 0  # no label server
    failure = None  # it always answers

    def __init__(self, rng, beta=float("inf"), gamma=1.0, epsilon=0.0, skip_threshold=float("-inf"), equal_margin=0.0):
        self.rng, self.beta, self.gamma, self.epsilon = rng, beta, gamma, epsilon
        self.skip_threshold, self.equal_margin = skip_threshold, equal_margin
        self.answered = []

    def preferences(self, true_left, true_right):
        """mu for each pair of true-reward sequences (n, L); NaN where the teacher skips (both returns below
        --teacher-skip-threshold); 0.5 for returns within --teacher-equal-margin."""
        segment_len = true_left.shape[1]
        weights = self.gamma ** np.arange(segment_len - 1, -1, -1)  # myopic: recent steps weigh more
        return_left, return_right = true_left @ weights, true_right @ weights
        diff = return_left - return_right
        if math.isinf(self.beta):
            mu = (diff > 0).astype(np.float64)
        else:
            p_left = 1 / (1 + np.exp(-np.clip(self.beta * diff, -50, 50)))
            mu = (self.rng.random(len(diff)) < p_left).astype(np.float64)
        mistakes = self.rng.random(len(diff)) < self.epsilon
        mu = np.where(mistakes, 1 - mu, mu)
        # as in B-Pref, the equal margin and the skip threshold compare the plain sums, not the myopic ones
        sum_left, sum_right = true_left @ np.ones(segment_len), true_right @ np.ones(segment_len)  # = the returns at gamma 1
        mu = np.where(np.abs(sum_left - sum_right) <= self.equal_margin, 0.5, mu)
        return np.where(np.maximum(sum_left, sum_right) < self.skip_threshold, np.nan, mu)

    def start(self):
        return self

    def ask(self, left, right):
        mu = self.preferences(left["true_reward"], right["true_reward"])
        not_skipped = ~np.isnan(mu)
        self.answered.append((index_segments(left, not_skipped), index_segments(right, not_skipped), mu[not_skipped]))

    def poll(self):
        answered, self.answered = self.answered, []
        return answered

    def wait_for_answers(self, stop):
        return True

    def save(self):
        pass

    def load(self, consumed_seq_in_labels=0):
        pass

    def close(self, run_finished=False):
        pass


# RLHF: the labels, with each member's bootstrap weights and validation split (C17 2.2.3)
class LabelBuffer:
    """Preference labels of the run. Each label gets a Poisson(1) weight per member, the online form of a bootstrap
    resample of the labels; the labels a member's resample leaves out (weight 0, probability 1/e: C17's "1/e held
    out") are its validation set (`is_val`). Grows past `capacity` rather than drop a label."""

    def __init__(self, capacity, segment_len, ensemble_size, rng):
        self.rng, self.size = rng, 0
        shape = (capacity, 2, segment_len)
        self.data = {k: np.zeros(shape + SEGMENT_SHAPES[k], SEGMENT_DTYPES[k]) for k in SEGMENT_KEYS}
        self.data |= {
            "mu": np.zeros(capacity, np.float32),
            "is_val": np.zeros((capacity, ensemble_size), bool),
            "weight": np.zeros((capacity, ensemble_size), np.float32),
        }

    def add(self, left, right, mu):
        n, members = len(mu), self.data["is_val"].shape[1]
        self._make_room(self.size + n)
        new = slice(self.size, self.size + n)
        for key in SEGMENT_KEYS:
            self.data[key][new, 0], self.data[key][new, 1] = left[key], right[key]
        self.data["mu"][new] = mu
        self.data["weight"][new] = self.rng.poisson(1.0, (n, members))
        self.data["is_val"][new] = self.data["weight"][new] == 0  # out of bag: what the member never trains on
        self.size += n
        return n

    def _make_room(self, size):
        """Grow the arrays to hold `size` labels: a label is never dropped (e.g. answers saved after the checkpoint
        a run resumes from)."""
        capacity = len(self.data["mu"])
        if size > capacity:
            capacity = max(size, 2 * capacity)
            for k, v in self.data.items():
                self.data[k] = np.concatenate([v[: self.size], np.zeros((capacity - self.size,) + v.shape[1:], v.dtype)])

    def get(self, idx=None):
        """The labels (all, or those at `idx`) as numpy arrays: segments in `position`/`act` (n, 2, L, ...)."""
        idx = slice(0, self.size) if idx is None else idx
        return {k: v[idx] for k, v in self.data.items()}

    def save(self, path, consumed_seq=0):
        """The labels, and the label server's number of the last answer among them (human feedback; see load)."""
        tmp = path + ".tmp.npz"
        np.savez_compressed(tmp, consumed_seq=consumed_seq, **{k: v[: self.size] for k, v in self.data.items()})
        os.replace(tmp, path)  # atomic: a run killed while saving keeps the previous file

    def load(self, path):
        """Returns the label server's number of the last answer among the labels (0: none, or a file saved before
        it was kept)."""
        with np.load(path) as saved:
            n = len(saved["mu"])
            self._make_room(n)
            for k in self.data:
                self.data[k][:n] = saved[k]
            consumed_seq = int(saved["consumed_seq"]) if "consumed_seq" in saved else 0
        self.size = n
        return consumed_seq


# RLHF, offline variant (the blog's): a preference database of random-policy segment pairs, labelled once
TEACHER_FLAGS = ("teacher_beta", "teacher_gamma", "teacher_epsilon", "teacher_skip_threshold", "teacher_equal_margin")


class PreferenceDatabase:
    """SQLite table of labelled segment pairs: each side's dot positions, actions and true rewards, and the answer;
    beside it the settings of the teacher that answered them (`teacher`: a dict of TEACHER_FLAGS), so that a run with
    another teacher is refused the database instead of taking its answers as its own."""

    def __init__(self, path, teacher=None):
        self.connection = sqlite3.connect(path)
        self.connection.execute(
            "CREATE TABLE IF NOT EXISTS preferences (id INTEGER PRIMARY KEY, segment_len INTEGER NOT NULL, "
            "left_position BLOB, left_act BLOB, left_true_reward BLOB, right_position BLOB, right_act BLOB, "
            "right_true_reward BLOB, mu REAL NOT NULL)"
        )
        self.connection.execute("CREATE TABLE IF NOT EXISTS teacher (settings TEXT NOT NULL)")
        self.connection.commit()
        if teacher is not None:
            self.check_teacher(path, teacher)

    def check_teacher(self, path, teacher):
        row = self.connection.execute("SELECT settings FROM teacher").fetchone()
        if row is None:  # a new database (or one from before the teacher was recorded: its pairs are taken as this one's)
            with self.connection:
                self.connection.execute("INSERT INTO teacher VALUES (?)", (json.dumps(teacher),))
            return
        refuse_another_teacher(path, json.loads(row[0]), teacher)

    @staticmethod
    def recorded_teacher(path):
        """The teacher settings recorded in the database at `path`, read without changing it (None: none yet)."""
        connection = sqlite3.connect(f"{pathlib.Path(path).resolve().as_uri()}?mode=ro", uri=True)
        try:
            row = connection.execute("SELECT settings FROM teacher").fetchone()
        except sqlite3.OperationalError:  # no teacher table: a database from before the teacher was recorded
            row = None
        finally:
            connection.close()
        return None if row is None else json.loads(row[0])

    def count(self, segment_len):
        return self.connection.execute("SELECT COUNT(*) FROM preferences WHERE segment_len = ?", (segment_len,)).fetchone()[0]

    def add(self, left, right, mu):
        rows = [
            (left["act"].shape[1],)
            + tuple(np.asarray(side[k][i], SEGMENT_DTYPES[k]).tobytes() for side in (left, right) for k in SEGMENT_KEYS)
            + (float(m),)
            for i, m in enumerate(mu)
        ]
        with self.connection:  # one transaction: all of them or none
            self.connection.executemany("INSERT INTO preferences VALUES (NULL, ?, ?, ?, ?, ?, ?, ?, ?)", rows)

    def load(self, segment_len, limit):
        """The first `limit` pairs of this segment length as (left, right, mu)."""
        rows = self.connection.execute(
            "SELECT left_position, left_act, left_true_reward, right_position, right_act, right_true_reward, mu "
            "FROM preferences WHERE segment_len = ? ORDER BY id LIMIT ?",
            (segment_len, limit),
        ).fetchall()
        sides = []
        for offset in (0, 3):
            sides.append(
                {
                    k: np.stack(
                        [np.frombuffer(row[offset + j], SEGMENT_DTYPES[k]).reshape(-1, *SEGMENT_SHAPES[k]) for row in rows]
                    )
                    for j, k in enumerate(SEGMENT_KEYS)
                }
            )
        return sides[0], sides[1], np.array([row[6] for row in rows])

    def close(self):
        self.connection.close()


def refuse_another_teacher(path, recorded, teacher):
    """Stops the run if the preference database at `path` was labelled by a teacher with other settings."""
    differ = [name for name in teacher if recorded.get(name) != teacher[name]]
    if differ:
        theirs = ", ".join(f"--{name.replace('_', '-')} {recorded.get(name)}" for name in differ)
        ours = ", ".join(f"--{name.replace('_', '-')} {teacher[name]}" for name in differ)
        raise SystemExit(
            f"error: {path} was labelled by a teacher with {theirs}; this run's teacher has {ours}: use another "
            "--preference-db, or the database's teacher flags"
        )


# RLHF: training the reward model (C17 2.2.3)
@torch.no_grad()
def label_step_rewards(ensemble, labels, observation, chunk=256):
    """Raw step rewards of each member for every step of the labelled segments: (size, n, 2, L), in chunks of labels
    (pixel observations are made on the fly)."""
    parts = []
    for start in range(0, len(labels["mu"]), chunk):
        chunk_labels = slice(start, start + chunk)
        parts.append(ensemble(*reward_inputs(labels["position"][chunk_labels], labels["act"][chunk_labels], observation)))
    return torch.cat(parts, 1) if parts else torch.zeros((ensemble.size,) + labels["act"].shape)


def sample_minibatches(buffer, steps, batch_size, rng):
    """`steps` random minibatches of labels, copied out of the buffer (buffer.get at random indices copies); none
    from an empty buffer."""
    if buffer.size == 0:
        return []
    return [buffer.get(rng.integers(0, buffer.size, min(batch_size, buffer.size))) for _ in range(steps)]


def reward_gradient_step(ensemble, optimizer, minibatch, observation, l2_coef, label_noise):
    """One Adam step on a minibatch of labels; each member's loss uses its own bootstrap weights."""
    returns = segment_returns(ensemble, minibatch, observation)  # (members, batch, 2)
    losses = preference_loss(returns[..., 0], returns[..., 1], torch.as_tensor(minibatch["mu"]), label_noise)
    weight = torch.as_tensor(minibatch["weight"]).T  # (members, batch)
    member_loss = (losses * weight).sum(1) / weight.sum(1).clamp(min=1.0)
    loss = (member_loss + l2_coef * ensemble.l2_penalty()).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train_reward_model(ensemble, optimizer, buffer, observation, l2_coef, steps, batch_size, label_noise, rng):
    """`steps` Adam steps on random minibatches of labels, in the calling thread (a run trains in RewardModelTraining;
    tests and benchmark tools call this)."""
    for minibatch in sample_minibatches(buffer, steps, batch_size, rng):
        reward_gradient_step(ensemble, optimizer, minibatch, observation, l2_coef, label_noise)


def validate_reward_model(step_rewards, labels, label_noise):
    """Each member's training loss (the bootstrap-weighted loss it is trained on) and validation loss (on the labels
    its resample left out), and the share of held-out strict preferences each member orders correctly (averaged over
    members), from the members' step rewards of the labels (label_step_rewards). Changes nothing."""
    returns = step_rewards.sum(-1)  # (members, labels, 2)
    mu = torch.as_tensor(labels["mu"])
    losses = preference_loss(returns[..., 0], returns[..., 1], mu, label_noise)
    weight = torch.as_tensor(labels["weight"]).T  # (members, labels)
    is_val = torch.as_tensor(labels["is_val"]).T.float()
    train_loss = (losses * weight).sum(1) / weight.sum(1)  # NaN for a member whose resample is still empty
    val_loss = (losses * is_val).sum(1) / is_val.sum(1)  # NaN for a member with no held-out label yet
    correct = ((returns[..., 0] > returns[..., 1]).float() == mu).float()
    judged = is_val * (mu != 0.5).float()  # "equal" answers have no right order
    val_accuracy = ((correct * judged).sum(1) / judged.sum(1)).nanmean().item()  # members with held-out strict labels
    return train_loss, val_loss, val_accuracy


def fit_reward_normalization(ensemble, step_rewards, target_std):
    """C17 2.2.1: refit the ensemble's normalisation (of the reward PPO gets) on the steps the teacher has judged, from
    the members' step rewards of the labels (label_step_rewards)."""
    ensemble.fit_normalization(step_rewards.reshape(ensemble.size, -1), target_std)


def copy_labels(buffer):
    """All the labels, copied out of the buffer (buffer.get() gives views of its arrays, which the teacher's answers
    write to): what a validation pass in the thread reads."""
    return {k: v.copy() for k, v in buffer.get().items()}


def adapt_l2(l2_coef, train_loss, val_loss, low=1.1, high=1.5, factor=1.25):
    """C17 2.2.3: keep each member's validation loss between 1.1x and 1.5x its training loss (a NaN loss, no
    held-out or no training label yet, leaves the coefficient as it is)."""
    ratio = val_loss / train_loss.clamp(min=1e-8)
    return torch.where(ratio > high, l2_coef * factor, torch.where(ratio < low, l2_coef / factor, l2_coef))


class RewardModelTraining:
    """The reward model's two copies (RewardEnsembles) and their training, with what it carries from one iteration to
    the next: Adam, each member's L2 coefficient, the rounds so far, the latest validation figures.

    `training_ensemble` trains: before RL on the pretraining labels or the offline database (`train`), during RL
    one round of --reward-updates steps per iteration in a thread of its own (`start_round`), as C17 2.2 fits the
    reward model in parallel with RL; on a machine with a second core the thread hides the reward model's work (the
    frames of --observation pixels are drawn there too). `ensemble` gives PPO its reward and scores candidate pairs;
    it takes the trained weights when the round is done (`finish_round`), so PPO's reward is one round behind. Runs
    stay reproducible: minibatches are drawn in the main thread, the thread never reads the buffer, which the
    teacher's answers write to, and it draws no random number (the reward model has no dropout)."""

    def __init__(self, ensemble, learning_rate):
        self.ensemble = ensemble
        self.training_ensemble = copy.deepcopy(ensemble)
        self.optimizer = optim.Adam(self.training_ensemble.parameters(), lr=learning_rate)
        self.l2_coef = torch.full((ensemble.size,), 1e-4)
        self.rounds = 0  # training rounds so far; every --reward-eval-every-th is followed by a validation pass
        self.train_loss = self.val_loss = torch.full((ensemble.size,), math.nan)
        self.val_accuracy = math.nan
        self.thread = ThreadPoolExecutor(1, "reward-training")
        self.job = None  # the round in progress (a Future)

    def train(self, buffer, rounds, steps_per_round, args, rng, validate_at_end=False):
        """`rounds` rounds of `steps_per_round` Adam steps here and now (pretraining), each --reward-eval-every-th
        (and the last, with `validate_at_end`) followed by a validation pass; then `ensemble` takes the weights."""
        for round_in_call in range(1, rounds + 1):
            self.rounds += 1
            validate = self.rounds % args.reward_eval_every == 0 or (validate_at_end and round_in_call == rounds)
            minibatches = sample_minibatches(buffer, steps_per_round, args.reward_batch_size, rng)
            labels = buffer.get() if validate else None  # read here and now: no copy needed
            self._take_figures(self._round(minibatches, self.l2_coef, labels, args))
        self.ensemble.load_state_dict(self.training_ensemble.state_dict())

    def start_round(self, buffer, args, rng):
        """During RL: start one round of --reward-updates steps in the thread (after the round before it, if any)."""
        self.finish_round()
        self.rounds += 1
        minibatches = sample_minibatches(buffer, args.reward_updates, args.reward_batch_size, rng)
        labels = copy_labels(buffer) if self.rounds % args.reward_eval_every == 0 else None
        self.job = self.thread.submit(self._round, minibatches, self.l2_coef, labels, args)

    def finish_round(self):
        """Wait for the round in progress, if any (its error, if any, is raised here); `ensemble` takes its weights."""
        if self.job is not None:
            figures, self.job = self.job.result(), None
            self._take_figures(figures)
            self.ensemble.load_state_dict(self.training_ensemble.state_dict())

    def _round(self, minibatches, l2_coef, labels, args):
        """Gradient steps, then, given the labels, a validation pass: its figures and the reward normalisation refit."""
        for minibatch in minibatches:
            reward_gradient_step(
                self.training_ensemble, self.optimizer, minibatch, args.observation, l2_coef, args.label_noise
            )
        if labels is None:
            return None
        step_rewards = label_step_rewards(self.training_ensemble, labels, args.observation)  # once: frames are costly
        figures = validate_reward_model(step_rewards, labels, args.label_noise)
        fit_reward_normalization(self.training_ensemble, step_rewards, args.reward_std)
        return figures

    def _take_figures(self, figures):
        """Keep a validation pass's figures (for the log) and adapt the L2 coefficients to them (C17 2.2.3)."""
        if figures is not None:
            self.train_loss, self.val_loss, self.val_accuracy = figures
            self.l2_coef = adapt_l2(self.l2_coef, self.train_loss, self.val_loss)

    def close(self):
        try:
            self.finish_round()  # the last round's weights, or its error: raised, not lost
        finally:
            self.thread.shutdown()

    def state_dict(self):
        """Under the checkpoint keys of earlier versions of this script (`fits`: the training rounds)."""
        self.finish_round()  # what the next iteration would take first: a resumed run goes on exactly
        return {
            "reward_ensemble": self.training_ensemble.state_dict(),
            "reward_optimizer": self.optimizer.state_dict(),
            "l2_coef": self.l2_coef,
            "fits": self.rounds,
            "reward_evaluation": (self.train_loss, self.val_loss, self.val_accuracy),
        }

    def load_state_dict(self, state):
        self.training_ensemble.load_state_dict(state["reward_ensemble"])
        self.ensemble.load_state_dict(state["reward_ensemble"])
        self.optimizer.load_state_dict(state["reward_optimizer"])
        self.l2_coef = state["l2_coef"]
        if "fits" in state:  # checkpoints from before exact resumption have no counters
            self.rounds, (self.train_loss, self.val_loss, self.val_accuracy) = state["fits"], state["reward_evaluation"]


def pretrain_reward_model(reward_training, buffer, args, rng):
    """C17 A.2: --pretrain-epochs epochs on the pretraining labels (offline: the database) before RL starts (each
    epoch as many minibatches as the labels fill, drawn at random with replacement, not a pass over them), then a
    validation pass."""
    epoch_steps = math.ceil(buffer.size / args.reward_batch_size)
    reward_training.train(buffer, args.pretrain_epochs, epoch_steps, args, rng, validate_at_end=True)
    print(
        f"reward model {'fitted' if args.offline else 'pretrained'} on {buffer.size} labels: val accuracy "
        f"{reward_training.val_accuracy:.2f}, train loss {reward_training.train_loss.nanmean():.3f}, "
        f"val loss {reward_training.val_loss.nanmean():.3f}"
    )


# RLHF: ask the teacher, store its answers
def query_labels(rng, ensemble, teacher, buffer, database, rollout, labels_due, selection, args):
    """Ask the teacher for the labels the schedule has due so far, less those held or on their way (a resumed run asks
    nothing twice; pairs the teacher skipped are replaced by new ones), then store every answer received. The
    synthetic teacher answers at once: the pairs it skips are replaced here, from this rollout, until the labels due
    are held or 10 times as many pairs as were lacking have been asked (it skips nearly all of this rollout's);
    people's at the next call."""
    to_ask = labels_due - buffer.size - teacher.pending
    pairs_left = 10 * to_ask
    while to_ask > 0 and pairs_left > 0:
        left, right = select_pairs(
            rng, ensemble, args.observation, rollout, args.segment_len, to_ask, args.candidate_multiplier, selection
        )
        teacher.ask(left, right)
        store_answers(teacher, buffer, database)
        pairs_left -= to_ask
        to_ask = labels_due - buffer.size - teacher.pending  # (people's: on their way, so 0)
    store_answers(teacher, buffer, database)  # answers that came in since the last call (none more after the loop's)


def store_answers(teacher, buffer, database):
    """The teacher's answers into the label buffer (and, offline, into the preference database)."""
    for left, right, mu in teacher.poll():
        buffer.add(left, right, mu)
        if database is not None:
            database.add(left, right, mu)


# RLHF: what the run logs about the learned reward
def finish_episode_returns(rewards, dones, episode_returns):
    """Add a rollout's rewards (steps, envs) to each environment's episode return so far (`episode_returns`, in place);
    returns the returns of the episodes that ended, in order. An episode whose return so far is NaN (it began before
    there were learned rewards) is left out."""
    finished = []
    for t in range(len(rewards)):
        episode_returns += rewards[t]
        finished += [episode_returns[i] for i in np.flatnonzero(dones[t]) if not np.isnan(episode_returns[i])]
        episode_returns[dones[t]] = 0.0
    return finished


def log_reward_model(writer, global_step, reward_training, buffer, teacher, learned_rewards, true_rewards, label_budget):
    """The reward model's figures and the label counts, to TensorBoard; returns them for the progress line. The
    correlation of the learned with the true reward says how well it tracks it (offline: how far the frozen model
    drifts)."""
    constant = learned_rewards.std() == 0 or true_rewards.std() == 0
    correlation = math.nan if constant else np.corrcoef(learned_rewards.ravel(), true_rewards.ravel())[0, 1]
    writer.add_scalar("reward_model/loss", reward_training.train_loss.nanmean().item(), global_step)
    writer.add_scalar("reward_model/val_loss", reward_training.val_loss.nanmean().item(), global_step)
    writer.add_scalar("reward_model/val_accuracy", reward_training.val_accuracy, global_step)
    writer.add_scalar("reward_model/l2", reward_training.l2_coef.mean().item(), global_step)
    writer.add_scalar("reward_model/true_correlation", correlation, global_step)
    writer.add_scalar("labels/total", buffer.size, global_step)
    writer.add_scalar("labels/pending", teacher.pending, global_step)
    return f", labels {buffer.size}/{label_budget}, val acc {reward_training.val_accuracy:.2f}, corr {correlation:.2f}"


# RLHF: the one place that asks which teacher the run has
def make_teacher(args, run_dir, rng):
    """The teacher --feedback names, with SyntheticTeacher's interface."""
    if args.feedback == "synthetic":
        return SyntheticTeacher(
            rng,
            args.teacher_beta,
            args.teacher_gamma,
            args.teacher_epsilon,
            args.teacher_skip_threshold,
            args.teacher_equal_margin,
        )
    teacher = HumanTeacher(run_dir, args.label_server, args.label_token, args.instruction, args.clip_fps)
    print(f"human feedback: pairs go to {args.label_server}/ (experiment {teacher.experiment}); open it in a browser to label")
    return teacher


def no_pretraining_label_error(args: Args, run_dir: str) -> str:
    """The message of a run whose pretraining pairs all went unanswered: RL would start without a reward to learn."""
    if args.feedback == "human":
        why = "people answered 'can't tell' to every pair"
        again = f"--resume {run_dir} asks for them again" if args.save_model else "a new run asks again (no --save-model)"
        fix = f"{again}; a clearer --instruction or a longer --segment-len in a new run may make the clips easier to compare"
    else:
        why = f"the synthetic teacher skipped every pair (both returns below --teacher-skip-threshold {args.teacher_skip_threshold})"
        fix = "start a new run with a lower --teacher-skip-threshold"
    return f"error: pretraining ended with no preference label, so there is no reward to learn: {why}. {fix}"


# =====================================================================================================================
# Infrastructure: the human teacher (C17 appendix B): clips drawn from the segments and sent to label_server.py,
# answers fetched in a background thread. Readers of the synthetic path can skip this block.
# =====================================================================================================================
MU_OF_CHOICE = {"left": 1.0, "right": 0.0, "equal": 0.5}  # "cant_tell" is dropped (C17 2.2.2)
MISSING = object()  # what HumanTeacher._request returns for a 404 where the caller expects one


class HumanTeacher:
    """People answer in a browser, through label_server.py. Same interface as SyntheticTeacher. ask() only queues;
    a background thread draws each pair's clips from the segments' dot positions, uploads them, posts the pair and
    polls for answers, retrying with backoff while the server is down, so training goes on while people label (C17
    2.2: asynchronous). Pairs not yet answered are saved with the run (save/load: {run_dir}/pending_pairs.npz) and
    asked again when it resumes. The run folder's name is the experiment's name on the label server."""

    def __init__(self, run_dir, server, token, instruction, clip_fps=6, poll_interval=2.0, pair_check_interval=30.0):
        self.experiment = experiment_name(run_dir)
        self.path = f"{run_dir}/pending_pairs.npz"
        self.server, self.token = server.rstrip("/"), token
        self.instruction, self.clip_fps, self.poll_interval = instruction, clip_fps, poll_interval
        self.pair_check_interval = pair_check_interval
        self.lock = threading.Lock()
        self.queued = []  # pair ids still to draw, upload and post
        self.waiting = {}  # pair id -> (left, right) segments: asked, not yet answered
        self.answered = []  # (pair id, mu, seq) received, not yet handed over by poll()
        self.next_index = 0  # pair ids are {experiment}-{start}-{index}
        # new in each process: a run killed after posting pairs it had not saved asks other pairs under new ids (the
        # server keeps those ids' clips, metadata and answers); 64 random bits: two processes practically never draw the same
        self.start_id = os.urandom(8).hex()
        self.consumed_seq = 0  # label sequence number up to which answers are in the label buffer
        self.received_seq = 0  # label sequence number up to which the thread has fetched answers
        self.taken_seq = 0  # label sequence number up to which poll() has taken every fetched answer
        self.resumed = False  # load() found the pairs of a stopped run
        self.failure = None  # an error the thread cannot retry
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._work, daemon=True)

    @property
    def pending(self):
        """Pairs asked and not yet handed over by poll(), answered or not: the label budget counts them as on their
        way (an answer the thread has fetched but poll() has not returned is neither in the buffer nor unanswered)."""
        with self.lock:
            return len(self.waiting)

    @property
    def unanswered(self):
        """Pairs asked that nobody has answered yet."""
        with self.lock:
            return len(self.waiting) - len(self.answered)

    def ask(self, left, right):
        with self.lock:
            for i in range(len(left["act"])):
                pair_id = f"{self.experiment}-{self.start_id}-{self.next_index:06d}"
                self.next_index += 1
                self.waiting[pair_id] = (index_segments(left, i), index_segments(right, i))
                self.queued.append(pair_id)

    def poll(self):
        with self.lock:
            answered, self.answered = self.answered, []
            self.taken_seq = self.received_seq
            batches = []
            for pair_id, mu, seq in answered:
                left, right = self.waiting.pop(pair_id)
                if pair_id in self.queued:  # answered before it was posted again (a pair of a resumed run)
                    self.queued.remove(pair_id)
                if mu is not None and seq > self.consumed_seq:  # not in the labels already (see load)
                    batches.append((left, right, mu))
                self.consumed_seq = max(self.consumed_seq, seq)
        if not batches:
            return []
        lefts, rights, mus = zip(*batches)
        return [(stack_segments(lefts), stack_segments(rights), np.array(mus))]

    def wait_for_answers(self, stop, progress_every=10.0):
        """Block until every asked pair is answered (True), or `stop` is set or the thread stopped (False)."""
        last = 0.0
        while self.unanswered and self.failure is None and not stop.is_set():
            if time.time() - last > progress_every:
                print(
                    f"waiting for {self.unanswered} labels: label them at {self.server}/ ({len(self.queued)} pairs still to upload)"
                )
                last = time.time()
            time.sleep(0.5)
        return not stop.is_set() and self.failure is None

    # --- the background thread ---
    def _request(self, method, path, body=None, content_type="application/json", not_found=None, retry=True):
        """One HTTP call, retried with exponential backoff (1 s to 60 s) while the server is down or answers 5xx;
        a 4xx stops the thread with the server's message (its `failure`: the run stops, saving), but the server's 404
        for a pair it does not have returns `not_found` where one is given. `retry=False`: one try (None if it fails)."""
        delay, warned = 1.0, False
        while not retry or not self.stop.is_set():
            request = urllib.request.Request(self.server + path, data=body, method=method)
            request.add_header("Content-Type", content_type)
            if self.token:
                request.add_header("Authorization", f"Bearer {self.token}")
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    if warned:
                        print(f"label server at {self.server} is back")
                    return json.loads(response.read() or b"null")
            except urllib.error.HTTPError as error:
                reply = error.read().decode(errors="replace")
                if error.code == 404 and not_found is not None and "unknown pair" in reply:  # the server's own 404
                    return not_found
                if error.code < 500:  # the request itself is wrong: retrying cannot help
                    hint = " (does --label-token match the server's --token?)" if error.code == 401 else ""
                    raise RuntimeError(f"{method} {path}: HTTP {error.code} {reply}{hint}")
                reason = f"HTTP {error.code}"
            except (urllib.error.URLError, OSError, http.client.HTTPException) as error:  # (a reply cut short too)
                reason = str(getattr(error, "reason", error))
            if not retry:
                print(f"label server at {self.server} unreachable ({reason})")
                return None
            print(f"label server at {self.server} unreachable ({reason}); retrying in {delay:.0f} s")
            warned = True
            self.stop.wait(delay)
            delay = min(delay * 2, 60.0)
        return None

    def _encode(self, segment):
        """WebM/VP9 bytes of the segment's frames (plays in Chromium and Firefox): the dot at each step's position, then
        where the last step took it, so that every move the teacher judges is shown (a 1-step segment too)."""
        path = [*segment["position"], move(segment["position"][-1], segment["act"][-1])]
        frames = [render_frame(position) for position in path]
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "clip.webm")
            speed = ["-deadline", "realtime", "-cpu-used", "8", "-b:v", "0", "-crf", "32"]
            imageio.v2.mimwrite(path, frames, fps=self.clip_fps, codec="libvpx-vp9", macro_block_size=1, output_params=speed)
            with open(path, "rb") as clip:
                return clip.read()

    def _work(self):
        try:
            if self.resumed:  # before this process posts a pair
                self._close_pairs_not_waiting()
            last_poll, last_check = 0.0, time.time()
            while not self.stop.is_set():
                with self.lock:
                    pair_id = self.queued[0] if self.queued else None
                    segments = self.waiting.get(pair_id)
                if pair_id is not None:
                    left, right = segments
                    for side, segment in (("left", left), ("right", right)):
                        self._request("PUT", f"/api/clips/{pair_id}-{side}", self._encode(segment), "video/webm")
                    pair = {
                        "experiment": self.experiment,
                        "pair_id": pair_id,
                        "left_clip": f"{pair_id}-left",
                        "right_clip": f"{pair_id}-right",
                        "instruction": self.instruction,
                        "metadata": {  # what the teacher did not see, for later analysis of human labels
                            "left_true_return": float(left["true_reward"].sum()),
                            "right_true_return": float(right["true_reward"].sum()),
                        },
                    }
                    if self._request("POST", "/api/pairs", json.dumps(pair).encode()) is not None:
                        with self.lock:
                            if pair_id in self.queued:  # poll() drops a pair that was answered meanwhile
                                self.queued.remove(pair_id)
                if pair_id is None or time.time() - last_poll > self.poll_interval:
                    self._fetch_labels()
                    last_poll = time.time()
                if time.time() - last_check > self.pair_check_interval:
                    self._check_the_server_has_the_posted_pairs()
                    last_check = time.time()
                if pair_id is None:
                    self.stop.wait(self.poll_interval)
        except Exception as error:  # the training loop stops at the end of its iteration, saving
            self.failure = f"{type(error).__name__}: {error}"

    def _close_pairs_not_waiting(self):
        """Pairs a killed run posted after its last save are in no file: their answers would reach no run. The server
        closes the experiment's open pairs but those this run waits for, so raters are not given them."""
        with self.lock:
            body = json.dumps({"pair_ids": list(self.waiting)}).encode()
        try:
            reply = self._request("POST", f"/api/experiments/{self.experiment}/keep", body)
        except RuntimeError as error:  # e.g. a label server from before this call: the run goes on without it
            print(f"label server: could not close the stopped run's pairs that no longer count ({error})")
            return
        if reply is not None and reply["closed"]:
            print(f"label server: closed {reply['closed']} pairs this run no longer waits for (posted after its last save)")

    def _check_the_server_has_the_posted_pairs(self):
        """A label server restarted on another database has none of the pairs this run posted: nobody can answer them,
        and before the run holds a label nothing else tells it (GET /api/labels answers 409 only for a label number
        the database never gave), so it would wait for them for ever. The oldest and the newest pair posted and not
        yet answered must be there (the newest: one posted to the wrong database before the right one was back)."""
        with self.lock:
            answered = {pair_id for pair_id, _, _ in self.answered}
            posted = [pair_id for pair_id in self.waiting if pair_id not in self.queued and pair_id not in answered]
        for pair_id in dict.fromkeys(posted[:1] + posted[-1:]):
            if self._request("GET", f"/api/pairs/{pair_id}", not_found=MISSING) is MISSING:
                raise RuntimeError(
                    f"the label server at {self.server} has no pair {pair_id}, which this run posted: was it restarted "
                    "on another database (--db, a path relative to where it starts)? Restart it on the run's database, "
                    "then --resume"
                )

    def _fetch_labels(self, retry=True):
        """The server's new labels of this run's pairs, for poll(); whether the server replied."""
        reply = self._request("GET", f"/api/labels?experiment={self.experiment}&since={self.received_seq}", retry=retry)
        if reply is None:
            return False
        with self.lock:
            for label in reply["labels"]:
                if label["pair_id"] in self.waiting:  # an answer to a pair of this run that is not in the buffer yet
                    self.answered.append((label["pair_id"], MU_OF_CHOICE.get(label["choice"]), label["seq"]))
                self.received_seq = max(self.received_seq, label["seq"])
        return True

    def start(self):
        self.thread.start()
        return self

    def close(self, run_finished=False):
        """Stop the thread. A stopped run's unanswered pairs are asked again on --resume (save_labels saves them). A
        finished run fetches the answers given since the thread's last fetch (poll() hands them over, for the labels it
        saves) and closes its other pairs on the server (raters get other runs' pairs)."""
        self.stop.set()
        if self.thread.is_alive():  # never started: nothing to wait for
            self.thread.join(timeout=60)
        if not run_finished:
            print(f"{self.pending} pairs not yet in the label buffer saved to {self.path} (asked again on --resume)")
            return
        try:
            if self._fetch_labels(retry=False):
                self._wait_for_held_back_labels()
        except (RuntimeError, ValueError, KeyError) as error:  # refused (a 4xx), or a reply that is not the server's
            print(f"label server: the answers given since the last fetch were not fetched ({error})")
        self._close_experiment()

    def _wait_for_held_back_labels(self, longest=60.0):
        """A finished run's pairs that have a label on the server it was not sent: the server holds each label back for
        its --undo-seconds (the rater may take the answer back). Waited for, up to `longest` seconds."""
        with self.lock:
            fetched = {pair_id for pair_id, _, _ in self.answered}
            unfetched = [pair_id for pair_id in self.waiting if pair_id not in fetched]
        held_back = []
        for pair_id in unfetched:
            pair = self._request("GET", f"/api/pairs/{pair_id}", retry=False, not_found=MISSING)  # (MISSING: never posted)
            if isinstance(pair, dict) and pair["label"] is not None:
                held_back.append(pair_id)
        if held_back:
            print(f"label server: waiting for {len(held_back)} labels it holds back while their answers can be taken back")
        deadline = time.time() + longest
        while held_back and time.time() < deadline:
            time.sleep(0.5)
            if not self._fetch_labels(retry=False):
                return
            with self.lock:
                fetched = {pair_id for pair_id, _, _ in self.answered}
            held_back = [pair_id for pair_id in held_back if pair_id not in fetched]

    def _close_experiment(self):
        """One try, no retries: if it fails, the pairs are served after those of live runs anyway."""
        request = urllib.request.Request(f"{self.server}/api/experiments/{self.experiment}/close", data=b"", method="POST")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                print(f"label server: {json.loads(response.read())['closed']} unanswered pairs of the finished run closed")
        except (OSError, ValueError, KeyError) as error:  # URLError and HTTPError are OSErrors
            print(f"label server: could not close the finished run's unanswered pairs ({error})")

    # --- persistence: asked but unanswered pairs survive a stopped run ---
    def save(self):
        """In step with the label buffer's file: the answers it holds are not fetched again."""
        with self.lock:
            ids = list(self.waiting)
            state = {"pair_ids": np.array(ids, dtype=str), "next_index": self.next_index, "consumed_seq": self.consumed_seq}
            # where a resumed run fetches again: below consumed_seq while answers it must drop are still to come (load)
            state["fetch_from"] = min(self.consumed_seq, self.taken_seq)
            for side, which in (("left", 0), ("right", 1)):
                for key in SEGMENT_KEYS:
                    values = [self.waiting[i][which][key] for i in ids]
                    state[f"{side}_{key}"] = np.stack(values) if values else np.zeros(0, np.float32)
        np.savez_compressed(self.path + ".tmp.npz", **state)
        os.replace(self.path + ".tmp.npz", self.path)

    def load(self, consumed_seq_in_labels=0):
        """Asked-but-unanswered pairs of a stopped run, if it left any: asked again (re-posting a pair is harmless). A
        run killed after saving its labels and before this file lists pairs as unanswered whose answers are in the
        labels (up to `consumed_seq_in_labels`, from LabelBuffer.load): poll() drops those answers when they arrive
        again."""
        if os.path.exists(self.path):
            self.resumed = True
            with np.load(self.path) as state:
                self.next_index, self.consumed_seq = int(state["next_index"]), int(state["consumed_seq"])
                fetch_from = int(state["fetch_from"]) if "fetch_from" in state else self.consumed_seq
                self.received_seq = self.taken_seq = fetch_from
                for n, pair_id in enumerate(state["pair_ids"]):
                    left, right = ({k: state[f"{side}_{k}"][n] for k in SEGMENT_KEYS} for side in ("left", "right"))
                    self.waiting[str(pair_id)] = (left, right)
                    self.queued.append(str(pair_id))
        self.consumed_seq = max(self.consumed_seq, consumed_seq_in_labels)


def experiment_name(run_dir):
    """The run's experiment on the label server: the run folder's name, the prefix of its pairs' and clips' ids. Refuses
    a name those ids cannot carry (the server takes at most 128 characters, the first a letter or digit)."""
    experiment = re.sub(r"[^A-Za-z0-9_.-]", "-", os.path.basename(os.path.abspath(run_dir)))
    longest_id = f"{experiment}-{'0' * 16}-{0:06d}-right"  # a clip's: experiment, start id, pair index, side
    if len(longest_id) > 128:
        raise SystemExit(
            f"error: the run folder's name ({len(experiment)} characters) is too long for the label server's ids (at "
            f"most {len(experiment) + 128 - len(longest_id)}): choose a shorter --exp-name"
        )
    if not experiment[:1].isalnum():  # the server's ids start with a letter or digit
        raise SystemExit(
            f"error: the run folder's name '{experiment}' does not start with a letter or a digit, as the label server's "
            "ids must: rename the folder"
        )
    return experiment


# =====================================================================================================================
# Infrastructure: stopping, saving and resuming. A checkpoint holds, besides the networks, everything that makes a
# resumed run go on exactly as if it had never stopped (tests/test_moving_dot.py checks it bit for bit).
# =====================================================================================================================
def stop_on_signals():
    """A threading.Event set by Ctrl-C, `kill`, `timeout` or a cluster's scheduler (SIGTERM): the loop stops at the end
    of the iteration in progress, where the checkpoint resumes it exactly. A second Ctrl-C stops at once, unsaved; one
    within a second of the first is the same stop, and so is any SIGTERM after the first."""
    stop_requested, asked_at = threading.Event(), []

    def request_stop(signum, frame):
        now = time.monotonic()
        if asked_at:  # (not the event: a second signal can arrive while the first handler sets it)
            # the same stop sent again: a scheduler may signal every process, and a sweep task passes its own signal on
            if signum != signal.SIGINT or now - asked_at[0] < 1:
                return
            raise KeyboardInterrupt
        asked_at.append(now)
        stop_requested.set()
        # os.write, not print: a signal can arrive while print is writing, and print is not reentrant
        message = b"stopping at the end of this iteration (Ctrl-C again, a second later, to stop at once, unsaved)\n"
        os.write(sys.stderr.fileno(), message)

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    return stop_requested


def save_labels(buffer, teacher, labels_path):
    """The labels, with the last label-server answer they hold, then the teacher's unanswered pairs (a run killed
    between the two files takes no answer twice on --resume: HumanTeacher.load)."""
    buffer.save(labels_path, teacher.consumed_seq)
    teacher.save()


def load_labels(buffer, teacher, labels_path):
    """A stopped run's labels, then the teacher's unanswered pairs (see save_labels)."""
    consumed_seq_in_labels = buffer.load(labels_path)
    teacher.load(consumed_seq_in_labels)


def save_labels_if_due(buffer, teacher, labels_path, last_save, every=30.0):
    """Save the labels if the last save (a time.time()) is more than `every` seconds old: a killed run loses at most
    that much labelling. Returns the time of the last save."""
    if time.time() - last_save <= every:
        return last_save
    save_labels(buffer, teacher, labels_path)
    return time.time()


def random_states(rng, device):
    """Every random generator the run draws from: numpy's Generator (segments, the teacher, bootstrap weights, reward
    minibatches), numpy's global one (PPO's minibatch shuffle), torch's (actions) and Python's."""
    return {
        "rng": rng.bit_generator.state,
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
        "python": random.getstate(),
    }


def restore_random_states(rng, states):
    rng.bit_generator.state = states["rng"]
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    random.setstate(states["python"])


def inner_wrapper(env, kind):
    """The wrapper of type `kind` in the environment's stack, or None."""
    while not isinstance(env, kind):
        if not isinstance(env, gym.Wrapper):
            return None
        env = env.env
    return env


def environment_states(envs):
    """Where each environment is: the dot, its random generator (next episode's start), the step within the episode
    (TimeLimit), the episode's true return and length so far and the episode count (RecordEpisodeStatistics; the count
    numbers videos)."""
    states = []
    for env in envs.envs:
        statistics = inner_wrapper(env, gym.wrappers.RecordEpisodeStatistics)
        states.append(
            {
                "position": env.unwrapped.position.copy(),
                "np_random": env.unwrapped.np_random.bit_generator.state,
                "elapsed_steps": inner_wrapper(env, gym.wrappers.TimeLimit)._elapsed_steps,
                "episode": (statistics.episode_returns, statistics.episode_lengths, statistics.episode_count),
            }
        )
    return states


def restore_environment_states(envs, states):
    for env, state in zip(envs.envs, states):
        env.unwrapped.position = state["position"].copy()
        env.unwrapped.np_random.bit_generator.state = state["np_random"]
        inner_wrapper(env, gym.wrappers.TimeLimit)._elapsed_steps = state["elapsed_steps"]
        statistics = inner_wrapper(env, gym.wrappers.RecordEpisodeStatistics)
        statistics.episode_returns, statistics.episode_lengths, statistics.episode_count = state["episode"]
        if recorder := inner_wrapper(env, RecordEpisodeVideo):  # environment 0's with --capture-video: numbers follow
            episode = statistics.episode_count  # under way: filmed on only if the stop saved no clip of it (a kill saves none)
            recorder.renumber(episode, record=not os.path.exists(recorder.video_path(episode)))


def claim_new_run_dir(run_dir):
    """Makes a new run's folder, runs/NAME__SECOND (the second it started in). A run of the same NAME started in the same
    second (a shell loop starting a true-reward and a labelled run) may have made it already: this run then takes the
    next free second's name rather than write its checkpoint, labels and logs over that run's."""
    name, second = run_dir.rsplit("__", 1)
    second = int(second)
    while True:
        try:
            os.makedirs(f"{name}__{second}")
            return f"{name}__{second}"
        except FileExistsError:
            second += 1


def load_checkpoint(run_dir):
    checkpoint_path = os.path.join(run_dir, "checkpoint.pt")
    if not os.path.isfile(checkpoint_path):
        raise SystemExit(f"error: no checkpoint at {checkpoint_path} (was the run started with --save-model?)")
    try:
        return torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    except Exception as error:  # cut short (a full disk), empty, or not a checkpoint: RuntimeError, EOFError, ...
        raise SystemExit(f"error: cannot read {checkpoint_path} ({type(error).__name__}: {error})") from None


def flags_on_command_line(argv):
    """The settings a command line names, at whatever value (--name or --name=value, with hyphens or underscores, and
    --no-name for False): a flag given at its default value is still given."""
    fields = set(vars(Args()))
    names = {token[2:].split("=")[0].replace("-", "_") for token in argv if token.startswith("--")}
    return {name if name in fields else name.removeprefix("no_") for name in names} & fields


def resumed_args(args, checkpoint, argv=()):
    """A resumed run keeps its own settings; only what to do with it comes from this command line (--resume,
    --eval-only, --eval-episodes; with --eval-only, --capture-video: whether to film the evaluation), and where its
    label server is now (--label-server, --label-token, when given). Any
    other flag given (set away from its default, or named in `argv`, the command line) that differs from the run's own
    is refused, not dropped, and so is a checkpoint with settings this script does not have (another script's run), and
    a labelled run's checkpoint without its labels (save_labels writes them before every checkpoint)."""
    from_command_line = ("resume", "eval_only", "eval_episodes") + (("capture_video",) if args.eval_only else ())
    saved = {"reward_form": "action", **checkpoint["args"]}  # saved before --reward-form: r(o, a)
    unknown = sorted(set(saved) - set(vars(args)))
    if unknown:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in unknown)
        raise SystemExit(f"error: {args.resume} is not a run of this script (its settings have {flags})")
    defaults, named = vars(Args()), flags_on_command_line(argv)
    given = {name: value for name, value in vars(args).items() if value != defaults[name] or name in named}
    for name, value in given.items():
        if name not in from_command_line + ("label_server", "label_token") and value != saved.get(name, defaults[name]):
            flag = f"--{name.replace('_', '-')}"
            raise SystemExit(
                f"error: {flag} {value} differs from the run's own {saved.get(name, defaults[name])}: a resumed run keeps "
                f"its settings (start a new run to change {flag})"
            )
    if "eval_episodes" in given and not args.eval_only:  # (named on the command line, even at its default)
        raise SystemExit("error: --eval-episodes is for --eval-only")
    labels_path = os.path.join(args.resume, "labels.npz")
    if saved["feedback"] != "true-reward" and not args.eval_only and not os.path.isfile(labels_path):
        raise SystemExit(f"error: {args.resume} has a checkpoint but not the labels saved with it ({labels_path})")
    return Args(**{**saved, **given, **{name: getattr(args, name) for name in from_command_line}})


def save_checkpoint(run_dir, args, iteration, agent, optimizer, reward_training, envs, next_obs, episodes, rng):
    """Everything needed to evaluate the agent or to resume the run after `iteration` (the last completed one), with
    the run's state at this moment (the end of that iteration when the run was stopped by a signal): the episodes in
    progress, every random stream, the observation the next step starts from and the counters. `episodes`: each
    environment's predicted return so far, and the last 10 episodes' true and learned returns (the progress line's
    means)."""
    predicted_return, recent_returns, recent_predicted = episodes
    state = {
        "args": vars(args),
        "agent": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        **(reward_training.state_dict() if reward_training else {"reward_ensemble": None, "reward_optimizer": None}),
        "global_step": iteration * args.batch_size,
        "iteration": iteration,
        "random_states": random_states(rng, next_obs.device),
        "env_states": environment_states(envs),
        "next_obs": next_obs.cpu(),
        "predicted_episode_return": predicted_return,
        "recent_returns": [recent_returns[-10:], recent_predicted[-10:]],
    }
    path = f"{run_dir}/checkpoint.pt"
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # atomic: a run killed while saving keeps the old one


def restore_checkpoint(checkpoint, agent, optimizer, reward_training):
    """The networks, optimisers and reward-model state of a checkpoint; returns (the first iteration to run, its step
    count)."""
    agent.load_state_dict(checkpoint["agent"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if reward_training:
        reward_training.load_state_dict(checkpoint)
    return checkpoint["iteration"] + 1, checkpoint["global_step"]


# Evaluation of a saved agent
def evaluate(checkpoint_path, observation, episode_steps, episodes, seed=0, video_dir=None):
    """True returns of the saved agent taking its most likely action; with video_dir, episodes 0, 1, 8, ... are saved
    as MP4s in `video_dir/videos` (--capture-video), in place of the clips an earlier evaluation left there."""
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    if video_dir is not None and os.path.isdir(f"{video_dir}/videos"):  # an earlier evaluation's clips go: left, they
        for name in os.listdir(f"{video_dir}/videos"):  # would show more episodes, or an agent trained less, beside these
            if re.fullmatch(r"episode-\d+\.mp4", name):
                os.remove(f"{video_dir}/videos/{name}")
    env = make_env(observation, episode_steps, 0, video_dir is not None, video_dir)()
    agent = Agent(env.observation_space.shape, env.action_space.n)
    agent.load_state_dict(checkpoint["agent"])
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            with torch.no_grad():
                action = agent.actor(agent.network(as_input(torch.as_tensor(obs[None])))).argmax().item()
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        returns.append(float(info["episode"]["r"]))
    env.close()
    return returns


if __name__ == "__main__":
    args = tyro.cli(Args)
    checkpoint = load_checkpoint(args.resume) if args.resume else None  # Infrastructure: --resume, --eval-only
    if checkpoint is not None:
        args = resumed_args(args, checkpoint, sys.argv[1:])
    if args.eval_only:
        if checkpoint is None or args.eval_episodes < 1:
            raise SystemExit(
                "error: --eval-only needs --resume runs/<run_name> (a run saved with --save-model) and --eval-episodes 1 or more"
            )
        checkpoint_path = os.path.join(args.resume, "checkpoint.pt")
        video_dir = f"{args.resume}/eval" if args.capture_video else None  # Infrastructure: clips in runs/NAME/eval/videos
        returns = evaluate(checkpoint_path, args.observation, args.episode_steps, args.eval_episodes, args.seed, video_dir)
        print(f"eval: {len(returns)} episodes of MovingDot-v0: true return {np.mean(returns):.1f} +- {np.std(returns):.1f}")
        sys.exit(0)
    if args.resume:
        run_dir = os.path.normpath(args.resume)
    else:
        run_dir = f"runs/MovingDot-v0-{args.observation}__{args.exp_name}__{args.seed}__{int(time.time())}"
    fill_runtime_fields(args)
    validate_args(args, run_dir)
    rlhf = args.feedback != "true-reward"
    if not args.resume:  # Infrastructure: a folder of its own, even beside a run of its name started this second
        run_dir = claim_new_run_dir(run_dir)
    # Infrastructure: each run marks the step it starts logging at; TensorBoard hides what a stopped run logged from a
    # resumed run's mark on (the resumed run logs those steps again). The first mark it reads, a new run's, hides nothing
    first_logged_step = 1 + (checkpoint["global_step"] if checkpoint else 0)
    writer = SummaryWriter(run_dir, purge_step=first_logged_step)
    settings = vars(args) | {"label_token": "(not logged)" if args.label_token else None}  # Infrastructure: a password
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in settings.items()])),
        first_logged_step,  # Infrastructure: each start's settings at its mark (at step 0, every resume's piled up there)
    )

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)  # RLHF: segments, teacher, bootstrap weights, reward-model minibatches
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.observation, args.episode_steps, i, args.capture_video, run_dir) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,  # PPO change: the cut state of a truncation, for its bootstrap
    )
    obs_shape, num_actions = envs.single_observation_space.shape, envs.single_action_space.n

    agent = Agent(obs_shape, num_actions).to(device)
    # PPO change (README "Changes to PPO"): speed only: Adam's fused kernel, no argument checks in Categorical
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    torch.distributions.Distribution.set_default_validate_args(False)

    # RLHF: the label schedule, the reward ensemble and its training, the labels, the teacher
    schedule = label_schedule(args) if rlhf else np.zeros(args.num_iterations, np.int64)
    pretrain_labels = int(schedule[: args.pretrain_iterations].sum())
    labels_path = f"{run_dir}/labels.npz"
    ensemble = reward_training = buffer = teacher = None
    if rlhf:
        ensemble = RewardEnsemble(obs_shape, num_actions, args.ensemble_size, args.reward_form == "progress")
        reward_training = RewardModelTraining(ensemble, args.reward_lr)
        buffer = LabelBuffer(args.labels, args.segment_len, args.ensemble_size, rng)
        teacher = make_teacher(args, run_dir, rng)

    start_iteration, global_step = 1, 0
    if checkpoint is not None:  # Infrastructure: resume
        start_iteration, global_step = restore_checkpoint(checkpoint, agent, optimizer, reward_training)
        if rlhf:
            load_labels(buffer, teacher, labels_path)
        print(f"resumed {run_dir} at step {global_step} with {buffer.size if rlhf else 0} labels")
    database = None
    if args.offline:  # RLHF (offline): pairs already in the database are reused; only the missing ones are labelled
        teacher_settings = {name: getattr(args, name) for name in TEACHER_FLAGS}
        database = PreferenceDatabase(args.preference_db or f"{run_dir}/preferences.sqlite", teacher_settings)
        if buffer.size == 0 and database.count(args.segment_len):
            buffer.add(*database.load(args.segment_len, args.labels))
            print(f"offline: {buffer.size} labelled pairs loaded from the preference database")

    # ALGO Logic: Storage setup
    obs_dtype = torch.uint8 if args.observation == "pixels" else torch.float32  # frames are stored as they come
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=obs_dtype).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)
    bootstrap = np.zeros((args.num_steps, args.num_envs), np.float32)  # PPO change: value of the state a cut ended at
    positions = np.zeros((args.num_steps, args.num_envs, 2), np.int16)  # RLHF: what segments are made of
    true_rewards = np.zeros((args.num_steps, args.num_envs), np.float32)  # RLHF: what the synthetic teacher judges
    truncations = np.zeros((args.num_steps, args.num_envs), bool)  # PPO change: episodes end only by the time limit
    predicted_return = np.zeros(args.num_envs)  # RLHF: each environment's predicted return of its episode so far

    # TRY NOT TO MODIFY: start the game
    if rlhf:
        teacher.start()
    start_time, start_step, last_label_save = time.time(), global_step, time.time()
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs).to(device)
    if checkpoint is not None and "random_states" in checkpoint:  # Infrastructure: resume where the run stopped
        restore_environment_states(envs, checkpoint["env_states"])
        restore_random_states(rng, checkpoint["random_states"])
        next_obs, predicted_return[:] = checkpoint["next_obs"].to(device), checkpoint["predicted_episode_return"]
    recent_returns, recent_predicted = [], []  # the last episodes' true and learned returns, for the progress line
    if checkpoint is not None and "recent_returns" in checkpoint:  # Infrastructure: resume the progress line's means
        recent_returns, recent_predicted = (list(returns) for returns in checkpoint["recent_returns"])
    # Infrastructure: the last iteration whose update finished: what a checkpoint resumes after
    completed = start_iteration - 1
    stop_requested = stop_on_signals()  # Infrastructure: Ctrl-C or SIGTERM stop at the end of an iteration
    run_error = None  # why the run cannot go on, raised once everything is saved
    checkpoint_kept = False  # Infrastructure: a labelled run stopped before its reward model is pretrained (in a
    # person's label wait, or with no label at all) keeps the checkpoint from before its last pretraining rollout
    # (written as that rollout begins): --resume acts it again

    def checkpoint_now():  # Infrastructure
        episodes = (predicted_return, recent_returns, recent_predicted)
        save_checkpoint(run_dir, args, completed, agent, optimizer, reward_training, envs, next_obs, episodes, rng)

    for iteration in range(start_iteration, args.num_iterations + 1):
        if stop_requested.is_set() or (rlhf and teacher.failure):  # Infrastructure: Ctrl-C, SIGTERM, the label server
            break
        # Infrastructure: see checkpoint_kept (an offline run labels every pair before its first checkpoint: none twice)
        if rlhf and not args.offline and args.save_model and iteration == args.pretrain_iterations:
            save_labels(buffer, teacher, labels_path)
            checkpoint_now()
        pretraining = iteration <= args.pretrain_iterations  # RLHF: the initial policy only collects labels
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            positions[step] = [env.unwrapped.position for env in envs.envs]  # RLHF: the dot at this observation

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
            true_rewards[step], truncations[step] = reward, truncated
            bootstrap[step] = truncation_values(agent, infos, truncated, device)  # PPO change (README "Changes to PPO")
            episodes = infos["final_info"].get("episode") if "final_info" in infos else None
            if episodes is not None:
                for i in np.flatnonzero(infos["final_info"]["_episode"]):
                    recent_returns.append(float(episodes["r"][i]))
                    writer.add_scalar("charts/episodic_return", episodes["r"][i], global_step)
                    writer.add_scalar("charts/episodic_length", episodes["l"][i], global_step)
            next_obs = torch.as_tensor(next_obs).to(device)

        rollout_actions = actions.cpu().numpy()
        if rlhf:
            # RLHF: ask for the labels the schedule has due (C17 A.1). Pairs where the members disagree most (C17 2.2.4);
            # random ones before RL (untrained members' disagreement is noise) and offline (the blog's database)
            rollout = {"position": positions, "act": rollout_actions, "true_reward": true_rewards, "truncated": truncations}
            selection = "random" if pretraining or args.offline else args.selection
            reward_training.finish_round()  # the round the thread ran during the last iteration: its weights score pairs
            query_labels(rng, ensemble, teacher, buffer, database, rollout, int(schedule[:iteration].sum()), selection, args)
            if iteration == args.pretrain_iterations:  # RLHF: C17 A.1: the reward model is fitted before RL starts
                if teacher.pending:  # Infrastructure: the pairs people are asked, saved in case the wait is killed
                    save_labels(buffer, teacher, labels_path)
                if not teacher.wait_for_answers(stop_requested):  # people label asynchronously; RL needs these
                    checkpoint_kept = True  # Infrastructure
                    break
                store_answers(teacher, buffer, database)
                if buffer.size == 0:
                    run_error = no_pretraining_label_error(args, run_dir)
                    checkpoint_kept = True  # Infrastructure: as at a stop in the wait
                    break  # the labels (and, with --save-model, the checkpoint) are saved below
                pretrain_reward_model(reward_training, buffer, args, rng)
                # the episodes under way began unrewarded: no whole learned return (one that begins with RL has one)
                predicted_return[:] = np.where(truncations[-1], 0.0, np.nan)
            elif not pretraining and not args.offline:  # it keeps training as labels arrive (C17 2.2; offline: frozen),
                reward_training.start_round(buffer, args, rng)  # in a thread while PPO runs
            last_label_save = save_labels_if_due(buffer, teacher, labels_path, last_label_save)  # Infrastructure

        if pretraining:
            print(f"pretraining: step {global_step}, labels {buffer.size}/{pretrain_labels} from the initial policy")
            writer.add_scalar("labels/total", buffer.size, global_step)
            completed = iteration
            if args.save_model and iteration == args.pretrain_iterations:  # Infrastructure: the reward model is
                save_labels(buffer, teacher, labels_path)  # pretrained (and, with people, the labels waited for): kept
                checkpoint_now()  # before the first periodic checkpoint
            continue

        # RLHF: the reward PPO optimises, for the whole rollout in one batched call; `ensemble` has the weights of the
        # last finished round (the one the thread is running now ends before the next iteration's labels)
        if rlhf:
            rewards_np = ensemble.normalized_reward(*reward_inputs(positions, rollout_actions, args.observation)).numpy()
            for episode_return in finish_episode_returns(rewards_np, truncations, predicted_return):
                recent_predicted.append(episode_return)  # whole episodes under the learned reward, next to the true one
                writer.add_scalar("charts/predicted_return", episode_return, global_step)
        else:
            rewards_np = true_rewards.copy()
        # PPO change (README "Changes to PPO"): every episode end is a time-limit cut, bootstrapped from the cut state;
        # step_dones[t] says the episode ended at step t (its bootstrap is in rewards[t])
        rewards = torch.as_tensor(rewards_np + args.gamma * bootstrap * truncations, dtype=torch.float32).to(device)
        step_dones = torch.as_tensor(truncations, dtype=torch.float32).to(device)

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                nextnonterminal = 1.0 - step_dones[t]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        # flatten the batch
        b_obs = obs.reshape((-1,) + obs_shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds],
                        -args.clip_coef,
                        args.clip_coef,
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                    v_loss = 0.5 * v_loss_max.mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        sps = int((global_step - start_step) / (time.time() - start_time))  # Infrastructure: since this (resumed) start
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
        writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
        writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
        writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
        writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
        writer.add_scalar("losses/clipfrac", np.mean(clipfracs), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        line = f"step {global_step}, SPS {sps}"
        if recent_returns:
            line += f", true return {np.mean(recent_returns[-10:]):.1f}"
        if rlhf:  # RLHF: the reward model's figures, and how well the learned reward tracks the true one
            if recent_predicted:
                line += f", predicted return {np.mean(recent_predicted[-10:]):.1f}"
            line += log_reward_model(
                writer, global_step, reward_training, buffer, teacher, rewards_np, true_rewards, args.labels
            )
        print(line)
        recent_returns, recent_predicted = recent_returns[-10:], recent_predicted[-10:]

        completed = iteration
        if args.save_model and iteration % args.checkpoint_every == 0:  # Infrastructure
            if rlhf:  # the labels never trail the checkpoint, whenever the run is killed
                save_labels(buffer, teacher, labels_path)
            checkpoint_now()

    # Infrastructure: the run ended, or stopped at the end of an iteration: nothing is lost (labels always, the
    # checkpoint with --save-model; continue with --resume)
    if stop_requested.is_set() and completed < args.num_iterations:
        print(f"interrupted at step {global_step}")
    if rlhf:
        run_finished = completed == args.num_iterations
        teacher.close(run_finished)  # people's: a finished run fetches the answers given until its end
        if run_finished:
            store_answers(teacher, buffer, database)  # (kept in the labels; no reward model of this run sees them)
        save_labels(buffer, teacher, labels_path)
        print(f"{buffer.size} labels saved to {labels_path}")
        reward_training.close()
    if database is not None:
        database.close()
    if args.save_model and checkpoint_kept:
        print(f"checkpoint of step {completed * args.batch_size} kept (before the last pretraining rollout) in {run_dir}")
    elif args.save_model:
        checkpoint_now()
        print(f"checkpoint saved to {run_dir}/checkpoint.pt")
    envs.close()
    writer.close()
    if rlhf and teacher.failure and run_error is None:  # Infrastructure: the label server refused the run
        run_error = f"error: the human-feedback thread stopped: {teacher.failure}. The labels are saved" + (
            "; fix that, then --resume goes on" if args.save_model else " (no checkpoint to resume: no --save-model)"
        )
    if run_error is not None:
        raise SystemExit(run_error)
