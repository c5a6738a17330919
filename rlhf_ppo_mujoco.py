# PPO on MuJoCo from preferences (Christiano et al. 2017, "C17"): docs in README.md, results in benchmark/README.md
import collections
import copy
import ctypes.util
import difflib
import json
import math
import os
import random
import re
import signal
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

if sys.platform.startswith("linux") and ctypes.util.find_library("EGL"):
    # headless rendering (clips for people, --capture-video); must be set before mujoco loads. Without an EGL library
    # (some cluster nodes, macOS) MuJoCo would fail to load with it: there MuJoCo picks its own backend
    os.environ.setdefault("MUJOCO_GL", "egl")

import gymnasium as gym
import imageio
import mujoco
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from gymnasium.envs.mujoco.mujoco_env import MujocoEnv
from torch.distributions.normal import Normal
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
    """whether to capture videos of the agent performances (check out `videos` folder; with --eval-only, of the
    evaluation episodes, in `runs/NAME/eval/videos`)"""
    video_format: Literal["mp4", "gif"] = "mp4"
    """format of --capture-video's clips; gif loops on a web page (README's gallery), about 15 frames/s in real time"""
    video_seconds: float = 0.0
    """with --capture-video: the clips end after this many seconds of simulated time (0: whole episodes)"""
    save_model: bool = False
    """whether to save a checkpoint (agent, observation statistics, reward ensemble) to `runs/{run_name}`"""
    checkpoint_every: int = 50
    """with --save-model, write the checkpoint every this many iterations (and at the end)"""
    resume: Optional[str] = None
    """a run folder `runs/{run_name}` to continue from its checkpoint and saved labels"""
    eval_only: bool = False
    """evaluate the checkpoint of --resume (mean action) for --eval-episodes episodes and exit"""
    eval_episodes: int = 10
    """number of episodes for --eval-only"""

    # Algorithm specific arguments
    env: str = "Hopper-v4"
    """the id of the MuJoCo environment (gymnasium v4 or v5)"""
    env_kwargs: str = "{}"
    """keyword arguments of the environment, as JSON; e.g. '{"ctrl_cost_weight": 0}': C17 A.1's reward without torque
    penalties (README: departures from C17)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments (RLHF pretraining rollouts included)"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments (stepped together, one policy call for all; 4 x 512 runs 1.5-1.6x the
    steps/s of 1 x 2048 here; its learning differs by task and mode: README "Changes to PPO")"""
    num_steps: int = 2048
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    ent_coef_final: Optional[float] = None
    """if set, the entropy coefficient falls linearly over the run from --ent-coef towards this value (the fraction
    --anneal-lr uses, with or without it; C17 keeps the bonus constant; unset: constant)"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold"""

    # Preference learning arguments
    feedback: Literal["synthetic", "scripted", "human", "true-reward"] = "synthetic"
    """where the reward comes from: preferences of the synthetic teacher, of a behaviour function (--behaviour), of
    people through label_server.py, or the environment's reward (baseline)"""
    behaviour: Optional[str] = None
    """with --feedback scripted: the behaviour the teacher prefers, one of BEHAVIOURS (backflip: Hopper, backwards:
    HalfCheetah, one-leg: Walker2d)"""
    labels: int = 1400
    """total number of preference labels to query over the run (C17 on MuJoCo: 350, 700 or 1400)"""
    segment_len: int = 50
    """steps per segment (C17 A.1: 15-60)"""
    pretrain_fraction: float = 0.25
    """share of the labels queried from the initial policy before RL starts (C17 A.1: 25%)"""
    pretrain_steps: int = 10240
    """environment steps of the initial policy from which the pretraining labels are drawn (count in total_timesteps)"""
    pretrain_epochs: int = 50
    """epochs of reward-model training on the pretraining labels before RL starts; an epoch: as many minibatches as
    the labels fill, each drawn at random (with replacement)"""
    schedule_horizon: float = 2e5
    """labels after pretraining arrive at a rate proportional to horizon / (T + horizon), T the steps so far (C17 A.1:
    2e6; README: departures from C17)"""
    selection: Literal["variance", "random"] = "variance"
    """how pairs are chosen: highest ensemble disagreement among candidates (C17 2.2.4), or at random (ablation)"""
    candidate_multiplier: int = 10
    """candidate pairs drawn per queried pair for variance-based selection (C17 A: 10x)"""
    pair_pool_rollouts: int = 1
    """candidate pairs are drawn from the last this many rollouts, each kept in memory and in the checkpoint (1: the
    current one; C17 does not say; rl-teacher drew from one segment of each of its last 200 episodes)"""
    ensemble_size: int = 3
    """number of reward predictors in the ensemble (C17: 3)"""
    reward_lr: float = 3e-4
    """learning rate of the reward model (Adam)"""
    reward_dropout: float = 0.0
    """dropout on the reward model's hidden units while it trains (C17 2.2.3: "in some domains"; rl-teacher's MuJoCo
    model: 0.5), rounded to a multiple of 1/256 (at most 255/256); its predictions use none"""
    reward_input_norm: bool = True
    """standardise the reward model's inputs by the pretraining labels' observations (C17 does not say; rl-teacher feeds them raw)"""
    reward_potential: bool = False
    """each reward-model member also learns a potential of the observation, and a segment's predicted return adds
    its change from the segment's first step to its last real one (AIRL's shaping term): a posture shift that a
    clip's true return pays (Swimmer's front body moves as the body bends) can be explained by the potential, which
    PPO is not paid; PPO gets the step reward only (off: C17's r(o, a) alone; README's flag table)"""
    reward_batch_size: int = 64
    """preference pairs per reward-model gradient step"""
    reward_updates: int = 16
    """reward-model gradient steps per PPO iteration (the model keeps training as labels arrive, C17 2.2)"""
    reward_eval_every: int = 10
    """reward-training rounds between validation passes (losses, accuracy, L2 adaptation, reward normalisation)"""
    reward_std: float = 1.0
    """standard deviation of the normalised learned reward, over the labelled steps (C17 A.1: 1 on MuJoCo); PPO's
    return scaling divides any such scale away, so it changes only what is logged (predicted returns, the absorbing
    reward)"""
    anchor_absorbing: bool = True
    """shift the normalised reward given to PPO so the absorbing (fallen) state earns 0, as under the true reward
    (README: episodes that end early)"""
    label_noise: float = 0.1
    """C17 2.2.3: the preference model assumes the teacher answers uniformly at random with this probability"""
    teacher_beta: float = float("inf")
    """synthetic or scripted teacher rationality: P(left) = sigmoid(beta * (R_left - R_right)); inf = always the better one"""
    teacher_gamma: float = 1.0
    """synthetic or scripted teacher myopia: reward at step t weighted gamma^(L-1-t) (B-Pref); 1 = undiscounted"""
    teacher_epsilon: float = 0.0
    """synthetic or scripted teacher mistake probability: the answer is flipped (B-Pref)"""
    teacher_skip_threshold: float = float("-inf")
    """synthetic or scripted teacher skips a pair when both segments' undiscounted returns are below this (B-Pref); the run asks
    for another pair in its place"""
    teacher_equal_margin: float = 0.0
    """synthetic or scripted teacher answers 'equal' when the undiscounted returns differ by at most this (B-Pref); 0 = exact ties only"""
    label_server: str = "http://127.0.0.1:8000"
    """with --feedback human: the address of label_server.py"""
    label_token: Optional[str] = None
    """with --feedback human: the label server's --token, if it has one"""
    instruction: str = "Which clip shows the robot moving forward faster without falling?"
    """with --feedback human: the question raters are asked"""
    clip_size: int = 320
    """with --feedback human: clip width and height in pixels (the page shows clips about 600 px wide: 160 was blurry)"""
    clip_fps: int = 30
    """with --feedback human: playback frame rate (C17 B: clips of 1-2 s)"""

    # to be filled in runtime (not flags: a value given would be overwritten unseen)
    batch_size: tyro.conf.Suppress[int] = 0
    """the batch size (computed in runtime)"""
    minibatch_size: tyro.conf.Suppress[int] = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """the number of iterations (computed in runtime)"""
    pretrain_iterations: tyro.conf.Suppress[int] = 0
    """rollouts of the initial policy used only for pretraining labels (computed in runtime)"""


def fill_runtime_fields(args: Args) -> None:
    """Set the fields computed from the flags (batch and minibatch sizes, iteration counts); refuses sizes that they
    cannot be computed from."""
    for flag in ("num_envs", "num_steps", "total_timesteps", "num_minibatches", "update_epochs"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"error: --{flag.replace('_', '-')} must be positive (got {getattr(args, flag)})")
    args.batch_size = args.num_envs * args.num_steps
    if args.batch_size % args.num_minibatches:
        raise SystemExit(
            f"error: the batch ({args.num_envs} envs x {args.num_steps} steps = {args.batch_size}) "
            f"must divide into --num-minibatches {args.num_minibatches}"
        )
    args.minibatch_size = args.batch_size // args.num_minibatches
    if args.norm_adv and args.minibatch_size < 2:  # one step's advantage has no std: a NaN update
        raise SystemExit(
            f"error: --num-minibatches {args.num_minibatches} makes minibatches of 1 step: --norm-adv needs 2 or more "
            "(fewer --num-minibatches, or --no-norm-adv)"
        )
    rlhf = args.feedback != "true-reward"
    args.pretrain_iterations = math.ceil(args.pretrain_steps / args.batch_size) if rlhf else 0
    args.num_iterations = args.total_timesteps // args.batch_size


def fewest_segment_starts(num_steps, segment_len, episode_len=None):
    """The fewest steps a segment can start at in one environment's rollout of `num_steps` steps, over every step of an
    episode the rollout can begin at, with episodes of `episode_len` steps (None: no time limit); a segment never
    crosses a time limit. Falls never leave fewer: a segment may run into a termination (sample_segments)."""
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
    """Reject impossible settings with a message (no traceback) before anything is created. Expects the run-time
    fields (fill_runtime_fields); changes nothing. With `run_dir`, also checks that the label server can carry its name
    (--feedback human)."""
    if "ALE/" in args.env or "NoFrameskip" in args.env:
        raise SystemExit(f"error: {args.env} is an Atari game: rlhf_a2c_atari.py trains on those")
    if args.env not in gym.registry:
        close = difflib.get_close_matches(args.env, list(gym.registry), n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise SystemExit(f"error: unknown environment id '{args.env}'.{hint}")
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError:
        env_kwargs = None
    if not isinstance(env_kwargs, dict):
        example = """'{"ctrl_cost_weight": 0}'"""
        raise SystemExit(f"error: --env-kwargs must be a JSON object, e.g. {example} (got {args.env_kwargs})")
    try:
        probe = gym.make(args.env, **env_kwargs)
        probe.reset(seed=0)
        probe.step(probe.action_space.sample())  # a keyword of the wrong type fails here, not at the run's first step
    except Exception as error:  # e.g. a registered id whose simulator is not installed, or a keyword it does not take
        raise SystemExit(f"error: cannot create {args.env} with --env-kwargs {args.env_kwargs}: {error}") from None
    continuous = isinstance(probe.action_space, gym.spaces.Box) and len(probe.observation_space.shape) == 1
    mujoco_task = isinstance(probe.unwrapped, MujocoEnv)  # the human teacher and --capture-video render its simulator
    obs_shape, episode_limit = probe.observation_space.shape, probe.spec.max_episode_steps  # (None: no time limit)
    probe.close()
    if not continuous:
        raise SystemExit(f"error: {args.env} is not a MuJoCo-style task (vector observations, continuous actions)")
    if not mujoco_task:
        raise SystemExit(f"error: {args.env} is not a MuJoCo task (this script reads and renders MuJoCo's simulator)")
    if args.num_iterations <= args.pretrain_iterations:
        raise SystemExit(
            f"error: --total-timesteps {args.total_timesteps} leaves no RL after {args.pretrain_iterations} "
            f"pretraining rollouts of {args.batch_size} steps; use at least "
            f"{(args.pretrain_iterations + 1) * args.batch_size}"
        )
    if (args.feedback == "scripted") != (args.behaviour is not None):
        raise SystemExit("error: --feedback scripted needs --behaviour, and --behaviour needs --feedback scripted")
    if args.behaviour is not None:
        if args.behaviour not in BEHAVIOURS:
            raise SystemExit(f"error: unknown --behaviour '{args.behaviour}'; known: {', '.join(BEHAVIOURS)}")
        family, obs_size, _ = BEHAVIOURS[args.behaviour]
        if args.env.split("-")[0] != family:
            raise SystemExit(f"error: --behaviour {args.behaviour} is for {family} (e.g. {family}-v4), not {args.env}")
        if obs_shape != (obs_size,):  # e.g. --env-kwargs that add the x position move every index
            raise SystemExit(
                f"error: --behaviour {args.behaviour} reads {family}'s default observation ({obs_size} numbers); "
                f"with --env-kwargs {args.env_kwargs} it has shape {obs_shape}"
            )
        ends_tilted = env_kwargs.get("terminate_when_unhealthy", True) and "healthy_angle_range" not in env_kwargs
        if args.behaviour == "backflip" and ends_tilted:
            print(
                "warning: Hopper ends an episode once its torso tilts 0.2 rad: no episode lasts through a flip; add "
                """--env-kwargs '{"healthy_angle_range": [-1000, 1000]}' (README, "Behaviours without a reward")"""
            )
    if args.feedback == "human":
        if not args.label_server.startswith(("http://", "https://")):
            raise SystemExit(f"error: --label-server must be an http:// or https:// address (got '{args.label_server}')")
        if not 16 <= args.clip_size <= 1024 or not 1 <= args.clip_fps <= 240:
            raise SystemExit("error: --clip-size must be in [16, 1024] and --clip-fps in [1, 240]")
        if run_dir is not None:
            experiment_name(run_dir)
    if args.capture_video and args.video_seconds < 0:
        raise SystemExit(f"error: --video-seconds must be 0 (whole episodes) or positive (got {args.video_seconds})")
    if args.capture_video or args.feedback == "human":
        check_rendering(args.env, env_kwargs)
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
    # gamma 1: a fall's absorbing value, its reward / (1 - gamma), would be 0/0 (README "Episodes that end early")
    if not (0 <= args.gamma < 1 and 0 <= args.gae_lambda <= 1 and args.clip_coef > 0 and args.max_grad_norm > 0):
        raise SystemExit("error: --gamma must be in [0, 1), --gae-lambda in [0, 1], --clip-coef and --max-grad-norm positive")
    # settings that only one kind of teacher reads: given to another, they would be silently ignored (a resumed run's
    # are its own, which it cannot change, but for where its label server is now)
    changed = [name for name, value in vars(args).items() if value != getattr(Args, name)]
    if args.resume:
        changed = [name for name in changed if name in ("label_server", "label_token")]
    human_flags = [name for name in changed if name in ("label_server", "label_token", "instruction", "clip_size", "clip_fps")]
    if args.feedback != "human" and human_flags:
        raise SystemExit(f"error: {flag_list(human_flags)} for --feedback human")
    video_flags = [name for name in changed if name in ("video_format", "video_seconds")]
    if video_flags and not args.capture_video:
        raise SystemExit(f"error: {flag_list(video_flags)} for --capture-video")
    teacher_flags = [name for name in changed if name.startswith("teacher_")]
    if args.feedback == "human" and teacher_flags:
        raise SystemExit(
            f"error: {flag_list(teacher_flags)} for the synthetic and scripted teachers, not for --feedback human"
        )
    ent_coefs = (args.ent_coef, 0.0 if args.ent_coef_final is None else args.ent_coef_final)
    if not all(math.isfinite(coef) for coef in ent_coefs):
        raise SystemExit("error: --ent-coef and --ent-coef-final must be finite numbers")
    if args.feedback == "true-reward":
        return
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
    if not 2 <= args.segment_len <= args.num_steps:
        raise SystemExit(
            f"error: --segment-len {args.segment_len} must be between 2 and the rollout length --num-steps {args.num_steps}"
        )
    if episode_limit is not None and args.segment_len > episode_limit:  # a segment never crosses an episode's end
        raise SystemExit(
            f"error: --segment-len {args.segment_len} is longer than an episode of {args.env} ({episode_limit} steps)"
        )
    if not 0 < args.pretrain_fraction <= 1:
        raise SystemExit("error: --pretrain-fraction must be in (0, 1]")
    if min(args.ensemble_size, args.candidate_multiplier, args.pretrain_epochs, args.pair_pool_rollouts) < 1:
        raise SystemExit(
            "error: --ensemble-size, --candidate-multiplier, --pretrain-epochs and --pair-pool-rollouts must be positive"
        )
    if args.selection == "variance" and args.ensemble_size < 2 and not args.resume:  # one member has no disagreement
        raise SystemExit("error: --selection variance needs --ensemble-size 2 or more (or --selection random)")
    if not 0 <= args.reward_dropout < 1:
        raise SystemExit("error: --reward-dropout must be in [0, 1)")
    if not 0 <= args.label_noise < 1 or not 0 <= args.teacher_epsilon <= 1 or not 0 < args.teacher_gamma <= 1:
        raise SystemExit("error: --label-noise must be in [0, 1), --teacher-epsilon in [0, 1], --teacher-gamma in (0, 1]")
    # a rollout's pairs draw their left and their right segments each without repeats (sample_segments) while it holds
    # twice as many segments as pairs; a segment never crosses an episode's time limit (select_pairs then redraws the
    # right side of a pair that would show one segment twice)
    per_iteration = label_schedule(args)
    capacity = args.num_envs * fewest_segment_starts(args.num_steps, args.segment_len, episode_limit) // 2
    within = f" (episodes of at most {episode_limit} steps)" if episode_limit is not None else ""
    if per_iteration.max() > capacity:
        peak_in_pretraining = per_iteration.argmax() < args.pretrain_iterations
        where, longer = ("a pretraining", "--pretrain-steps") if peak_in_pretraining else ("an RL", "--total-timesteps")
        raise SystemExit(
            f"error: --labels {args.labels} is too large for this run: a rollout can hold as few as {capacity} pairs of "
            f"{args.segment_len}-step segments{within}, and the schedule asks for {per_iteration.max()} in {where} "
            f"rollout. Use fewer labels, a shorter --segment-len, more {longer}, or a longer rollout."
        )


def check_rendering(env_id, env_kwargs):
    """Render one small frame now: clips for people and --capture-video need MuJoCo's offscreen rendering, and a machine
    without it would otherwise fail at the first frame, which a human-feedback run renders after its first rollouts."""
    try:
        env = make_render_env(env_id, 16, env_kwargs)
        env.reset(seed=0)
        env.render()
        env.close()
    except Exception as error:  # e.g. mujoco.FatalError: no OpenGL platform library loaded
        raise SystemExit(
            f"error: MuJoCo cannot render here ({type(error).__name__}: {error}), and --feedback human and "
            "--capture-video need frames. On Linux without a display: install EGL (Debian: apt-get install libegl1) "
            "and set MUJOCO_GL=egl, or install OSMesa (apt-get install libosmesa6) and set MUJOCO_GL=osmesa (slower); "
            "with a display, MUJOCO_GL=glfw"
        ) from None


# RLHF: C17 A.1 label schedule
def label_schedule(args: Args) -> np.ndarray:
    """Labels to query after each iteration's rollout: `pretrain_fraction` of the budget spread over the initial
    policy's rollouts, the rest at a rate proportional to horizon / (T + horizon), T = steps so far. Sums exactly to
    args.labels, whatever --total-timesteps is; at least one label comes before RL (it needs a reward model)."""
    pretrain = min(args.labels, max(1, round(args.labels * args.pretrain_fraction)))
    per_iteration = np.zeros(args.num_iterations, dtype=np.int64)
    per_iteration[: args.pretrain_iterations] = np.diff(np.round(np.linspace(0, pretrain, args.pretrain_iterations + 1)))
    steps_so_far = np.arange(args.pretrain_iterations + 1, args.num_iterations + 1) * args.batch_size
    rate = args.schedule_horizon / (steps_so_far + args.schedule_horizon)
    cumulative = np.round((args.labels - pretrain) * np.cumsum(rate) / rate.sum())
    per_iteration[args.pretrain_iterations :] = np.diff(cumulative, prepend=0)
    return per_iteration


def gif_frame_stride(fps):
    """Keep every k-th frame in a GIF: about 15 frames/s, for a k whose frame time is whole hundredths of a second
    (GIF's unit: Hopper's 125 frames/s keeps every 10th, 80 ms, where every 8th, 64 ms, would play 7% fast)."""
    about = max(1, round(fps / 15))
    whole = [k for k in range(about, 2 * about + 1) if (100 * k) % fps == 0]
    return whole[0] if whole else about


class RecordEpisodeVideo(gym.Wrapper):
    """Saves episodes 0, 1, 8, 27, ... (cubes, then every 1000th) as MP4 or GIF with imageio; renders only those
    episodes (MuJoCo's software rendering is slow: about 15 frames/s at 160x160)."""

    def __init__(self, env, folder, video_format="mp4", seconds=0.0):
        super().__init__(env)
        if not seconds >= 0:  # (nan too: --eval-only runs no validate_args)
            raise SystemExit(f"error: --video-seconds must be 0 (whole episodes) or positive (got {seconds})")
        self.folder, self.video_format, self.episode, self.frames = folder, video_format, -1, None
        self.max_frames = round(seconds * env.metadata.get("render_fps", 30)) + 1 if seconds > 0 else None
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
        if self.frames is not None and len(self.frames) != self.max_frames:
            self.frames.append(self.env.render())
        return result

    def video_path(self, episode):
        return f"{self.folder}/episode-{episode}.{self.video_format}"

    def _flush(self):
        if self.frames:
            fps = self.env.metadata.get("render_fps", 30)
            path = self.video_path(self.episode)
            if self.video_format == "gif":  # every k-th frame, about 15 per second, in real time: small files
                stride = gif_frame_stride(fps)
                imageio.mimsave(path, self.frames[::stride], duration=1000 * stride / fps, loop=0)
            else:
                imageio.mimsave(path, self.frames, fps=fps, macro_block_size=1)
        self.frames = None

    def close(self):
        self._flush()
        super().close()


def make_render_env(env_id, size, env_kwargs):
    """The task rendering size x size frames through its camera that follows the robot ("track": Hopper, Walker2d,
    HalfCheetah, Ant, Swimmer, Humanoid), else through MuJoCo's free camera (gymnasium's default, which stays put)."""
    env = gym.make(env_id, render_mode="rgb_array", width=size, height=size, **env_kwargs)
    if mujoco.mj_name2id(env.unwrapped.model, mujoco.mjtObj.mjOBJ_CAMERA, "track") == -1:
        return env
    env.close()
    return gym.make(env_id, render_mode="rgb_array", width=size, height=size, camera_name="track", **env_kwargs)


def make_env(env_id, idx, capture_video, run_dir, env_kwargs, video_format="mp4", video_seconds=0.0):
    def thunk():
        if capture_video and idx == 0:
            env = make_render_env(env_id, 160, env_kwargs)
            env = RecordEpisodeVideo(env, f"{run_dir}/videos", video_format, video_seconds)
        else:
            env = gym.make(env_id, **env_kwargs)
        env = gym.wrappers.RecordEpisodeStatistics(env)  # innermost: charts/episodic_return is the standard true return
        env = gym.wrappers.ClipAction(env)
        return env

    return thunk


class RunningMeanStd:
    """Running mean and variance (parallel algorithm); used for observation and return normalisation."""

    def __init__(self, shape=()):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, x):
        batch_mean, batch_var, batch_count = x.mean(0), x.var(0), x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        self.var = (self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total) / total
        self.count = total

    def state_dict(self):
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state):
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


def normalize_obs(obs_rms, obs):
    return np.clip((obs - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10).astype(np.float32)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, act_dim), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_std = torch.exp(self.actor_logstd.expand_as(action_mean))
        probs = Normal(action_mean, action_std)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


# RLHF: the reward model (C17 2.2.3, A.1)
class RewardEnsemble(nn.Module):
    """`size` independent MLPs r(observation, action), 2 x 64 with leaky ReLU (C17 A.1), evaluated in one batched call.

    Each member also learns one scalar: the reward of the absorbing state an episode enters when it terminates (a fall),
    so the learned reward, like the true one of C17's fixed-length episodes, decides whether falling is good or bad.
    With `potential` (--reward-potential) each member has a second MLP with the same hidden layers, a potential of the
    observation alone, which only segment returns use (potential_change); it takes no dropout.
    """

    def __init__(self, obs_dim, act_dim, size=3, hidden=64, dropout=0.0, potential=False):
        super().__init__()
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        self._add_layers(self.weights, self.biases, [obs_dim + act_dim, hidden, hidden, 1], size)
        self.absorbing_reward = nn.Parameter(torch.zeros(size))
        self.has_potential = potential
        self.potential_weights, self.potential_biases = nn.ParameterList(), nn.ParameterList()
        if potential:
            self._add_layers(self.potential_weights, self.potential_biases, [obs_dim, hidden, hidden, 1], size)
        # the observations standardised (fit_input_normalization; until then as they are): velocities of size 10 would
        # otherwise drown entries of size 0.1 that carry the reward (Reacher's distance to the target)
        self.register_buffer("input_mean", torch.zeros(obs_dim))
        self.register_buffer("input_std", torch.ones(obs_dim))
        self.register_buffer("input_clip", torch.tensor(math.inf))
        # C17 2.2.1: each member normalised separately, the average scaled to zero mean and a fixed std (fit_normalization)
        self.register_buffer("member_mean", torch.zeros(size))
        self.register_buffer("member_std", torch.ones(size))
        self.register_buffer("ensemble_mean", torch.zeros(()))
        self.register_buffer("ensemble_std", torch.ones(()))
        self.size = size
        self.dropout = dropout  # of the hidden units in training mode (reward_gradient_step), from dropout_generator
        self.dropout_generator = None  # None: the global one
        self.eval()  # predicting: training mode is for the gradient steps only

    @staticmethod
    def _add_layers(weights, biases, sizes, members):
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1 / math.sqrt(fan_in)  # nn.Linear's default initialisation, per member
            weights.append(nn.Parameter(torch.empty(members, fan_in, fan_out).uniform_(-bound, bound)))
            biases.append(nn.Parameter(torch.empty(members, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, obs, act):
        """Raw reward of each member: (..., obs_dim), (..., act_dim) -> (size, ...)."""
        return self._members(torch.cat([self._standardize(obs), act], -1), self.weights, self.biases)

    def potential(self, obs):
        """--reward-potential: each member's potential of observations (..., obs_dim) -> (size, ...)."""
        return self._members(self._standardize(obs), self.potential_weights, self.potential_biases, dropout=False)

    def _standardize(self, obs):
        return ((obs - self.input_mean) / self.input_std).clamp(-self.input_clip, self.input_clip)

    def _members(self, x, weights, biases, dropout=True):
        """Every member's MLP (its `weights` and `biases`) on inputs (..., n) -> (size, ...); with `dropout`, the
        hidden units' dropout of --reward-dropout in training mode."""
        lead = x.shape[:-1]
        x = x.reshape(1, -1, x.shape[-1]).expand(self.size, -1, -1)
        for i, (w, b) in enumerate(zip(weights, biases)):
            x = torch.baddbmm(b, x, w)
            if i < len(weights) - 1:
                x = nn.functional.leaky_relu(x, 0.01)
                if dropout and self.training and self.dropout > 0:
                    x = x * self.dropout_mask(x)
        return x.reshape(self.size, *lead)

    def dropout_mask(self, x):
        """Each unit kept with probability 1 - p and then scaled by 1 / (1 - p), p = --reward-dropout rounded to a
        multiple of 1/256 (exact for rl-teacher's 0.5): one random byte per unit, 8 from each 64-bit draw (bernoulli_
        draws a number per unit: a step took 3.3x as long as one without dropout, now 1.3-1.4x; benchmark/logs/
        reward_dropout_step_time.txt)."""
        dropped = min(round(self.dropout * 256), 255)
        n = x.numel()
        draws = torch.randint(-(2**63), 2**63 - 1, ((n + 7) // 8,), dtype=torch.int64, generator=self.dropout_generator)
        kept = draws.view(torch.uint8)[:n].view(x.shape) >= dropped
        return kept.to(x.dtype) * (256 / (256 - dropped))

    def segment_returns(self, segments, step_rewards=None):
        """Undiscounted predicted return of each segment for each member, (size, ...), from its steps' raw rewards
        (computed here unless given); with --reward-potential, plus the potential's change over the segment."""
        if step_rewards is None:
            step_rewards = self(segments["obs"], segments["act"])
        returns = self.sum_segments(step_rewards, segments["mask"])
        if self.has_potential:
            returns = returns + self.potential_change(segments["obs"], segments["mask"])
        return returns

    def potential_change(self, obs, mask):
        """Each member's potential at each segment's last real step less at its first: obs (..., L, obs_dim) and mask
        (..., L) -> (size, ...). Summed over a segment, a shaping term f(o') - f(o) telescopes to this; the segment's
        last step has no next observation here, so the change stops at the last step's own observation."""
        last = (mask.sum(-1).long() - 1).clamp(min=0)
        last_obs = torch.gather(obs, -2, last[..., None, None].expand(*last.shape, 1, obs.shape[-1])).squeeze(-2)
        return self.potential(last_obs) - self.potential(obs[..., 0, :])

    def sum_segments(self, rewards, mask):
        """Sum step rewards (size, ..., L) over segments; absorbing steps (mask 0) earn the absorbing-state reward."""
        absorbing = self.absorbing_reward.view((self.size,) + (1,) * (rewards.dim() - 2))
        return (rewards * mask).sum(-1) + absorbing * (1 - mask).sum(-1)

    def l2_penalty(self):
        """Sum of squared weights of each member: (size,)."""
        return sum((w**2).sum((1, 2)) for w in [*self.weights, *self.potential_weights])

    @torch.no_grad()
    def fit_input_normalization(self, obs):
        """Standardise observations (n, obs_dim) by these ones' mean and std from now on, clipped to +-10 as PPO's
        are; an entry that did not vary keeps its scale."""
        std = obs.std(0)
        self.input_mean.copy_(obs.mean(0))
        self.input_std.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))
        self.input_clip.fill_(10.0)

    @torch.no_grad()
    def fit_normalization(self, raw, target_std=1.0):
        """Set the normalisation from raw member rewards (size, n) of the steps the teacher has judged."""
        self.member_mean.copy_(raw.mean(1))
        self.member_std.copy_(raw.std(1) + 1e-8)
        averaged = ((raw - self.member_mean[:, None]) / self.member_std[:, None]).mean(0)
        self.ensemble_mean.copy_(averaged.mean())
        self.ensemble_std.copy_((averaged.std() + 1e-8) / target_std)

    def _normalize(self, raw):
        shape = (self.size,) + (1,) * (raw.dim() - 1)
        averaged = ((raw - self.member_mean.view(shape)) / self.member_std.view(shape)).mean(0)
        return (averaged - self.ensemble_mean) / self.ensemble_std

    @torch.no_grad()
    def normalized_reward(self, obs, act):
        """The reward PPO optimises: members normalised, averaged, scaled to zero mean and the target std."""
        return self._normalize(self(obs, act))

    @torch.no_grad()
    def normalized_absorbing_reward(self):
        return self._normalize(self.absorbing_reward).item()


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


# RLHF: segments and pair selection (C17 2.2.4)
def sample_segments(rng, rollout, segment_len, count):
    """Draw `count` segments of `segment_len` steps from a rollout (arrays shaped (steps, envs, ...)).

    A segment may run into a termination: its remaining steps are absorbing steps (mask 0, true reward 0), also where
    they would reach past the end of the rollout. Segments that would cross a time-limit truncation, or run off the
    end of the rollout with no termination before it, are never drawn."""
    obs, act, true_reward = rollout["obs"], rollout["act"], rollout["true_reward"]
    terminated, truncated = rollout["terminated"], rollout["truncated"]
    num_steps, num_envs = true_reward.shape
    # each step's first episode end at or after it, per environment (num_steps where the rollout has none)
    step_index = np.arange(num_steps)[:, None]
    end_steps = np.where(terminated | truncated, step_index, num_steps)
    first_end = np.minimum.accumulate(end_steps[::-1], axis=0)[::-1]
    ends_by_termination = terminated[np.minimum(first_end, num_steps - 1), np.arange(num_envs)]
    # a start is valid if the segment reaches its last step, or a termination, before any other episode end
    last_step = step_index + segment_len - 1
    valid = ((first_end >= last_step) | ends_by_termination) & ((last_step < num_steps) | (first_end < num_steps))
    valid_starts = np.flatnonzero(valid)
    if len(valid_starts) == 0:
        raise RuntimeError("no valid segment in the rollout: use a shorter --segment-len")
    pick = rng.choice(valid_starts, size=count, replace=count > len(valid_starts))
    start, e = np.divmod(pick, num_envs)
    times = start[:, None] + np.arange(segment_len)  # (count, L)
    real = times <= first_end[start, e][:, None]  # the steps after the episode's end are absorbing steps
    t, e, m = np.minimum(times, num_steps - 1), np.broadcast_to(e[:, None], times.shape), real.astype(np.float32)
    segments = {
        "obs": obs[t, e] * m[..., None],
        "act": act[t, e] * m[..., None],
        "mask": m,
        "true_reward": true_reward[t, e] * m,
    }
    if "sim_state" in rollout:  # human feedback: the simulator state at the segment's start, to render it later
        segments["sim_state"] = rollout["sim_state"][t[:, 0], e[:, 0]]
    return segments


def join_rollouts(pair_pool):
    """The pair pool's rollouts side by side, as one rollout with more environments: each column stays one
    environment's stretch of one rollout, so no segment crosses from one rollout into another."""
    rollouts = [rollout for _, rollout in pair_pool]
    return {key: np.concatenate([rollout[key] for rollout in rollouts], axis=1) for key in rollouts[0]}


def index_segments(segments, idx):
    return {k: v[idx] for k, v in segments.items()}


def select_pairs(rng, ensemble, rollout, segment_len, num_pairs, multiplier, selection):
    """C17 2.2.4: draw `multiplier` x more candidate pairs than needed and keep those whose predicted preference
    varies most across the ensemble members (or a random subset for --selection random)."""
    num_candidates = num_pairs * (multiplier if selection == "variance" else 1)
    left = sample_segments(rng, rollout, segment_len, num_candidates)
    right = sample_segments(rng, rollout, segment_len, num_candidates)
    if selection == "variance":
        scores = disagreement(ensemble, left, right)
        keep = np.argsort(-scores, kind="stable")[:num_pairs]
    else:
        keep = np.arange(num_pairs)
    left, right = index_segments(left, keep), index_segments(right, keep)
    for _ in range(3):  # the sides are drawn apart: a pair that would show one clip twice gets another right side
        same = np.flatnonzero(np.all([(left[k] == right[k]).reshape(num_pairs, -1).all(1) for k in ("obs", "act")], 0))
        if len(same) == 0:
            break
        redrawn = sample_segments(rng, rollout, segment_len, len(same))
        for key in right:
            right[key][same] = redrawn[key]
    return left, right


@torch.no_grad()
def disagreement(ensemble, left, right):
    """Variance across members of each member's P[left > right]."""
    returns_left = ensemble.segment_returns(to_torch(left))
    returns_right = ensemble.segment_returns(to_torch(right))
    return torch.sigmoid(returns_left - returns_right).var(0, unbiased=False).numpy()


def stack_segments(segments):
    """A list of single segments (dicts of arrays) -> one dict of arrays with a leading batch axis."""
    return {k: np.stack([s[k] for s in segments]) for k in segments[0]}


def to_torch(segments):
    return {k: torch.as_tensor(v, dtype=torch.float32) for k, v in segments.items()}


def simulator_states(envs):
    """Each environment's MuJoCo positions and velocities: with a segment's actions, what renders it for people."""
    return np.stack([np.concatenate([env.unwrapped.data.qpos, env.unwrapped.data.qvel]) for env in envs.envs])


# RLHF: the teachers. Every teacher has the same small interface, so the training loop never asks which one it has:
#   start() -> the teacher     ask(left, right): queue pairs     poll() -> [(left, right, mu), ...] answered so far
#   pending: pairs asked, not yet handed over by poll()     wait_for_answers(stop) -> False if `stop` or a failure ended it
#   save() / load(consumed_seq_in_labels): the unanswered pairs, with the run     close()
#   consumed_seq: the label server's number of the last answer poll() handed over (0: no server), saved with the labels
#   failure: why the teacher cannot go on (None: it can); the run then stops as at Ctrl-C, saves, and exits with it
# mu = 1 left better, 0 right better, 0.5 equal. A new teacher (e.g. a scripted one, a function of two segments'
# observations, actions and simulator states) needs these methods and a branch in make_teacher.
class SyntheticTeacher:
    """Prefers the segment with more true reward (C17's synthetic labels), optionally with the noise of B-Pref's
    simulated teachers (Lee et al. 2021). It answers when asked. Pairs it skips get no answer (they are not labels: the
    run asks for others later); exact ties, or returns within `equal_margin`, are answered "equal" (mu 0.5)."""

    def __init__(self, rng, beta=float("inf"), gamma=1.0, epsilon=0.0, skip_threshold=float("-inf"), equal_margin=0.0):
        self.rng, self.beta, self.gamma, self.epsilon = rng, beta, gamma, epsilon
        self.skip_threshold, self.equal_margin = skip_threshold, equal_margin
        self.answered = []
        self.pending = 0  # pairs asked but not yet answered: always 0, answers come at once
        self.consumed_seq = 0  # no label server
        self.failure = None  # it always answers

    def preferences(self, true_left, true_right):
        """mu for each pair of true-reward sequences (n, L); NaN where the teacher skips."""
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

    def ask(self, left, right):
        mu = self.preferences(left["true_reward"], right["true_reward"])
        answered = ~np.isnan(mu)
        self.answered.append((index_segments(left, answered), index_segments(right, answered), mu[answered]))

    def poll(self):
        answered, self.answered = self.answered, []
        return answered

    def start(self):
        return self

    def wait_for_answers(self, stop):
        return True  # every pair was answered when asked

    def save(self):
        pass  # nothing is ever unanswered

    def load(self, consumed_seq_in_labels=0):
        pass

    def close(self, run_finished=False):
        pass


# RLHF: behaviours nobody wrote a reward for (C17 3.2), as functions a scripted teacher judges segments by. Each takes a
# batch of segments (obs (n, L, obs_dim), act, mask: 0 after a termination) and scores every step (n, L); the teacher
# prefers the segment with the higher sum. The observations of these tasks (v4 and v5, default keyword arguments) are
# the joint positions without the x position (qpos[1:]) followed by the joint velocities (qvel).
def backflip_steps(segments):
    """Hopper: rotating backwards (the torso's angle decreasing; it increases when the torso leans forward) with the
    torso off the ground (above 0.7 m), so a roll on the ground earns nothing. Needs a task that lets the torso turn
    over: --env-kwargs '{"healthy_angle_range": [-1000, 1000]}' (a fall below 0.7 m still ends the episode). With
    '{"terminate_when_unhealthy": false}' instead, an agent learned to rock: backwards while high, forwards while low
    (benchmark/notes/behaviours_issue23.md)."""
    height, angular_velocity = segments["obs"][..., 0], segments["obs"][..., 7]
    return -angular_velocity * (height > 0.7) * segments["mask"]


def backwards_steps(segments):
    """HalfCheetah: running backwards (the x velocity, qvel[0], negated)."""
    return -segments["obs"][..., 8] * segments["mask"]


def one_leg_steps(segments):
    """Walker2d: standing upright (torso above 0.8 m, tilted less than 0.5 rad) on the right leg with the left foot
    lifted: the left knee bent more than the right (knee angles are 0 straight, negative bent; counted up to 1.5 rad),
    so a crouch on both legs earns nothing; 0 when not upright. (The thighs cannot swing forward: their range is
    -150..0 degrees, so the foot is lifted behind.)"""
    height, angle = segments["obs"][..., 0], segments["obs"][..., 1]
    right_knee, left_knee = segments["obs"][..., 3], segments["obs"][..., 6]
    upright = (height > 0.8) & (np.abs(angle) < 0.5)
    return upright * np.clip(right_knee - left_knee, 0.0, 1.5) * segments["mask"]


BEHAVIOURS = {  # --behaviour: (the environment it is for, the size of the observation it reads, its step scores)
    "backflip": ("Hopper", 11, backflip_steps),
    "backwards": ("HalfCheetah", 17, backwards_steps),
    "one-leg": ("Walker2d", 17, one_leg_steps),
}


class ScriptedTeacher(SyntheticTeacher):
    """Prefers the segment a behaviour function scores higher (C17 3.2's novel behaviours, without people); the same
    answers, noise options and interface as the synthetic teacher, with the behaviour's step scores in place of the
    true reward. A new behaviour is a function of the segments and an entry in BEHAVIOURS."""

    def __init__(self, step_scores, rng, *noise):
        super().__init__(rng, *noise)
        self.step_scores = step_scores

    def ask(self, left, right):
        mu = self.preferences(self.step_scores(left), self.step_scores(right))
        answered = ~np.isnan(mu)
        self.answered.append((index_segments(left, answered), index_segments(right, answered), mu[answered]))


def make_teacher(args, run_dir, rng, env_kwargs):
    """The teacher --feedback names (the one place that asks which teacher the run has)."""
    if args.feedback in ("synthetic", "scripted"):
        noise = (
            args.teacher_beta,
            args.teacher_gamma,
            args.teacher_epsilon,
            args.teacher_skip_threshold,
            args.teacher_equal_margin,
        )
        if args.feedback == "scripted":
            return ScriptedTeacher(BEHAVIOURS[args.behaviour][2], rng, *noise)
        return SyntheticTeacher(rng, *noise)
    teacher = HumanTeacher(
        run_dir, args.env, args.label_server, args.label_token, args.instruction, args.clip_size, args.clip_fps, env_kwargs
    )
    print(f"human feedback: pairs go to {args.label_server}/ (experiment {teacher.experiment}); open it in a browser to label")
    return teacher


# RLHF: the labels, with each member's bootstrap weights and validation split (C17 2.2.3)
class LabelBuffer:
    """Preference labels of the run. Each member weighs each label by a Poisson(1) draw, the online form of a bootstrap
    resample of the labels; the labels its resample leaves out (weight 0, probability 1/e: C17 2.2.3's held-out 1/e)
    are its validation set. The buffer grows if more labels arrive than it was made for: no answer is dropped."""

    def __init__(self, capacity, segment_len, obs_dim, act_dim, ensemble_size, rng):
        self.rng, self.size = rng, 0
        shape = (capacity, 2, segment_len)
        self.data = {
            "obs": np.zeros(shape + (obs_dim,), np.float32),
            "act": np.zeros(shape + (act_dim,), np.float32),
            "mask": np.zeros(shape, np.float32),
            "true_reward": np.zeros(shape, np.float32),
            "mu": np.zeros(capacity, np.float32),
            "is_val": np.zeros((capacity, ensemble_size), bool),
            "weight": np.zeros((capacity, ensemble_size), np.float32),
        }

    def add(self, left, right, mu):
        n = len(mu)
        if self.size + n > len(self.data["mu"]):
            self._grow(self.size + n)
        new = slice(self.size, self.size + n)
        for key in ("obs", "act", "mask", "true_reward"):
            self.data[key][new, 0], self.data[key][new, 1] = left[key], right[key]
        self.data["mu"][new] = mu
        self.data["weight"][new] = self.rng.poisson(1.0, (n, self.data["weight"].shape[1]))
        self.data["is_val"][new] = self.data["weight"][new] == 0
        self.size += n
        return n

    def _grow(self, capacity):
        for key, values in self.data.items():
            grown = np.zeros((capacity,) + values.shape[1:], values.dtype)
            grown[: self.size] = values[: self.size]
            self.data[key] = grown

    def get(self, idx=None):
        """The labels (all, or those at `idx`) as tensors; segments as `left`/`right` dicts."""
        idx = slice(0, self.size) if idx is None else idx
        batch = {k: torch.as_tensor(v[idx]) for k, v in self.data.items()}
        left = {k: batch[k][:, 0] for k in ("obs", "act", "mask")}
        right = {k: batch[k][:, 1] for k in ("obs", "act", "mask")}
        return left, right, batch

    def save(self, path, consumed_seq=0):
        """The labels, and the label server's number of the last answer among them (human feedback; see load)."""
        tmp = path + ".tmp.npz"
        labels = {k: v[: self.size] for k, v in self.data.items()}
        np.savez(tmp, consumed_seq=consumed_seq, **labels)  # uncompressed: zlib cost 40x the time
        os.replace(tmp, path)  # atomic: a run killed while saving keeps the previous file

    def load(self, path):
        """Returns the label server's number of the last answer among the labels (0: none, or a file saved before
        it was kept)."""
        with np.load(path) as saved:
            n = len(saved["mu"])
            if n > len(self.data["mu"]):
                self._grow(n)
            for k in self.data:
                self.data[k][:n] = saved[k]
            consumed_seq = int(saved["consumed_seq"]) if "consumed_seq" in saved else 0
        self.size = n
        return consumed_seq


# RLHF: fitting the reward model to the labels (C17 2.2.3)
def sample_minibatches(buffer, steps, batch_size, rng):
    """`steps` random minibatches of labels, copied out of the buffer (as buffer.get returns them); none from an
    empty buffer."""
    if buffer.size == 0:
        return []
    return [buffer.get(rng.integers(0, buffer.size, min(batch_size, buffer.size))) for _ in range(steps)]


def reward_gradient_step(ensemble, optimizer, minibatch, l2_coef, label_noise):
    """One Adam step on a minibatch of labels; each member's loss uses its own bootstrap weights. Dropout
    (--reward-dropout) is on for this step only."""
    left, right, batch = minibatch
    ensemble.train()
    try:
        losses = preference_loss(ensemble.segment_returns(left), ensemble.segment_returns(right), batch["mu"], label_noise)
    finally:
        ensemble.eval()
    weight = batch["weight"].T  # (members, batch)
    member_loss = (losses * weight).sum(1) / weight.sum(1).clamp(min=1.0)
    loss = (member_loss + l2_coef * ensemble.l2_penalty()).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train_reward_model(ensemble, optimizer, buffer, l2_coef, steps, batch_size, label_noise, rng):
    """`steps` Adam steps on random minibatches of labels, in the calling thread (a run trains in RewardModelTraining;
    tests and benchmark tools call this)."""
    for minibatch in sample_minibatches(buffer, steps, batch_size, rng):
        reward_gradient_step(ensemble, optimizer, minibatch, l2_coef, label_noise)


@torch.no_grad()
def label_step_rewards(ensemble, buffer):
    """Each member's raw reward for every step of every label, (members, labels, 2, L), and the labels as tensors: the
    inputs of validate_reward_model and fit_reward_normalization (RewardModelTraining._round makes the same pass on its
    copy of the labels; tests and benchmark/holdout_split.py call this)."""
    _, _, labels = buffer.get()
    return ensemble(labels["obs"], labels["act"]), labels


@torch.no_grad()
def validate_reward_model(ensemble, step_rewards, labels, label_noise):
    """Each member's training loss (weighted by its bootstrap weights: the loss it was trained on) and validation loss
    (on the labels its bootstrap left out), and the share of held-out strict preferences each member orders correctly
    (averaged over members). Changes nothing."""
    returns = ensemble.segment_returns(labels, step_rewards)  # (members, labels, 2)
    losses = preference_loss(returns[..., 0], returns[..., 1], labels["mu"], label_noise)
    is_val = labels["is_val"].T.float()
    weight = labels["weight"].T
    train_loss = (losses * weight).sum(1) / weight.sum(1).clamp(min=1)
    val_loss = (losses * is_val).sum(1) / is_val.sum(1)  # NaN for a member with no held-out label yet
    correct = ((returns[..., 0] > returns[..., 1]).float() == labels["mu"]).float()
    judged = is_val * (labels["mu"] != 0.5).float()  # "equal" answers have no right order
    val_accuracy = ((correct * judged).sum(1) / judged.sum(1)).nanmean().item()  # members with held-out strict labels
    return train_loss, val_loss, val_accuracy


def fit_reward_normalization(ensemble, step_rewards, labels, target_std):
    """C17 2.2.1: refit the ensemble's normalisation on the steps the teacher has judged (absorbing steps excluded)."""
    ensemble.fit_normalization(step_rewards[:, labels["mask"] > 0], target_std)


def adapt_l2(l2_coef, train_loss, val_loss, low=1.1, high=1.5, factor=1.25):
    """C17 2.2.3: keep each member's validation loss between 1.1x and 1.5x its training loss (a NaN validation
    loss, no held-out label yet, leaves the coefficient as it is)."""
    ratio = val_loss / train_loss.clamp(min=1e-8)
    return torch.where(ratio > high, l2_coef * factor, torch.where(ratio < low, l2_coef / factor, l2_coef))


class RewardModelTraining:
    """The reward model's two copies (RewardEnsembles) and their training, with what it carries from one iteration to
    the next: Adam, each member's L2 coefficient, the rounds so far, the latest validation figures.

    `training_ensemble` trains: before RL on the pretraining labels (`train`), during RL one round of --reward-updates
    steps per iteration in a thread of its own (`start_round`), as C17 2.2 fits the reward model in parallel with RL;
    on a machine with a second core the thread hides the reward model's work. `ensemble` gives PPO its reward and
    scores candidate pairs; it takes the trained weights when the round is done (`finish_round`), so PPO's reward is
    one round behind. Runs stay reproducible: minibatches are drawn in the main thread, and the thread never reads the
    buffer, which the teacher's answers write to."""

    def __init__(self, ensemble, learning_rate, seed=0):
        self.ensemble = ensemble
        self.training_ensemble = copy.deepcopy(ensemble)
        # dropout's masks from a random stream of their own: the thread would draw from the global one in an order
        # that changes from run to run (PPO samples its actions from it); seeded apart from it
        dropout_seed = int(np.random.SeedSequence(seed).spawn(1)[0].generate_state(1, np.uint64)[0])
        self.training_ensemble.dropout_generator = torch.Generator().manual_seed(dropout_seed)
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
        self.finish_round()  # never two rounds at once: they would share the weights and the dropout generator
        for round_in_call in range(1, rounds + 1):
            self.rounds += 1
            validate = self.rounds % args.reward_eval_every == 0 or (validate_at_end and round_in_call == rounds)
            minibatches = sample_minibatches(buffer, steps_per_round, args.reward_batch_size, rng)
            self._take_figures(self._round(minibatches, self.l2_coef, buffer.get()[2] if validate else None, args))
        self.ensemble.load_state_dict(self.training_ensemble.state_dict())

    def start_round(self, buffer, args, rng):
        """During RL: start one round of --reward-updates steps in the thread (after the round before it, if any)."""
        self.finish_round()
        self.rounds += 1
        minibatches = sample_minibatches(buffer, args.reward_updates, args.reward_batch_size, rng)
        validate = self.rounds % args.reward_eval_every == 0
        labels = {k: v.clone() for k, v in buffer.get()[2].items()} if validate else None  # copied: the buffer's are views
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
            reward_gradient_step(self.training_ensemble, self.optimizer, minibatch, l2_coef, args.label_noise)
        if labels is None:
            return None
        with torch.no_grad():
            step_rewards = self.training_ensemble(labels["obs"], labels["act"])
        figures = validate_reward_model(self.training_ensemble, step_rewards, labels, args.label_noise)
        fit_reward_normalization(self.training_ensemble, step_rewards, labels, args.reward_std)
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
        self.finish_round()  # what the next iteration would take first: a resumed run goes on exactly
        return {
            "reward_ensemble": self.training_ensemble.state_dict(),
            "reward_optimizer": self.optimizer.state_dict(),
            "reward_dropout_generator": self.training_ensemble.dropout_generator.get_state(),
            "l2_coef": self.l2_coef,
            "fits": self.rounds,
            "reward_model_figures": (self.train_loss, self.val_loss, self.val_accuracy),
        }

    def load_state_dict(self, state):
        weights = self.training_ensemble.state_dict() | state["reward_ensemble"]  # older checkpoints: raw inputs
        self.training_ensemble.load_state_dict(weights)
        self.ensemble.load_state_dict(weights)
        self.optimizer.load_state_dict(state["reward_optimizer"])
        if "reward_dropout_generator" in state:  # older checkpoints trained without dropout
            self.training_ensemble.dropout_generator.set_state(state["reward_dropout_generator"])
        self.l2_coef = state["l2_coef"]
        if "fits" in state:  # checkpoints from before exact resumption have no counters
            self.rounds, (self.train_loss, self.val_loss, self.val_accuracy) = state["fits"], state["reward_model_figures"]


def pretrain_reward_model(reward_training, buffer, args, rng):
    """C17 A.1: --pretrain-epochs epochs of Adam steps on the pretraining labels before RL starts (each epoch as many
    minibatches as the labels fill, drawn at random with replacement), then a validation pass. First
    the model's inputs are standardised by the observations of the pretraining labels (--reward-input-norm)."""
    if args.reward_input_norm:
        _, _, labels = buffer.get()
        reward_training.training_ensemble.fit_input_normalization(labels["obs"][labels["mask"] > 0])
    epoch_steps = math.ceil(buffer.size / args.reward_batch_size)
    reward_training.train(buffer, args.pretrain_epochs, epoch_steps, args, rng, validate_at_end=True)
    print(
        f"reward model pretrained on {buffer.size} labels: val accuracy {reward_training.val_accuracy:.2f}, "
        f"train loss {reward_training.train_loss.mean():.3f}, val loss {reward_training.val_loss.nanmean():.3f}"
    )


def no_pretraining_label_error(args: Args, run_dir: str) -> str:
    """The message of a run whose pretraining pairs all went unanswered: RL would start without a reward to learn."""
    if args.feedback == "human":
        why = "people answered 'can't tell' to every pair"
        again = f"--resume {run_dir} asks for them again" if args.save_model else "a new run asks again (no --save-model)"
        fix = f"{again}; a clearer --instruction or a longer --segment-len in a new run may make the clips easier to compare"
    else:
        threshold = args.teacher_skip_threshold
        why = f"the {args.feedback} teacher skipped every pair (both returns below --teacher-skip-threshold {threshold})"
        fix = "start a new run with a lower --teacher-skip-threshold"
    return f"error: pretraining ended with no preference label, so there is no reward to learn: {why}. {fix}"


# PPO change (README "Changes to PPO"): CleanRL's reward scaling (gym's NormalizeReward), applied to whichever reward
# PPO gets, the learned one included; the wrapper could only scale the environment's reward
def update_return_scale(return_rms, rewards, dones, running_return, gamma):
    """Add a rollout's rewards to each environment's running discounted return (`running_return`, in place) and to
    its statistics (`return_rms`); returns the scale PPO divides rewards by: the std of that return."""
    returns = np.zeros_like(rewards)
    for t in range(len(rewards)):
        running_return[:] = running_return * gamma + rewards[t]
        returns[t] = running_return
        running_return[dones[t]] = 0.0
    return_rms.update(returns.reshape(-1))
    return np.sqrt(return_rms.var + 1e-8)


# PPO change (README "Changes to PPO"): a time limit is not a fall, so it is bootstrapped, not ended
def truncation_values(agent, obs_rms, infos, terminated, truncated, device):
    """The critic's value of the state each environment's episode was cut at by its time limit (0 elsewhere)."""
    values = np.zeros(len(truncated), np.float32)
    if "final_obs" not in infos:  # no episode ended at this step
        return values
    cut = infos["_final_obs"] & truncated & ~terminated
    if cut.any():
        final_obs = normalize_obs(obs_rms, np.stack(infos["final_obs"][cut]))
        with torch.no_grad():
            values[cut] = agent.get_value(torch.as_tensor(final_obs).to(device)).flatten().cpu().numpy()
    return values


# PPO change (README "Changes to PPO"), opt-in: the entropy bonus falls linearly over the run, as the learning rate does
def entropy_coefficient(args: Args, iteration: int) -> float:
    """The entropy bonus's coefficient in `iteration` (1-based): --ent-coef throughout, or with --ent-coef-final set,
    the value on the line from --ent-coef at the first iteration towards --ent-coef-final after the last."""
    if args.ent_coef_final is None:
        return args.ent_coef
    frac = 1.0 - (iteration - 1.0) / args.num_iterations  # --anneal-lr's fraction
    return args.ent_coef_final + frac * (args.ent_coef - args.ent_coef_final)


# RLHF: ask the teacher, store its answers
def query_labels(rng, ensemble, teacher, buffer, rollout, labels_due, selection, args):
    """Ask the teacher for the labels the schedule has due so far, less those held or on their way (a resumed run asks
    nothing twice; pairs the teacher skipped are replaced by new ones), then store every answer received. A synthetic
    or scripted teacher answers at once: the pairs it skips are replaced here, from this rollout, until the labels due
    are held or 10 times as many pairs as were lacking have been asked (it skips nearly all of this rollout's);
    people's at the next call."""
    to_ask = labels_due - buffer.size - teacher.pending
    pairs_left = 10 * to_ask
    while to_ask > 0 and pairs_left > 0:
        left, right = select_pairs(rng, ensemble, rollout, args.segment_len, to_ask, args.candidate_multiplier, selection)
        teacher.ask(left, right)
        store_answers(teacher, buffer)
        pairs_left -= to_ask
        to_ask = labels_due - buffer.size - teacher.pending  # (people's: on their way, so 0)
    store_answers(teacher, buffer)  # answers that came in since the last call (none more after the loop's)


def store_answers(teacher, buffer):
    for left, right, mu in teacher.poll():
        buffer.add(left, right, mu)


# RLHF: the reward PPO optimises
def anchor_at_absorbing(rewards, absorbing_reward):
    """Shift the normalised learned reward by one constant so that the absorbing (fallen) state earns 0, as under the
    true reward. Bradley-Terry fixes only differences of summed rewards, so every preference the model predicts and
    the optimal policy stay the same (README "Episodes that end early"). Returns (shifted step rewards, the absorbing
    state's reward: 0)."""
    return rewards - absorbing_reward, 0.0


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


def learned_reward_for_ppo(ensemble, raw_obs, actions, dones, episode_returns, anchor):
    """The reward PPO optimises for a rollout (steps, envs), in one batched call: the ensemble's normalised reward,
    with `anchor` shifted so that the absorbing state earns 0. Returns (step rewards, the absorbing state's reward,
    the learned returns of the episodes that ended in the rollout, to set beside their true returns)."""
    rewards = ensemble.normalized_reward(torch.as_tensor(raw_obs), torch.as_tensor(actions)).numpy()
    absorbing_reward = ensemble.normalized_absorbing_reward()
    if anchor:  # the fallen state earns 0: return scaling and the critic see what the baseline sees
        rewards, absorbing_reward = anchor_at_absorbing(rewards, absorbing_reward)
    return rewards, absorbing_reward, finish_episode_returns(rewards, dones, episode_returns)


def log_reward_model(writer, global_step, reward_training, buffer, teacher, learned_rewards, true_rewards, label_budget):
    """RLHF: the reward model's figures and the label counts, to TensorBoard; returns them for the progress line."""
    constant = learned_rewards.std() == 0 or true_rewards.std() == 0  # e.g. InvertedPendulum: the true reward is 1
    correlation = math.nan if constant else np.corrcoef(learned_rewards.ravel(), true_rewards.ravel())[0, 1]
    writer.add_scalar("reward_model/loss", reward_training.train_loss.mean().item(), global_step)
    writer.add_scalar("reward_model/val_loss", reward_training.val_loss.nanmean().item(), global_step)
    writer.add_scalar("reward_model/val_accuracy", reward_training.val_accuracy, global_step)
    writer.add_scalar("reward_model/l2", reward_training.l2_coef.mean().item(), global_step)
    writer.add_scalar("reward_model/true_correlation", correlation, global_step)
    # the learned reward of a fall on C17's zero-mean scale (before --anchor-absorbing shifts it to 0)
    writer.add_scalar("reward_model/absorbing_reward", reward_training.ensemble.normalized_absorbing_reward(), global_step)
    writer.add_scalar("labels/total", buffer.size, global_step)
    writer.add_scalar("labels/pending", teacher.pending, global_step)
    return f", labels {buffer.size}/{label_budget}, val acc {reward_training.val_accuracy:.2f}, corr {correlation:.2f}"


# =====================================================================================================================
# Infrastructure: the human teacher (C17 appendix B). Clips are rendered from the saved simulator states, encoded and
# sent to label_server.py by a background thread; answers come back over HTTP. Readers of the synthetic path can skip
# this block.
# =====================================================================================================================
MU_OF_CHOICE = {"left": 1.0, "right": 0.0, "equal": 0.5}  # "cant_tell" is dropped (C17 2.2.2)
MISSING = object()  # what HumanTeacher._request returns for a 404 where the caller expects one


class HumanTeacher:
    """People answer in a browser, through label_server.py. The teachers' interface (see SyntheticTeacher). ask() only
    queues; a background thread renders each pair's clips (restoring the simulator state saved with the segment and
    replaying its actions offscreen), uploads them, posts the pair and polls for answers, retrying with backoff while
    the server is down, so training goes on while people label (C17 2.2: asynchronous). Pairs not yet answered are
    saved with the run ({run_dir}/pending_pairs.npz) and asked again when it resumes. The run's pairs on the server
    are its experiment, named after the run folder."""

    def __init__(
        self,
        run_dir,
        env_id,
        server,
        token,
        instruction,
        clip_size=320,
        clip_fps=30,
        env_kwargs=None,
        poll_interval=2.0,
        pair_check_interval=30.0,
    ):
        self.env_id, self.env_kwargs = env_id, env_kwargs or {}
        self.experiment = experiment_name(run_dir)
        self.pending_path = os.path.join(run_dir, "pending_pairs.npz")
        self.server, self.token = server.rstrip("/"), token
        self.instruction, self.clip_size, self.clip_fps, self.poll_interval = instruction, clip_size, clip_fps, poll_interval
        self.pair_check_interval = pair_check_interval
        self.lock = threading.Lock()
        self.queued = []  # pair ids still to render, upload and post
        self.waiting = {}  # pair id -> (left, right) segments: asked, not yet answered
        self.answered = []  # (pair id, mu) received, not yet handed over by poll()
        self.next_index = 0  # pair ids are {experiment}-{start}-{index}
        # new in each process: a run killed after posting pairs it had not saved asks other pairs under new ids (the
        # server keeps those ids' clips, metadata and answers); 64 random bits: two processes practically never draw the same
        self.start_id = os.urandom(8).hex()
        self.consumed_seq = 0  # label sequence number up to which answers are in the label buffer
        self.received_seq = 0  # label sequence number up to which the thread has fetched answers
        self.taken_seq = 0  # label sequence number up to which poll() has taken every fetched answer
        self.resumed = False  # load() found the pairs of a stopped run
        self.failure = None  # an error the thread cannot retry (e.g. rendering unavailable)
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
            for i in range(len(left["mask"])):
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
        """Block until every asked pair is answered (the pretraining labels RL cannot start without), or `stop` is set
        or the thread stopped (then returns False)."""
        last = 0.0
        while self.unanswered and self.failure is None and not stop.is_set():
            if time.time() - last > progress_every:
                still_to_upload = len(self.queued)
                print(
                    f"waiting for {self.unanswered} labels: label them at {self.server}/ ({still_to_upload} pairs still to upload)"
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

    def _render(self, render_env, segment):
        """Frames of one segment: the saved simulator state, then the state after each of its actions (L + 1 frames:
        every action the teacher judges, the last one's outcome too); after a termination the last frame (the fall)
        is held for the absorbing steps."""
        model = render_env.unwrapped.model
        render_env.unwrapped.set_state(segment["sim_state"][: model.nq], segment["sim_state"][model.nq :])
        frames = [render_env.unwrapped.render()]
        for t in range(len(segment["mask"])):
            if segment["mask"][t]:
                render_env.unwrapped.step(segment["act"][t])
                frames.append(render_env.unwrapped.render())
            else:
                frames.append(frames[-1])
        return frames

    def _encode(self, frames):
        """WebM/VP9 bytes: plays in Chromium and Firefox."""
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
            render_env = make_render_env(self.env_id, self.clip_size, self.env_kwargs)
            render_env.reset(seed=0)
            last_poll, last_check = 0.0, time.time()
            while not self.stop.is_set():
                with self.lock:
                    pair_id = self.queued[0] if self.queued else None
                    segments = self.waiting.get(pair_id)
                if pair_id is not None:
                    left, right = segments
                    for side, segment in (("left", left), ("right", right)):
                        clip = self._encode(self._render(render_env, segment))
                        self._request("PUT", f"/api/clips/{pair_id}-{side}", clip, "video/webm")
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
            render_env.close()
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
        """Stop the thread. A stopped run saves the pairs nobody has answered yet (asked again on --resume). A finished
        run fetches the answers given since the thread's last fetch (poll() hands them over, for the labels it saves)
        and closes its other pairs on the server (raters get other runs' pairs)."""
        self.stop.set()
        if self.thread.is_alive():  # never started: nothing to wait for
            self.thread.join(timeout=60)
        if not run_finished:
            self.save()
            print(f"{self.pending} pairs not yet in the label buffer saved to {self.pending_path} (asked again on --resume)")
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
        with self.lock:
            ids = list(self.waiting)
            state = {"pair_ids": np.array(ids, dtype=str), "next_index": self.next_index, "consumed_seq": self.consumed_seq}
            # where a resumed run fetches again: below consumed_seq while answers it must drop are still to come (load)
            state["fetch_from"] = min(self.consumed_seq, self.taken_seq)
            for side, which in (("left", 0), ("right", 1)):
                for key in ("obs", "act", "mask", "true_reward", "sim_state"):
                    values = [self.waiting[i][which][key] for i in ids]
                    state[f"{side}_{key}"] = np.stack(values) if values else np.zeros(0, np.float32)
        np.savez_compressed(self.pending_path + ".tmp.npz", **state)
        os.replace(self.pending_path + ".tmp.npz", self.pending_path)

    def load(self, consumed_seq_in_labels=0):
        """Asked-but-unanswered pairs of a stopped run: asked again (re-posting a pair is harmless). A run killed
        after saving its labels and before this file lists pairs as unanswered whose answers are in the labels (up to
        `consumed_seq_in_labels`, from LabelBuffer.load): poll() drops those answers when they arrive again."""
        if os.path.exists(self.pending_path):
            self.resumed = True
            with np.load(self.pending_path) as state:
                self.next_index, self.consumed_seq = int(state["next_index"]), int(state["consumed_seq"])
                fetch_from = int(state["fetch_from"]) if "fetch_from" in state else self.consumed_seq
                self.received_seq = self.taken_seq = fetch_from
                for n, pair_id in enumerate(state["pair_ids"]):
                    left, right = (
                        {k: state[f"{side}_{k}"][n] for k in ("obs", "act", "mask", "true_reward", "sim_state")}
                        for side in ("left", "right")
                    )
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
# Infrastructure: checkpoints, resuming, stopping, evaluating a saved agent
# =====================================================================================================================
def save_checkpoint(path, args, agent, optimizer, obs_rms, return_rms, reward_training, envs, rng, progress):
    """Everything needed to evaluate the agent or resume the run after its last completed iteration. `progress`: that
    iteration, its step count, the observation the next step starts from, each environment's running return and its
    episode's learned return so far, the pair pool, the last 10 episodes' true and learned returns (the progress line's
    means)."""
    iteration, global_step, next_obs_raw, running_return, predicted_episode_return, pair_pool, recent = progress
    state = {
        "args": vars(args),
        "agent": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "obs_rms": obs_rms.state_dict(),
        "return_rms": return_rms.state_dict(),
        **(reward_training.state_dict() if reward_training else {"reward_ensemble": None, "reward_optimizer": None}),
        "global_step": global_step,
        "iteration": iteration,
        # what makes a resumed run continue as if it had never stopped: the episodes in progress, every random
        # stream, the running statistics and counters
        "environments": environment_states(envs),
        "next_obs_raw": next_obs_raw,
        "random": random_states(rng, next(agent.parameters()).device),
        "running_return": running_return,
        "predicted_episode_return": predicted_episode_return,
        "pair_pool": [(i, rollout) for i, rollout in pair_pool if i <= iteration],  # not a stopped iteration's rollout
        "recent_returns": [returns[-10:] for returns in recent],
    }
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # atomic: a run killed while saving keeps the old one


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
    --eval-only, --eval-episodes, the video flags), and where its label server is now (--label-server, --label-token,
    when given). Any other flag given (set away from its default, or named in `argv`, the command line) that differs
    from the run's own is refused, not dropped, and so is a checkpoint with settings this script does not have (another
    script's run), and a labelled run's checkpoint without its labels (save_labels writes them before every
    checkpoint)."""
    from_command_line = ("resume", "eval_only", "eval_episodes", "capture_video", "video_format", "video_seconds")
    saved = {"reward_input_norm": False, **checkpoint["args"]}  # saved before the flag: its reward model reads raw inputs
    unknown = sorted(set(saved) - set(vars(args)))
    if unknown:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in unknown)
        raise SystemExit(f"error: {args.resume} is not a run of this script (its settings have {flags})")
    defaults = vars(Args())
    named = flags_on_command_line(argv)
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
    video_flags = [name for name in ("video_format", "video_seconds") if name in given]
    if video_flags and not args.capture_video:  # (validate_args does not see them on a resume, nor runs for --eval-only)
        raise SystemExit(f"error: {flag_list(video_flags)} for --capture-video")
    labels_path = os.path.join(args.resume, "labels.npz")
    if saved["feedback"] != "true-reward" and not args.eval_only and not os.path.isfile(labels_path):
        raise SystemExit(f"error: {args.resume} has a checkpoint but not the labels saved with it ({labels_path})")
    return Args(**{**saved, **given, **{name: getattr(args, name) for name in from_command_line}})


def restore_checkpoint(checkpoint, agent, optimizer, obs_rms, return_rms, reward_training):
    """The networks, optimisers and statistics of a checkpoint; returns (the first iteration to run, its step count)."""
    agent.load_state_dict(checkpoint["agent"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    obs_rms.load_state_dict(checkpoint["obs_rms"])
    return_rms.load_state_dict(checkpoint["return_rms"])
    if reward_training:
        reward_training.load_state_dict(checkpoint)
    return checkpoint["iteration"] + 1, checkpoint["global_step"]


def video_recorder(env):
    """The environment's RecordEpisodeVideo (environment 0's with --capture-video), or None."""
    while not isinstance(env, RecordEpisodeVideo):
        if not isinstance(env, gym.Wrapper):
            return None
        env = env.env
    return env


EPISODE_COUNTERS = ("_elapsed_steps", "episode_returns", "episode_lengths", "episode_count")  # TimeLimit, statistics


# the bodies' poses as a step leaves them (mj_step, then mj_rnePostConstraint: those of its last substep's start), which
# some tasks read before they simulate (Ant's torso, Humanoid's centre of mass, Reacher-v4's fingertip): recomputed
# from the restored state, they gave a resumed run's first step another reward
BODY_POSES = (
    "xpos",
    "xquat",
    "xmat",
    "xipos",
    "ximat",
    "subtree_com",
    "cinert",
    "geom_xpos",
    "geom_xmat",
    "site_xpos",
    "site_xmat",
    "cam_xpos",
    "cam_xmat",
    "light_xpos",
    "light_xdir",
)  # fmt: skip (cameras, lights: its frame)


def environment_states(envs):
    """Each environment's episode in progress: MuJoCo's integration state (positions, velocities, solver warm start,
    ...) and the bodies' poses, its random generator, the time-limit and episode-statistics counters (the episode count
    numbers videos)."""
    states = []
    for env in envs.envs:
        sim = env.unwrapped
        physics = np.empty(mujoco.mj_stateSize(sim.model, mujoco.mjtState.mjSTATE_INTEGRATION))
        mujoco.mj_getState(sim.model, sim.data, physics, mujoco.mjtState.mjSTATE_INTEGRATION)
        poses = {name: getattr(sim.data, name).copy() for name in BODY_POSES}
        counters = {name: env.get_wrapper_attr(name) for name in EPISODE_COUNTERS}
        states.append({"physics": physics, "poses": poses, "np_random": sim.np_random.bit_generator.state, **counters})
    return states


def restore_environment_states(envs, states):
    for env, state in zip(envs.envs, states):
        sim = env.unwrapped
        mujoco.mj_setState(sim.model, sim.data, state["physics"], mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(sim.model, sim.data)  # the body positions a frame is drawn from (else the reset pose's)
        for name, pose in state.get("poses", {}).items():  # (not in checkpoints before 2026-12-04)
            if getattr(sim.data, name).shape == pose.shape:  # (another MuJoCo's model: as mj_forward left it)
                getattr(sim.data, name)[:] = pose
        sim.np_random.bit_generator.state = state["np_random"]
        for name in EPISODE_COUNTERS:
            if name in state:  # (episode_count: not in checkpoints before 2026-12-02)
                env.set_wrapper_attr(name, state[name])
        if (recorder := video_recorder(env)) and "episode_count" in state:  # videos number on from the saved ones
            episode = state["episode_count"]  # under way: filmed on only if the stop saved no clip of it (a kill saves none)
            recorder.renumber(episode, record=not os.path.exists(recorder.video_path(episode)))
        elif recorder:  # a checkpoint from before 2026-12-02 (no episode count): on after the videos there, not over them
            saved = [re.fullmatch(r"episode-(\d+)\.\w+", name) for name in os.listdir(recorder.folder)]
            recorder.renumber(max([int(found[1]) for found in saved if found], default=-1) + 1, record=False)


def random_states(rng, device):
    """Every random stream the run draws from: segments, teacher and bootstrap (rng), PPO's minibatches (np.random),
    the policy's actions (torch, or the GPU's with --cuda); the reward model's dropout stream is saved with it
    (RewardModelTraining.state_dict)."""
    return {
        "rng": rng.bit_generator.state,
        "np.random": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
        "random": random.getstate(),
    }


def restore_random_states(rng, states):
    rng.bit_generator.state = states["rng"]
    np.random.set_state(states["np.random"])
    torch.set_rng_state(states["torch"])
    if states.get("cuda") is not None and torch.cuda.is_available():  # checkpoints before 2026-12-02 have no "cuda"
        torch.cuda.set_rng_state_all(states["cuda"])
    random.setstate(states["random"])


def stop_on_signals():
    """Ctrl-C, `kill`, `timeout` or a cluster's scheduler (SIGTERM) set the returned flag: the training loop stops at
    the end of the iteration in progress, where everything a resumed run needs is consistent. A second Ctrl-C stops at
    once, without saving; one within a second of the first is the same stop, and so is any SIGTERM after the first."""
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


def evaluate(checkpoint_path, args, video_dir=None):
    """The saved agent acting with its mean action for --eval-episodes episodes: its true returns (the environment's
    reward, with --env-kwargs) and, for a --behaviour run, the behaviour's score summed over each episode; with
    video_dir, episodes 0, 1, 8, ... are saved as clips in `video_dir/videos` (--capture-video), in place of the clips an
    earlier evaluation left there."""
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    env_kwargs = json.loads(args.env_kwargs)
    if video_dir is not None:
        check_rendering(args.env, env_kwargs)
        earlier_clips = os.listdir(f"{video_dir}/videos") if os.path.isdir(f"{video_dir}/videos") else []
        for name in earlier_clips:  # an earlier evaluation's: left, they would show more episodes, or a less trained agent
            if re.fullmatch(r"episode-\d+\.(mp4|gif)", name):
                os.remove(f"{video_dir}/videos/{name}")
    env = make_env(args.env, 0, video_dir is not None, video_dir, env_kwargs, args.video_format, args.video_seconds)()
    obs_rms = RunningMeanStd()
    obs_rms.load_state_dict(checkpoint["obs_rms"])
    agent = Agent(env.observation_space.shape[0], env.action_space.shape[0])
    agent.load_state_dict(checkpoint["agent"])
    returns, behaviour_scores = [], []
    for episode in range(args.eval_episodes):
        obs, _ = env.reset(seed=args.seed + episode)
        done, observations, actions = False, [], []
        while not done:
            with torch.no_grad():
                action = agent.actor_mean(torch.as_tensor(normalize_obs(obs_rms, obs[None]))).numpy()[0]
            observations.append(obs)
            actions.append(action)
            action = np.clip(action, env.unwrapped.action_space.low, env.unwrapped.action_space.high)  # as executed
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        returns.append(float(info["episode"]["r"]))
        if args.behaviour is not None:  # the whole episode as one segment
            episode_segment = {"obs": np.array([observations]), "act": np.array([actions]), "mask": np.ones((1, len(actions)))}
            behaviour_scores.append(float(BEHAVIOURS[args.behaviour][2](episode_segment).sum()))
    env.close()
    return returns, behaviour_scores


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
        video_dir = f"{args.resume}/eval" if args.capture_video else None  # Infrastructure: clips in runs/NAME/eval/videos
        returns, behaviour_scores = evaluate(f"{args.resume}/checkpoint.pt", args, video_dir)
        print(f"eval: {len(returns)} episodes of {args.env}: true return {np.mean(returns):.1f} +- {np.std(returns):.1f}")
        if behaviour_scores:
            print(f"eval: {args.behaviour} score {np.mean(behaviour_scores):.1f} +- {np.std(behaviour_scores):.1f}")
        sys.exit(0)
    run_dir = (
        os.path.normpath(args.resume) if args.resume else f"runs/{args.env}__{args.exp_name}__{args.seed}__{int(time.time())}"
    )
    fill_runtime_fields(args)
    validate_args(args, run_dir)
    rlhf = args.feedback != "true-reward"
    env_kwargs = json.loads(args.env_kwargs)
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
        [
            make_env(args.env, i, args.capture_video, run_dir, env_kwargs, args.video_format, args.video_seconds)
            for i in range(args.num_envs)
        ],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    # RLHF: the bounds ClipAction clips to (gymnasium 1.x's ClipAction declares an unbounded space of its own)
    action_low, action_high = envs.envs[0].unwrapped.action_space.low, envs.envs[0].unwrapped.action_space.high

    agent = Agent(obs_dim, act_dim).to(device)
    # PPO change (README "Changes to PPO"): speed only: Adam's fused kernel, no argument checks in Normal
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    torch.distributions.Distribution.set_default_validate_args(False)
    obs_rms, return_rms = RunningMeanStd((obs_dim,)), RunningMeanStd()  # PPO change (README "Changes to PPO")

    # RLHF: the label schedule, the reward ensemble and its training, the labels, the teacher
    schedule = label_schedule(args) if rlhf else np.zeros(args.num_iterations, np.int64)
    pretrain_labels = int(schedule[: args.pretrain_iterations].sum())
    labels_path = f"{run_dir}/labels.npz"
    ensemble = reward_training = buffer = teacher = None
    if rlhf:
        ensemble = RewardEnsemble(
            obs_dim, act_dim, args.ensemble_size, dropout=args.reward_dropout, potential=args.reward_potential
        )
        reward_training = RewardModelTraining(ensemble, args.reward_lr, args.seed)
        buffer = LabelBuffer(args.labels, args.segment_len, obs_dim, act_dim, args.ensemble_size, rng)
        teacher = make_teacher(args, run_dir, rng, env_kwargs)

    start_iteration, global_step = 1, 0
    checkpoint_path = f"{run_dir}/checkpoint.pt"
    if checkpoint is not None:  # Infrastructure: resume
        start_iteration, global_step = restore_checkpoint(checkpoint, agent, optimizer, obs_rms, return_rms, reward_training)
        if rlhf:
            load_labels(buffer, teacher, labels_path)
        print(f"resumed {run_dir} at step {global_step} with {buffer.size if rlhf else 0} labels")

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim)).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs, act_dim)).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)
    # PPO change (README "Changes to PPO"): episode ends kept apart, and the value of the state a time limit cut at
    terminations = np.zeros((args.num_steps, args.num_envs), bool)
    truncations = np.zeros((args.num_steps, args.num_envs), bool)
    bootstrap = np.zeros((args.num_steps, args.num_envs), np.float32)
    running_return = np.zeros(args.num_envs)
    # RLHF: what segments are made of: raw observations, true rewards (for the synthetic teacher and the logs), and,
    # with --feedback human, the simulator state before each step (to render a segment for people)
    raw_obs = np.zeros((args.num_steps, args.num_envs, obs_dim), np.float32)
    true_rewards = np.zeros((args.num_steps, args.num_envs), np.float32)
    sim_states = np.zeros((args.num_steps, args.num_envs) + simulator_states(envs).shape[1:])
    predicted_episode_return = np.zeros(args.num_envs)
    pair_pool = collections.deque(maxlen=args.pair_pool_rollouts)  # RLHF: (iteration, rollout): where pairs are drawn

    # TRY NOT TO MODIFY: start the game
    if rlhf:
        teacher.start()
    start_time, start_step, last_label_save = time.time(), global_step, time.time()
    next_obs_raw, _ = envs.reset(seed=args.seed)
    if checkpoint is not None and "environments" in checkpoint:  # Infrastructure: resume where the run stopped
        restore_environment_states(envs, checkpoint["environments"])
        restore_random_states(rng, checkpoint["random"])
        next_obs_raw, running_return[:] = checkpoint["next_obs_raw"], checkpoint["running_return"]
        predicted_episode_return[:] = checkpoint.get("predicted_episode_return", np.nan)  # NaN: not saved before
        pair_pool.extend(checkpoint.get("pair_pool", []))
    else:
        obs_rms.update(next_obs_raw)
    next_obs = torch.Tensor(normalize_obs(obs_rms, next_obs_raw)).to(device)
    recent_returns, recent_predicted = [], []  # the last episodes' true and learned returns, for the progress line
    if checkpoint is not None and "recent_returns" in checkpoint:  # Infrastructure: resume the progress line's means
        recent_returns, recent_predicted = (list(returns) for returns in checkpoint["recent_returns"])
    # Infrastructure: the last iteration whose update finished, and its step count: what a checkpoint resumes after
    completed, completed_step = start_iteration - 1, global_step
    stop_requested = stop_on_signals()  # Infrastructure: Ctrl-C or SIGTERM stop at the end of an iteration
    error = None
    checkpoint_kept = False  # Infrastructure: a labelled run stopped before its reward model is pretrained (in a
    # person's label wait, or with no label at all) keeps the checkpoint from before its last pretraining rollout
    # (written as that rollout begins): --resume acts it again

    def checkpoint_now():  # Infrastructure
        recent = (recent_returns, recent_predicted)
        progress = (completed, completed_step, next_obs_raw, running_return, predicted_episode_return, pair_pool, recent)
        save_checkpoint(checkpoint_path, args, agent, optimizer, obs_rms, return_rms, reward_training, envs, rng, progress)

    for iteration in range(start_iteration, args.num_iterations + 1):
        if stop_requested.is_set() or (rlhf and teacher.failure):  # Infrastructure: Ctrl-C, SIGTERM, the label server
            break
        if rlhf and args.save_model and iteration == args.pretrain_iterations:  # Infrastructure:
            save_labels(buffer, teacher, labels_path)  # see checkpoint_kept
            checkpoint_now()
        pretraining = iteration <= args.pretrain_iterations  # RLHF: the initial policy only collects labels
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow
        ent_coef_now = entropy_coefficient(args, iteration)  # PPO change (README "Changes to PPO"): constant by default

        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            raw_obs[step] = next_obs_raw  # RLHF
            if args.feedback == "human":  # RLHF: people watch segments, rendered from the simulator state
                sim_states[step] = simulator_states(envs)

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs_raw, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
            true_rewards[step], terminations[step], truncations[step] = reward, terminated, truncated
            bootstrap[step] = truncation_values(agent, obs_rms, infos, terminated, truncated, device)  # PPO change
            if "final_info" in infos and "episode" in infos["final_info"]:  # gymnasium 1.x: a dict with an _episode mask
                for i in np.flatnonzero(infos["final_info"]["_episode"]):
                    recent_returns.append(float(infos["final_info"]["episode"]["r"][i]))
                    writer.add_scalar("charts/episodic_return", infos["final_info"]["episode"]["r"][i], global_step)
                    writer.add_scalar("charts/episodic_length", infos["final_info"]["episode"]["l"][i], global_step)
            obs_rms.update(next_obs_raw)  # PPO change (README "Changes to PPO"): the script's own normalisation
            next_obs = torch.Tensor(normalize_obs(obs_rms, next_obs_raw)).to(device)

        # RLHF: the actions the environment executed (ClipAction): what the teacher and the reward model judge
        rollout_actions = np.clip(actions.cpu().numpy(), action_low, action_high)
        if rlhf:
            # RLHF: ask for the labels the schedule has due (C17 A.1). Pairs where the members disagree most (C17 2.2.4);
            # before RL the members are untrained and their disagreement is noise: random pairs. Candidates come from the
            # pair pool: this rollout and, with --pair-pool-rollouts above 1, the ones before it
            rollout = {"obs": raw_obs, "act": rollout_actions, "true_reward": true_rewards}
            rollout |= {"terminated": terminations, "truncated": truncations}
            if args.feedback == "human":
                rollout["sim_state"] = sim_states
            pair_pool.append((iteration, {key: value.copy() for key, value in rollout.items()}))
            selection = "random" if pretraining else args.selection
            reward_training.finish_round()  # the round the thread ran during the last iteration: its weights score pairs
            labels_due = int(schedule[:iteration].sum())
            query_labels(rng, ensemble, teacher, buffer, join_rollouts(pair_pool), labels_due, selection, args)
            if iteration == args.pretrain_iterations:  # RLHF: C17 A.1: the reward model is fitted before RL starts
                if teacher.pending:  # Infrastructure: the pairs people are asked, saved in case the wait is killed
                    save_labels(buffer, teacher, labels_path)
                if not teacher.wait_for_answers(stop_requested):  # people label asynchronously; RL needs these
                    checkpoint_kept = True  # Infrastructure
                    break
                store_answers(teacher, buffer)
                if buffer.size == 0:  # the teacher skipped every pair, or people answered all "can't tell"
                    error = no_pretraining_label_error(args, run_dir)
                    checkpoint_kept = True  # Infrastructure: as at a stop in the wait
                    break
                pretrain_reward_model(reward_training, buffer, args, rng)
                # the episodes under way began unrewarded: no whole learned return (one that begins with RL has one)
                predicted_episode_return[:] = np.where(terminations[-1] | truncations[-1], 0.0, np.nan)
            elif not pretraining:  # then it keeps training as labels arrive, in a thread while PPO runs (C17 2.2)
                reward_training.start_round(buffer, args, rng)
            if time.time() - last_label_save > 30 or iteration == args.num_iterations:  # Infrastructure
                save_labels(buffer, teacher, labels_path)
                last_label_save = time.time()

        if pretraining:
            print(f"pretraining: step {global_step}, labels {buffer.size}/{pretrain_labels} from the initial policy")
            writer.add_scalar("labels/total", buffer.size, global_step)
            completed, completed_step = iteration, global_step
            if args.save_model and iteration == args.pretrain_iterations:  # Infrastructure: the reward model is
                save_labels(buffer, teacher, labels_path)  # pretrained (and, with people, the labels waited for): kept
                checkpoint_now()  # before the first periodic checkpoint
            continue

        dones = terminations | truncations
        # RLHF: the reward PPO optimises, for the whole rollout in one batched call; `ensemble` has the weights of the
        # last finished round (the one the thread is running now ends before the next iteration's labels)
        if rlhf:
            rewards_np, absorbing_reward, predicted_returns = learned_reward_for_ppo(
                ensemble, raw_obs, rollout_actions, dones, predicted_episode_return, args.anchor_absorbing
            )
            for predicted_return in predicted_returns:
                recent_predicted.append(predicted_return)  # whole episodes under the learned reward, next to the true one
                writer.add_scalar("charts/predicted_return", predicted_return, global_step)
        else:
            rewards_np, absorbing_reward = true_rewards.copy(), 0.0  # the true reward after a fall is 0 forever
        # PPO change (README "Changes to PPO"): return scaling of the reward PPO gets; a termination enters the
        # absorbing state, whose value is its reward over an unbounded future; a time-limit cut bootstraps
        reward_scale = update_return_scale(return_rms, rewards_np, dones, running_return, args.gamma)
        absorbing_value = absorbing_reward / reward_scale / (1 - args.gamma)
        ppo_rewards = np.clip(rewards_np / reward_scale, -10, 10) + args.gamma * (
            bootstrap * truncations + absorbing_value * terminations
        )
        rewards = torch.as_tensor(ppo_rewards, dtype=torch.float32).to(device)
        step_dones = torch.as_tensor(dones, dtype=torch.float32).to(device)

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                # PPO change (README "Changes to PPO"): with same-step autoreset, step t's own episode end cuts it off
                nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                nextnonterminal = 1.0 - step_dones[t]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        # flatten the batch
        b_obs = obs.reshape((-1, obs_dim))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1, act_dim))
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
                loss = pg_loss - ent_coef_now * entropy_loss + v_loss * args.vf_coef

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
        sps = int((global_step - start_step) / (time.time() - start_time))  # a resumed run counts from its start
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("charts/ent_coef", ent_coef_now, global_step)
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
        if args.behaviour is not None:  # RLHF: how much of the behaviour the rollout shows, per 1000 steps of acting
            rollout_segments = {"obs": raw_obs, "act": rollout_actions, "mask": np.ones(true_rewards.shape)}
            behaviour_score = 1000 * BEHAVIOURS[args.behaviour][2](rollout_segments).mean()
            writer.add_scalar("charts/behaviour_score", behaviour_score, global_step)
            line += f", {args.behaviour} score {behaviour_score:.1f}/1000 steps"
        print(line)
        recent_returns, recent_predicted = recent_returns[-10:], recent_predicted[-10:]

        completed, completed_step = iteration, global_step  # Infrastructure
        if args.save_model and iteration % args.checkpoint_every == 0:
            if rlhf:  # the labels never trail the checkpoint, whenever the run is killed
                save_labels(buffer, teacher, labels_path)
            checkpoint_now()

    # Infrastructure: the run ended, was stopped at the end of an iteration, or cannot go on: nothing is lost (labels
    # always, the checkpoint with --save-model; continue with --resume)
    if stop_requested.is_set():
        print(f"interrupted at step {global_step}")
    if rlhf:
        run_finished = completed == args.num_iterations
        teacher.close(run_finished)  # people's: a finished run fetches the answers given until its end
        if run_finished:
            store_answers(teacher, buffer)  # (kept in the labels; no reward model of this run sees them)
        save_labels(buffer, teacher, labels_path)
        print(f"{buffer.size} labels saved to {labels_path}")
        reward_training.close()
    if args.save_model and checkpoint_kept:
        print(f"checkpoint of step {completed_step} kept (before the last pretraining rollout) in {checkpoint_path}")
    elif args.save_model:
        checkpoint_now()
        print(f"checkpoint saved to {checkpoint_path}")
    envs.close()
    writer.close()
    if rlhf and teacher.failure and not error:  # Infrastructure: the label server refused the run
        error = f"error: the human-feedback thread stopped: {teacher.failure}. The labels are saved" + (
            "; fix that, then --resume goes on" if args.save_model else " (no checkpoint to resume: no --save-model)"
        )
    if error:
        raise SystemExit(error)
