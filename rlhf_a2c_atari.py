# A2C on Atari from preferences over 25-step clips (C17 section 3.1.2 and appendix A.2): docs in README.md "Atari",
# results in benchmark/README.md (the Pong sections)
import collections
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
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Literal, Optional

import ale_py
import gymnasium as gym
import imageio
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from PIL import Image
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

gym.register_envs(ale_py)  # the ALE/...-v5 and ...NoFrameskip-v4 ids (the ROMs ship with ale-py)


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=False`"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    threads: int = 0
    """torch CPU threads (0: torch's default, all cores)"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (check out `videos` folder)"""
    save_model: bool = False
    """whether to save a checkpoint (agent and reward ensemble) to `runs/{run_name}`"""
    checkpoint_every: int = 2000
    """with --save-model, write the checkpoint every this many iterations (and at the end)"""
    resume: Optional[str] = None
    """a run folder `runs/{run_name}` to continue from its checkpoint and saved labels"""
    eval_only: bool = False
    """evaluate the checkpoint of --resume for --eval-episodes games and exit"""
    eval_episodes: int = 5
    """number of games for --eval-only"""
    log_every: int = 100
    """iterations between progress lines and TensorBoard scalars (100 x 80 steps)"""

    # Algorithm specific arguments
    env: str = "PongNoFrameskip-v4"
    """the Atari game: `PongNoFrameskip-v4` or `ALE/Pong-v5` style ids (v5 keeps its sticky actions)"""
    total_timesteps: int = 10000000
    """total timesteps (agent steps of 4 frames, all environments; RLHF pretraining rollouts included)"""
    learning_rate: float = 7e-4
    """the learning rate of the optimizer (C17 A.2)"""
    num_envs: int = 16
    """the number of parallel game environments (C17 A.2: 16 workers)"""
    num_steps: int = 5
    """the number of steps to run in each environment per policy rollout (C17 A.2: n = 5)"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the run (C17 A.2 decays it to 0 at 80M steps)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    ent_coef: float = 0.01
    """coefficient of the entropy (C17 A.2)"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    rmsprop_alpha: float = 0.99
    """RMSprop smoothing constant"""
    rmsprop_eps: float = 1e-5
    """RMSprop epsilon"""
    noop_max: int = 30
    """at most this many no-op actions after each reset (random start states)"""
    mask_score: bool = True
    """blank the score and other counters in the frames everyone sees (C17 A.2), for the games in SCORE_AREAS"""
    episode_end_signal: bool = False
    """tell the agent where games end (standard A2C), in both modes; off: C17 A.2 gives no life-loss or game-end
    signal, which would tell the agent something about the reward"""

    # Preference learning arguments
    feedback: Literal["synthetic", "human", "true-reward"] = "synthetic"
    """where the reward comes from: preferences of the synthetic teacher, of people through label_server.py, or the
    game score (baseline; rewards clipped to their sign as usual for A2C)"""
    labels: int = 3300
    """total number of preference labels to query over the run (C17 3.1.2: 3.3k synthetic labels on Pong, BeamRider)"""
    pretrain_labels: int = 500
    """labels queried from the initial policy before RL starts (C17 A.2: 500)"""
    pretrain_steps: int = 25600
    """agent steps of the initial policy from which the pretraining labels are drawn (count in total_timesteps)"""
    pretrain_epochs: int = 200
    """epochs of reward-model training on the pretraining labels before RL starts (C17 A.2: 200); an epoch: as many
    minibatches as the labels fill, each drawn at random (with replacement)"""
    label_buffer: int = 3000
    """labels kept for reward training: the latest this many (C17 A.2: 3000); bounds the memory"""
    segment_len: int = 25
    """steps per segment (C17 A.2: 25 steps, 1.7 s of play)"""
    round_steps: int = 400
    """steps per environment between label rounds; each round's pairs come from these latest steps"""
    schedule_horizon: float = 5e6
    """labels after pretraining arrive at a rate proportional to horizon / (T + horizon), T = steps so far (C17 A.2)"""
    selection: Literal["variance", "random"] = "variance"
    """how pairs are chosen: highest ensemble disagreement among candidates (C17 2.2.4), or at random (ablation)"""
    candidate_multiplier: int = 10
    """candidate pairs drawn per queried pair for variance-based selection (C17 A: 10x)"""
    ensemble_size: int = 3
    """number of reward predictors in the ensemble (C17: 3)"""
    reward_lr: float = 3e-4
    """learning rate of the reward model (Adam)"""
    reward_batch_size: int = 16
    """preference pairs per reward-model gradient step (each pair is 2 x 25 frame stacks)"""
    reward_train_every: int = 64
    """A2C iterations per reward-model gradient step during RL: a thread takes each step while A2C runs this many
    iterations (C17 trains the reward model in parallel with RL; 2 matches C17 A.2's rate of labels per RL step)"""
    reward_eval_every: int = 50
    """reward-model gradient steps between validation passes (losses, accuracy, L2 adaptation, normalisation)"""
    reward_eval_labels: int = 256
    """labels (most recent) the validation pass scores"""
    reward_dropout: float = 0.5
    """dropout of the reward model's convolutions (C17 A.2: 0.5), rounded to a multiple of 1/256 (at most 255/256)"""
    reward_std: float = 0.05
    """standard deviation of the normalised learned reward given to A2C (C17 A.2: 0.05)"""
    pin_reward_level: bool = True
    """keep the learned reward's level across reward-model updates (the preference loss leaves it free): after each
    update the current rollout's rewards keep the mean they had before it"""
    reward_normalization: Literal["policy", "judged"] = "policy"
    """over which steps the learned reward gets zero mean and --reward-std (C17 2.2.1 does not say): the rewards A2C
    received in the latest --reward-norm-window iterations (mrahtz's reproduction: the agent's steps of the whole
    run), or the steps of the latest
    --reward-eval-labels labelled clips
    (with --pin-reward-level only its scale: the level stays the rollouts')"""
    reward_norm_window: int = 100
    """with --reward-normalization policy: the statistics cover this many latest iterations (x 80 steps by default);
    the window is checkpointed"""
    label_noise: float = 0.1
    """C17 2.2.3: the preference model assumes the teacher answers uniformly at random with this probability"""
    teacher_beta: float = float("inf")
    """synthetic teacher rationality: P(left) = sigmoid(beta * (R_left - R_right)); inf = always the better one"""
    teacher_gamma: float = 1.0
    """synthetic teacher myopia: reward at step t weighted gamma^(L-1-t) (B-Pref); 1 = undiscounted"""
    teacher_epsilon: float = 0.0
    """synthetic teacher mistake probability: the answer is flipped (B-Pref)"""
    teacher_skip_threshold: float = float("-inf")
    """synthetic teacher skips a pair when both segments' undiscounted returns are below this (B-Pref)"""
    teacher_equal_margin: float = 0.0
    """synthetic teacher answers 'equal' when the undiscounted returns differ by at most this (B-Pref); 0 = exact ties only"""
    label_server: str = "http://127.0.0.1:8000"
    """with --feedback human: the address of label_server.py"""
    label_token: Optional[str] = None
    """with --feedback human: the label server's --token, if it has one"""
    instruction: str = "Which clip shows better play? (the score is hidden)"
    """with --feedback human: the question raters are asked"""
    clip_scale: int = 4
    """with --feedback human: clips are the stored 84x84 frames enlarged this many times"""
    clip_fps: int = 15
    """with --feedback human: playback frame rate; 25 steps at 15 frames/s is the game's speed, a 1.7 s clip"""

    # to be filled in runtime (not flags: a value given would be overwritten unseen)
    batch_size: tyro.conf.Suppress[int] = 0
    """the batch size (computed in runtime)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """the number of iterations (computed in runtime)"""
    iterations_per_round: tyro.conf.Suppress[int] = 0
    """A2C iterations per label round (computed in runtime)"""
    pretrain_iterations: tyro.conf.Suppress[int] = 0
    """iterations of the initial policy used only for pretraining labels (computed in runtime)"""


# C17 A.2: the score (and counters that give the reward away) blanked, as (first row, end row, first column, end
# column) of the 210x160 screen. Each area was found by changing the score bytes of the game's RAM and seeing which
# pixels change (tests/test_a2c_atari.py repeats that check on real frames).
SCORE_AREAS = {
    "pong": [(0, 24, 0, 160)],  # both players' scores, above the top wall
    "breakout": [(0, 16, 0, 160)],  # score, lives, player number, above the wall
    "enduro": [(158, 192, 40, 120)],  # dashboard: odometer (it shows the speed), day, cars left to pass
    "beam_rider": [(0, 42, 0, 160)],  # score, sector, enemies left in the sector, torpedoes
    "seaquest": [(0, 30, 0, 160)],  # score and spare submarines
    "qbert": [(0, 14, 0, 160), (14, 30, 28, 50)],  # score; lives under it
    "space_invaders": [(0, 22, 0, 160)],  # both players' scores
}


def atari_game(env_id):
    """The ALE game name of a gymnasium id (e.g. 'pong'); a clear error for anything else."""
    if env_id not in gym.registry:
        atari_ids = [k for k, spec in gym.registry.items() if str(spec.entry_point).startswith("ale_py")]
        close = difflib.get_close_matches(env_id, atari_ids, n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else " Use e.g. PongNoFrameskip-v4 or ALE/Pong-v5."
        raise SystemExit(f"error: unknown Atari environment id '{env_id}'.{hint}")
    spec = gym.spec(env_id)
    if not str(spec.entry_point).startswith("ale_py") or "game" not in spec.kwargs:
        raise SystemExit(f"error: {env_id} is not an Atari game of ale-py (use rlhf_ppo_mujoco.py for MuJoCo tasks)")
    return spec.kwargs["game"]


def blank_score(frame, game):
    """The 210x160 screen (grey or RGB) with the game's SCORE_AREAS set to black (a copy)."""
    frame = frame.copy()
    for top, bottom, left, right in SCORE_AREAS.get(game, []):
        frame[top:bottom, left:right] = 0
    return frame


class AtariFrames(gym.Wrapper):
    """The standard preprocessing (Mnih et al. 2015): up to `noop_max` no-ops after a reset, each action repeated for
    4 frames with the pixel-wise max of the last two (sprites flicker), grey, score blanked (C17 A.2), 84x84.
    Rewards are summed over the 4 frames and not clipped: this is the true game score."""

    def __init__(self, env, game, noop_max=30, skip=4, mask_score=True):
        super().__init__(env)
        self.game, self.noop_max, self.skip, self.mask_score = game, noop_max, skip, mask_score
        self.observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)

    def process(self, screen):
        if self.mask_score:
            screen = blank_score(screen, self.game)
        return np.asarray(Image.fromarray(screen).resize((84, 84), Image.BILINEAR))

    def reset(self, **kwargs):
        screen, info = self.env.reset(**kwargs)
        for _ in range(self.env.unwrapped.np_random.integers(1, self.noop_max + 1) if self.noop_max else 0):
            screen, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                screen, info = self.env.reset()
        return self.process(screen), info

    def step(self, action):
        total, last_two = 0.0, []
        for _ in range(self.skip):
            screen, reward, terminated, truncated, info = self.env.step(action)
            total += reward
            last_two = [*last_two[-1:], screen]
            if terminated or truncated:
                break
        return self.process(np.max(np.stack(last_two), 0)), total, terminated, truncated, info


class RecordEpisodeVideo(gym.Wrapper):
    """Saves games 0, 1, 8, 27, ... (cubes, then every 1000th) as MP4 with imageio, in colour, score included."""

    def __init__(self, env, folder, fps=15):
        super().__init__(env)
        self.folder, self.fps, self.episode, self.frames = folder, fps, -1, None
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

    def _flush(self):
        if self.frames:
            imageio.mimsave(f"{self.folder}/episode-{self.episode}.mp4", self.frames, fps=self.fps, macro_block_size=1)
        self.frames = None

    def close(self):
        self._flush()
        super().close()


def make_env(env_id, idx, capture_video, run_dir, noop_max=30, mask_score=True):
    def thunk():
        game = atari_game(env_id)
        # v5 ids skip frames inside ALE; the wrapper does it (with the max over two frames) for every id
        env = gym.make(env_id, frameskip=1, obs_type="grayscale", render_mode="rgb_array")
        env = AtariFrames(env, game, noop_max, mask_score=mask_score)
        if capture_video and idx == 0:
            env = RecordEpisodeVideo(env, f"{run_dir}/videos")
        env = gym.wrappers.RecordEpisodeStatistics(env)  # charts/episodic_return is the score of whole games
        env = gym.wrappers.FrameStackObservation(env, 4)  # the first frame of a game is repeated to fill the stack
        return env

    return thunk


def fill_runtime_fields(args: Args) -> None:
    """Compute the `# to be filled in runtime` fields of Args from the others (before validate_args checks them all;
    the max(1, ...) only keep settings it refuses from failing here first)."""
    args.batch_size = args.num_envs * args.num_steps
    args.num_iterations = args.total_timesteps // max(1, args.batch_size)
    args.iterations_per_round = args.round_steps // max(1, args.num_steps)
    # RLHF: the initial policy's steps, rounded up to whole label rounds
    rlhf = args.feedback != "true-reward"
    pretrain_rounds = math.ceil(args.pretrain_steps / max(1, args.num_envs * args.round_steps)) if rlhf else 0
    args.pretrain_iterations = pretrain_rounds * args.iterations_per_round


def flag_list(names):
    """'--a is' or '--a, --b are': argument names as the command line spells them, for an error message."""
    return ", ".join(f"--{name.replace('_', '-')}" for name in names) + (" is" if len(names) == 1 else " are")


def validate_args(args: Args, run_dir=None) -> None:
    """Reject impossible settings with a message (no traceback) before anything is created (after
    fill_runtime_fields)."""
    game = atari_game(args.env)
    if args.mask_score and game not in SCORE_AREAS:
        print(f"warning: no score layout known for '{game}': the score stays visible to the reward model and raters")
    if min(args.num_envs, args.num_steps, args.total_timesteps, args.log_every, args.checkpoint_every) < 1:
        raise SystemExit("error: --num-envs, --num-steps, --total-timesteps, --log-every, --checkpoint-every must be positive")
    if args.checkpoint_every != Args.checkpoint_every and not (args.save_model or args.resume):
        raise SystemExit("error: --checkpoint-every is for --save-model (no checkpoint is written without it)")
    if args.eval_episodes != Args.eval_episodes and not args.eval_only:  # a training run evaluates nothing
        raise SystemExit("error: --eval-episodes is for --eval-only")
    new_preference_run = args.feedback != "true-reward" and not args.resume  # (a true-reward run reads none of these)
    if args.candidate_multiplier != Args.candidate_multiplier and args.selection != "variance" and new_preference_run:
        raise SystemExit("error: --candidate-multiplier is for --selection variance (random selection draws no candidates)")
    if args.reward_norm_window != Args.reward_norm_window and args.reward_normalization != "policy" and new_preference_run:
        raise SystemExit("error: --reward-norm-window is for --reward-normalization policy")
    if args.reward_norm_window < 1 or not args.reward_std > 0:
        raise SystemExit("error: --reward-norm-window and --reward-std must be positive")
    not_numbers = [f"--{name.replace('_', '-')}" for name, value in vars(args).items() if value != value]  # nan only
    if not_numbers:
        raise SystemExit(f"error: {', '.join(not_numbers)} must be a number, not nan")
    if args.threads < 0 or not 0 <= args.seed < 2**32 or args.noop_max < 0:
        raise SystemExit(
            f"error: --threads and --noop-max must be 0 or more and --seed in [0, 2**32 - 1] (got {args.threads}, "
            f"{args.noop_max}, {args.seed})"
        )
    if not (0 < args.reward_lr < math.inf and 0 < args.learning_rate < math.inf):
        raise SystemExit("error: --reward-lr and --learning-rate must be positive finite numbers")
    if not (0 <= args.gamma <= 1 and args.max_grad_norm > 0):
        raise SystemExit("error: --gamma must be in [0, 1] and --max-grad-norm positive")
    # settings that only one kind of teacher reads: given to another, they would be silently ignored (a resumed run's
    # are its own, which it cannot change, but for where its label server is now)
    changed = [name for name, value in vars(args).items() if value != getattr(Args, name)]
    if args.resume:
        changed = [name for name in changed if name in ("label_server", "label_token")]
    human_flags = [
        name for name in changed if name in ("label_server", "label_token", "instruction", "clip_scale", "clip_fps")
    ]
    if args.feedback != "human" and human_flags:
        raise SystemExit(f"error: {flag_list(human_flags)} for --feedback human")
    teacher_flags = [name for name in changed if name.startswith("teacher_")]
    if args.feedback == "human" and teacher_flags:
        raise SystemExit(f"error: {flag_list(teacher_flags)} for the synthetic teacher, not for --feedback human")
    if args.round_steps < 1 or args.round_steps % args.num_steps:
        raise SystemExit(
            f"error: --round-steps {args.round_steps} must be a positive multiple of --num-steps {args.num_steps}"
        )
    if args.num_iterations <= args.pretrain_iterations:
        raise SystemExit(
            f"error: --total-timesteps {args.total_timesteps} leaves no RL after {args.pretrain_iterations * args.batch_size} "
            f"pretraining steps (--pretrain-steps rounded up to whole label rounds of {args.num_envs} x {args.round_steps})"
        )
    if args.feedback == "true-reward":
        return
    # RLHF: labels are asked only at the end of whole rounds: a run must reach one after pretraining to spend its budget
    if args.num_iterations < args.pretrain_iterations + args.iterations_per_round:
        minimum = (args.pretrain_iterations + args.iterations_per_round) * args.batch_size
        raise SystemExit(
            f"error: --total-timesteps {args.total_timesteps} reaches no label round after the "
            f"{args.pretrain_iterations * args.batch_size} pretraining steps (labels are asked every {args.num_envs} x "
            f"{args.round_steps} steps), so --labels {args.labels} could not be spent: use --total-timesteps {minimum} "
            "or more"
        )
    if args.feedback == "human":
        if not args.label_server.startswith(("http://", "https://")):
            raise SystemExit(f"error: --label-server must be an http:// or https:// address (got '{args.label_server}')")
        if not 1 <= args.clip_scale <= 12 or not 1 <= args.clip_fps <= 240:
            raise SystemExit("error: --clip-scale must be in [1, 12] and --clip-fps in [1, 240]")
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
    if not 1 <= args.pretrain_labels <= args.labels:
        raise SystemExit(f"error: --pretrain-labels must be between 1 and --labels {args.labels} (got {args.pretrain_labels})")
    if not 2 <= args.segment_len <= args.round_steps:
        raise SystemExit(f"error: --segment-len {args.segment_len} must be between 2 and --round-steps {args.round_steps}")
    if min(args.label_buffer, args.ensemble_size, args.candidate_multiplier, args.pretrain_epochs) < 1:
        raise SystemExit("error: --label-buffer, --ensemble-size, --candidate-multiplier, --pretrain-epochs must be positive")
    if args.selection == "variance" and args.ensemble_size < 2 and not args.resume:  # one member has no disagreement
        raise SystemExit("error: --selection variance needs --ensemble-size 2 or more (or --selection random)")
    if min(args.reward_batch_size, args.reward_train_every, args.reward_eval_every, args.reward_eval_labels) < 1:
        raise SystemExit(
            "error: --reward-batch-size, --reward-train-every, --reward-eval-every, --reward-eval-labels must be positive"
        )
    if not 0 <= args.reward_dropout < 1:
        raise SystemExit("error: --reward-dropout must be in [0, 1)")
    if not 0 <= args.label_noise < 1 or not 0 <= args.teacher_epsilon <= 1 or not 0 < args.teacher_gamma <= 1:
        raise SystemExit("error: --label-noise must be in [0, 1), --teacher-epsilon in [0, 1], --teacher-gamma in (0, 1]")
    # a round's pairs draw their left and their right segments each without repeats while its steps hold twice as many
    # segments as pairs (game ends, which no segment crosses, leave fewer: then they repeat); select_pairs redraws the
    # right side of a pair that would show one segment twice
    per_round = label_schedule(args)
    capacity = args.num_envs * (args.round_steps - args.segment_len + 1) // 2
    if per_round.max() > capacity:
        peak_in_pretraining = per_round.argmax() < args.pretrain_iterations // args.iterations_per_round
        where, longer = ("a pretraining", "--pretrain-steps") if peak_in_pretraining else ("an RL", "--total-timesteps")
        raise SystemExit(
            f"error: --labels {args.labels} is too large for this run: one label round holds at most {capacity} pairs of "
            f"{args.segment_len}-step segments, and the schedule asks for {per_round.max()} in {where} round. "
            f"Use fewer labels, more {longer}, or a longer --round-steps."
        )


# RLHF: C17 A.2 label schedule
def label_schedule(args: Args) -> np.ndarray:
    """Labels to query at each label round (one per `round_steps` steps per environment): `pretrain_labels` spread over
    the initial policy's rounds, the rest at a rate proportional to horizon / (T + horizon), T = steps so far. Sums
    exactly to args.labels, whatever --total-timesteps is (validate_args makes sure a round follows pretraining)."""
    # the label rounds the run reaches (the steps after the last whole round ask none)
    num_rounds = args.num_iterations // args.iterations_per_round
    pretrain_rounds = args.pretrain_iterations // args.iterations_per_round
    per_round = np.zeros(num_rounds, dtype=np.int64)
    per_round[:pretrain_rounds] = np.diff(np.round(np.linspace(0, args.pretrain_labels, pretrain_rounds + 1)))
    steps_so_far = np.arange(pretrain_rounds + 1, num_rounds + 1) * args.num_envs * args.round_steps
    rate = args.schedule_horizon / (steps_so_far + args.schedule_horizon)
    cumulative = np.round((args.labels - args.pretrain_labels) * np.cumsum(rate) / rate.sum())
    per_round[pretrain_rounds:] = np.diff(cumulative, prepend=0)
    return per_round


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Actor and critic over the Nature-DQN torso (Mnih et al. 2015), as A2C on Atari."""

    def __init__(self, num_actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)
        self.to(memory_format=torch.channels_last)  # with channels-last input: faster convolutions on a CPU

    def hidden(self, x):
        return self.network((x / 255.0).contiguous(memory_format=torch.channels_last))

    def get_value(self, x):
        return self.critic(self.hidden(x))

    def get_action_and_value(self, x, action=None):
        hidden = self.hidden(x)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


# RLHF: the reward model (C17 2.2.3, A.2)
class ByteDropout(nn.Dropout):
    """nn.Dropout with its mask drawn from random bytes (8 per 64-bit draw), p rounded to a multiple of 1/256, at most
    255/256 (exact for C17's 0.5). PyTorch's CPU dropout draws one random number per element: that was a fifth of a
    reward-model step on a CPU (benchmark/README.md). `generator`: its own random stream (the reward model trains in
    a thread of its own, and the global one would then be drawn from in an order that changes from run to run)."""

    generator = None

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        n, dropped = x.numel(), min(round(self.p * 256), 255)
        draws = torch.randint(
            -(2**63), 2**63 - 1, ((n + 7) // 8,), dtype=torch.int64, device=x.device, generator=self.generator
        )
        keep = draws.view(torch.uint8)[:n].as_strided(x.shape, x.stride()) >= dropped  # the same layout as x
        return x * keep.to(x.dtype).mul_(256 / (256 - dropped))


class RewardNet(nn.Module):
    """r(84x84x4 frame stack): convolutions 7x7, 5x5, 3x3, 3x3, strides 3, 2, 1, 1, 16 filters each, each followed by
    batch norm, dropout and leaky ReLU; then 64 leaky-ReLU units and the reward (C17 A.2)."""

    def __init__(self, dropout=0.5):
        super().__init__()
        layers, channels = [], 4
        for kernel, stride in ((7, 3), (5, 2), (3, 1), (3, 1)):
            layers += [nn.Conv2d(channels, 16, kernel, stride), nn.BatchNorm2d(16), ByteDropout(dropout), nn.LeakyReLU(0.01)]
            channels = 16
        self.net = nn.Sequential(*layers, nn.Flatten(), nn.Linear(16 * 7 * 7, 64), nn.LeakyReLU(0.01), nn.Linear(64, 1))
        self.to(memory_format=torch.channels_last)  # with channels-last input: faster convolutions on a CPU

    def forward(self, images):
        """(n, 4, 84, 84) float in [0, 1], channels last (RewardEnsemble.forward) -> (n,)"""
        return self.net(images).squeeze(-1)


class RewardEnsemble(nn.Module):
    """`size` independent RewardNets; each normalised separately, then averaged and scaled to zero mean and a fixed
    standard deviation (C17 2.2.1, A). Predictions use batch norm's running statistics and no dropout (eval mode)."""

    def __init__(self, size=3, dropout=0.5):
        super().__init__()
        self.members = nn.ModuleList(RewardNet(dropout) for _ in range(size))
        self.register_buffer("member_mean", torch.zeros(size))
        self.register_buffer("member_std", torch.ones(size))
        self.register_buffer("ensemble_mean", torch.zeros(()))
        self.register_buffer("ensemble_std", torch.ones(()))
        self.size = size

    @property
    def device(self):
        return self.member_mean.device

    def forward(self, stacks):
        """Raw reward of each member: (..., 4, 84, 84) -> (size, ...)."""
        lead = stacks.shape[:-3]
        images = stacks.reshape(-1, *stacks.shape[-3:]).float().div_(255.0)  # converted once for all members
        images = images.contiguous(memory_format=torch.channels_last)
        return torch.stack([member(images) for member in self.members]).reshape(self.size, *lead)

    def l2_penalty(self):
        """Sum of squared weights (biases and batch norm excluded) of each member: (size,)."""
        return torch.stack(
            [
                sum((m.weight**2).sum() for m in member.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
                for member in self.members
            ]
        )

    @torch.no_grad()
    def fit_normalization(self, raw, target_std=0.05):
        """Set the normalisation from raw member rewards (size, n) of the steps the teacher has judged."""
        if raw.shape[1] < 2:  # no spread to measure (no label yet): the normalisation stays as it is
            return
        self.member_mean.copy_(raw.mean(1))
        self.member_std.copy_(raw.std(1) + 1e-8)
        averaged = ((raw - self.member_mean[:, None]) / self.member_std[:, None]).mean(0)
        self.ensemble_mean.copy_(averaged.mean())
        self.ensemble_std.copy_((averaged.std() + 1e-8) / target_std)

    @torch.no_grad()
    def normalized_reward(self, stacks):
        """The reward A2C optimises: members normalised, averaged, scaled to zero mean and the target std."""
        raw = self(stacks)
        shape = (self.size,) + (1,) * (raw.dim() - 1)
        averaged = ((raw - self.member_mean.view(shape)) / self.member_std.view(shape)).mean(0)
        return (averaged - self.ensemble_mean) / self.ensemble_std

    @torch.no_grad()
    def pin_level(self, stacks, before):
        """Shift the output so that `stacks` (the current rollout) get the mean normalised reward of `before` (theirs
        before a reward-model update): an update may change what the reward prefers, not its level (--pin-reward-level)."""
        self.ensemble_mean += (self.normalized_reward(stacks).mean() - before.mean()) * self.ensemble_std


class RecentRewardNormalizer:
    """Zero mean and `target_std` over the rewards of the latest `window` rollouts, this one included: the scale A2C
    sees stays fixed when the policy moves to states the reward model rates far from the labelled clips' mean. In a
    game with no episode-end signal (C17 A.2) a shift of the reward by a constant leaves every policy's ranking as it
    was, and the rescaling only changes the step size."""

    def __init__(self, window, target_std=0.05):
        self.recent = collections.deque(maxlen=window)
        self.target_std = target_std

    def __call__(self, rewards):
        self.recent.append(np.ravel(rewards))
        seen = np.concatenate(self.recent)
        return (rewards - seen.mean()) / (seen.std() + 1e-8) * self.target_std


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


# RLHF: segments and pair selection (C17 2.2.4). A segment of L steps is stored as its L + 3 frames (84x84 uint8:
# the 3 frames before its first step, then one per step), its actions and its true rewards; the frame stack of step
# t is frames[t : t + 4]. A label (two segments) takes about 400 KB.
def segment_stacks(frames):
    """(..., L + 3, 84, 84) -> the frame stacks of the L steps (..., L, 4, 84, 84)."""
    steps = frames.shape[-3] - 3
    return frames[..., np.arange(steps)[:, None] + np.arange(4), :, :]


def segment_rewards(ensemble, frames):
    """Each member's reward for each step of segments given as frames (..., L + 3, 84, 84): (size, ..., L)."""
    return ensemble(torch.as_tensor(segment_stacks(frames), device=ensemble.device))


def segment_returns(ensemble, segments):
    """Each member's undiscounted predicted return of each segment: (size, ...)."""
    return segment_rewards(ensemble, segments["frames"]).sum(-1)


def new_history(round_steps, num_envs):
    """The current label round's steps, from which segments are drawn (about 45 MB with the defaults). frames[k] is
    the newest frame of step k - 3 (k < 3: the frames before the round's first step)."""
    return {
        "frames": np.zeros((round_steps + 3, num_envs, 84, 84), np.uint8),
        "first_frame": np.zeros((round_steps, num_envs), np.int64),  # index in frames of the game's first frame
        "act": np.zeros((round_steps, num_envs), np.int64),
        "true_reward": np.zeros((round_steps, num_envs), np.float32),
        "done": np.zeros((round_steps, num_envs), bool),
    }


def record_step(history, history_index, stacks, act, true_reward, done):
    """Keep step `history_index` of the round: the agent's frame stacks (envs, 4, 84, 84), the actions, game score and
    whether the game ended at this step; a game that ended at the step before starts again at this one's frame."""
    k = history_index
    if k == 0:
        history["frames"][:3] = stacks[:, :3].swapaxes(0, 1)
    history["frames"][k + 3] = stacks[:, 3]
    previous = history["first_frame"][k - 1] if k > 0 else 0
    game_starts = history["done"][k - 1] if k > 0 else False  # the round's first stack is kept whole anyway
    history["first_frame"][k] = np.where(game_starts, k + 3, previous)
    history["act"][k], history["true_reward"][k], history["done"][k] = act, true_reward, done


def segment_places(rng, history, segment_len, count):
    """Where `count` random segments of `segment_len` steps start in a round's history: (first steps, environments).
    A segment never crosses the end of a game."""
    done = history["done"]
    num_steps, num_envs = done.shape
    ends_before = np.concatenate([np.zeros((1, num_envs), int), np.cumsum(done, 0)])  # games ended before step t
    starts = np.arange(num_steps - segment_len + 1)
    valid = ends_before[starts + segment_len - 1] == ends_before[starts]  # no game ends before the last step
    valid_t, valid_e = np.nonzero(valid)
    if len(valid_t) == 0:
        raise RuntimeError("no valid segment in the round: use a shorter --segment-len")
    pick = rng.choice(len(valid_t), size=count, replace=count > len(valid_t))
    return valid_t[pick], valid_e[pick]


def gather_segments(history, places, segment_len):
    """The segments starting at `places` (from segment_places), copied out of the round's history (`frames`
    (H + 3, envs, 84, 84), the others (H, envs))."""
    t, e = places[0][:, None], places[1][:, None]
    # frames of steps t-3 .. t+L-1; before the first frame of a game the stack repeats that frame, as the agent saw it
    frame_index = np.maximum(t + np.arange(segment_len + 3), history["first_frame"][t, e])
    steps = t + np.arange(segment_len)
    return {
        "frames": history["frames"][frame_index, e],
        "act": history["act"][steps, e],
        "true_reward": history["true_reward"][steps, e],
    }


def sample_segments(rng, history, segment_len, count):
    """`count` random segments of `segment_len` steps from a round's history."""
    return gather_segments(history, segment_places(rng, history, segment_len, count), segment_len)


def index_segments(segments, idx):
    return {k: v[idx] for k, v in segments.items()}


def select_pairs(rng, ensemble, history, segment_len, num_pairs, multiplier, selection, chunk=64):
    """C17 2.2.4: draw `multiplier` x more candidate pairs than needed and keep those whose predicted preference
    varies most across the ensemble members (or a random subset for --selection random)."""
    num_candidates = num_pairs * (multiplier if selection == "variance" else 1)
    left = segment_places(rng, history, segment_len, num_candidates)
    right = segment_places(rng, history, segment_len, num_candidates)
    keep = np.arange(num_pairs)
    if selection == "variance":  # scored a chunk at a time: only `chunk` candidate pairs' frames are copied at once
        scores = []
        for i in range(0, num_candidates, chunk):
            part = slice(i, i + chunk)
            left_part = gather_segments(history, (left[0][part], left[1][part]), segment_len)
            right_part = gather_segments(history, (right[0][part], right[1][part]), segment_len)
            scores.append(disagreement(ensemble, left_part, right_part))
        keep = np.argsort(-np.concatenate(scores), kind="stable")[:num_pairs]
    left, right = (left[0][keep], left[1][keep]), (right[0][keep], right[1][keep])
    for _ in range(3):  # the sides are drawn apart: a pair that would show one clip twice gets another right side
        same = np.flatnonzero((left[0] == right[0]) & (left[1] == right[1]))
        if len(same) == 0:
            break
        right[0][same], right[1][same] = segment_places(rng, history, segment_len, len(same))
    return gather_segments(history, left, segment_len), gather_segments(history, right, segment_len)


@torch.no_grad()
def disagreement(ensemble, left, right):
    """Variance across members of each member's P[left > right]."""
    scores = torch.sigmoid(segment_returns(ensemble, left) - segment_returns(ensemble, right)).var(0, unbiased=False)
    return scores.cpu().numpy()


def stack_segments(segments):
    """A list of single segments (dicts of arrays) -> one dict of arrays with a leading batch axis."""
    return {k: np.stack([s[k] for s in segments]) for k in segments[0]}


# RLHF: the teachers. Every teacher has SyntheticTeacher's small interface, so the training loop never asks which one
# it has; make_teacher builds the one --feedback names.
class SyntheticTeacher:
    """Prefers the segment with more game score (C17 3.1; equal scores are a tie), optionally with the noise of
    B-Pref's simulated teachers (Lee et al. 2021).

    The interface of every teacher (HumanTeacher's too; a new teacher writes these):
        start() -> teacher      start any background work; returns the teacher
        ask(left, right)        queue pairs: left and right are segments (dicts of arrays, one row per pair, SEGMENT_KEYS)
        poll()                  the answers so far: [(left, right, mu), ...], mu = 1 left better, 0 right better, 0.5
                                equal (exact ties, or scores within --teacher-equal-margin). Pairs the teacher skips
                                are dropped, and new pairs are asked in their place (the budget counts only labels
                                answered)
        pending                 pairs asked and not yet handed over by poll(): the label budget counts them as on their way
        wait_for_answers(stop)  block until every asked pair is answered or `stop` (a threading.Event) is set or the
                                teacher fails
        save(), load(consumed_seq_in_labels)
                                the unanswered pairs, to and from the run folder (a stopped run asks them again)
        consumed_seq            the label server's number of the last answer poll() handed over, saved with the
                                labels (0: no server)
        failure                 why the teacher cannot go on (None: it can); the run then stops as at Ctrl-C, saves,
                                and exits with it
        close()                 stop any background work, saving what a resumed run needs"""

    def __init__(self, rng, beta=float("inf"), gamma=1.0, epsilon=0.0, skip_threshold=float("-inf"), equal_margin=0.0):
        self.rng, self.beta, self.gamma, self.epsilon = rng, beta, gamma, epsilon
        self.skip_threshold, self.equal_margin = skip_threshold, equal_margin
        self.answered = []
        self.pending = 0  # answered when asked: always 0
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
        keep = ~np.isnan(mu)
        self.answered.append((index_segments(left, keep), index_segments(right, keep), mu[keep]))

    def poll(self):
        answered, self.answered = self.answered, []
        return answered

    # the rest of the interface: answered when asked, a synthetic teacher has nothing to start, wait for or save
    def start(self):
        return self

    def wait_for_answers(self, stop): ...
    def save(self): ...
    def load(self, consumed_seq_in_labels=0): ...
    def close(self, run_finished=False): ...


def make_teacher(args: Args, run_dir, rng):
    """The teacher --feedback names (synthetic or human): the one place that asks which teacher a run has."""
    if args.feedback == "human":  # (HumanTeacher: in the Infrastructure block below)
        experiment = experiment_name(run_dir)
        print(f"human feedback: pairs go to {args.label_server}/ (experiment {experiment}); open it in a browser to label")
        return HumanTeacher(
            args.label_server, args.label_token, experiment, args.instruction, run_dir, args.clip_scale, args.clip_fps
        )
    return SyntheticTeacher(
        rng,
        args.teacher_beta,
        args.teacher_gamma,
        args.teacher_epsilon,
        args.teacher_skip_threshold,
        args.teacher_equal_margin,
    )


# RLHF: the labels, with each member's validation split and bootstrap weights (C17 2.2.3)
SEGMENT_KEYS = ("frames", "act", "true_reward")
SEGMENT_DTYPES = {"frames": np.uint8, "act": np.int64, "true_reward": np.float32}


class LabelBuffer:
    """The latest `capacity` preference labels (C17 A.2: 3000), oldest replaced first (`total` still counts them: the
    budget never asks for a replaced label again). Each member gives each label a Poisson(1) weight, the online form
    of a bootstrap resample (C17 2.2.3: an ensemble trained on bootstrapped data); the labels its resample leaves out
    (weight 0, probability 1/e: C17's "1/e of the data held out") are that member's validation set, so each member
    trains on about 63% distinct labels and validates on the other 37%. Memory is allocated as labels arrive (about
    400 KB each)."""

    def __init__(self, capacity, segment_len, ensemble_size, rng):
        self.rng, self.capacity, self.size, self.total = rng, capacity, 0, 0
        shapes = {"frames": (2, segment_len + 3, 84, 84), "act": (2, segment_len), "true_reward": (2, segment_len)}
        self.data = {k: np.zeros((capacity,) + shapes[k], SEGMENT_DTYPES[k]) for k in SEGMENT_KEYS}
        self.data |= {
            "mu": np.zeros(capacity, np.float32),
            "is_val": np.zeros((capacity, ensemble_size), bool),
            "weight": np.zeros((capacity, ensemble_size), np.float32),
        }
        self.added = np.zeros(capacity, np.int64)  # when each slot was filled (label number), for recency

    def add(self, left, right, mu, is_val=None, weight=None):
        """Store labels (a new validation split and bootstrap weights unless given); returns what was stored, in the
        form `add` takes back (is_val, weight included), for saving."""
        n, members = len(mu), self.data["is_val"].shape[1]
        if is_val is None:  # new labels (saved ones are reloaded with the split they had, older versions' included)
            weight = self.rng.poisson(1.0, (n, members)).astype(np.float32)
            is_val = weight == 0  # out of bag
        slots = (self.total + np.arange(n)) % self.capacity
        for key in SEGMENT_KEYS:
            self.data[key][slots, 0], self.data[key][slots, 1] = left[key], right[key]
        self.data["mu"][slots], self.data["is_val"][slots], self.data["weight"][slots] = mu, is_val, weight
        self.added[slots] = self.total + np.arange(n)
        self.total += n
        self.size = min(self.total, self.capacity)
        return {"left": left, "right": right, "mu": mu, "is_val": is_val, "weight": weight}

    def get(self, idx):
        """The labels at slots `idx` as numpy arrays: `frames` (n, 2, L + 3, 84, 84), `act` (n, 2, L), ..."""
        return {k: v[idx] for k, v in self.data.items()}

    def latest(self, count):
        """Slots of the `count` most recent labels."""
        return np.argsort(-self.added[: self.size], kind="stable")[:count]

    def sample(self, rng, batch_size):
        """A minibatch: `batch_size` labels drawn with replacement (fewer if it holds fewer), copied out (get)."""
        return self.get(rng.integers(0, self.size, min(batch_size, self.size)))


def save_labels(folder, stored, consumed_seq=0):
    """One file per batch of new labels (labels/{labels so far}.npz): a stopped run loses nothing, and no save
    rewrites the whole buffer. With them, the label server's number of the last answer they hold (human feedback; see
    HumanTeacher.load)."""
    os.makedirs(folder, exist_ok=True)
    flat = {f"{side}_{k}": stored[side][k] for side in ("left", "right") for k in SEGMENT_KEYS}
    flat |= {k: stored[k] for k in ("mu", "is_val", "weight")} | {"consumed_seq": consumed_seq}
    path = f"{folder}/{stored['end']:07d}.npz"
    np.savez_compressed(path + ".tmp.npz", **flat)
    os.replace(path + ".tmp.npz", path)


def load_labels(folder, buffer, teacher=None):
    """Every saved batch, in order, into the buffer (which keeps the latest `capacity`); then, given the run's teacher,
    its unanswered pairs, with the label server's number of the last answer the batches hold (0: none, or batches
    saved before it was kept), whose answers it drops when they arrive again (HumanTeacher.load)."""
    consumed_seq = 0
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".npz") and not name.endswith(".tmp.npz"):
            with np.load(os.path.join(folder, name)) as saved:
                left, right = ({k: saved[f"{side}_{k}"] for k in SEGMENT_KEYS} for side in ("left", "right"))
                buffer.add(left, right, saved["mu"], saved["is_val"], saved["weight"])
                consumed_seq = max(consumed_seq, int(saved["consumed_seq"]) if "consumed_seq" in saved else 0)
    if teacher is not None:
        teacher.load(consumed_seq)


def query_labels(args: Args, rng, teacher, buffer, ensemble, history, labels_wanted, selection, labels_dir):
    """A label round: ask the teacher for the pairs that `labels_wanted` (the schedule's total so far) still lacks,
    chosen from the round's steps by `selection` (C17 2.2.4), then store the answers it has. Labels held or on their way
    count: a resumed round asks nothing twice, and pairs the teacher skipped are replaced. The synthetic teacher
    answers at once: the pairs it skips are replaced here, from the round's steps, until `labels_wanted` are held or
    10 times as many pairs as were lacking have been asked (it skips nearly all of this round's); people's at the next
    round."""
    to_ask = labels_wanted - buffer.total - teacher.pending
    pairs_left = 10 * to_ask
    while to_ask > 0 and pairs_left > 0:
        left, right = select_pairs(rng, ensemble, history, args.segment_len, to_ask, args.candidate_multiplier, selection)
        teacher.ask(left, right)
        store_answers(teacher, buffer, labels_dir)
        pairs_left -= to_ask
        to_ask = labels_wanted - buffer.total - teacher.pending  # (people's: on their way, so 0)
    store_answers(teacher, buffer, labels_dir)  # answers that came in since the last round (none more after the loop's)


def store_answers(teacher, buffer, labels_dir):
    """The teacher's answers so far into the label buffer, each batch saved as it arrives, and the teacher's
    unanswered pairs saved in step with them."""
    for left, right, mu in teacher.poll():
        if len(mu) == 0:  # every pair skipped: saved as labels/{labels so far}.npz, it would replace the batch before
            continue
        stored = buffer.add(left, right, mu)
        save_labels(labels_dir, stored | {"end": buffer.total}, teacher.consumed_seq)
    teacher.save()


# why a run stops when the teacher answered none of the pairs from the initial policy (RL needs a fitted reward model)
NO_PRETRAINING_LABEL = (
    "error: no label to pretrain the reward model on: the teacher answered none of the pairs from the initial policy "
    "(the synthetic teacher skips pairs whose returns are both below --teacher-skip-threshold {threshold:g}; people's "
    "'can't tell' is no label). Start again with a lower --teacher-skip-threshold or more --pretrain-steps, or label the "
    "new pairs a resumed run asks (--resume {run_dir}, for a run started with --save-model)"
)


# RLHF: training the reward model (C17 2.2.3): the preference loss with each member's bootstrap weights, the adaptive
# L2, validation on the labels each member's resample left out; during RL in a thread of its own (RewardModelTraining)
def reward_gradient_step(ensemble, optimizer, batch, l2_coef, label_noise):
    """One Adam step on a minibatch of labels (from LabelBuffer.sample); each member's loss uses its own bootstrap
    weights."""
    ensemble.train()  # batch norm on the batch's statistics, dropout on
    returns = segment_returns(ensemble, batch)  # (members, batch, 2)
    mu = torch.as_tensor(batch["mu"], device=ensemble.device)
    losses = preference_loss(returns[..., 0], returns[..., 1], mu, label_noise)
    weight = torch.as_tensor(batch["weight"], device=ensemble.device).T  # (members, batch)
    member_loss = (losses * weight).sum(1) / weight.sum(1).clamp(min=1.0)
    loss = (member_loss + l2_coef * ensemble.l2_penalty()).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ensemble.eval()


def train_reward_model(ensemble, optimizer, buffer, l2_coef, steps, batch_size, label_noise, rng):
    """`steps` gradient steps, each on a minibatch drawn at random from the buffer."""
    for _ in range(steps if buffer.size else 0):
        reward_gradient_step(ensemble, optimizer, buffer.sample(rng, batch_size), l2_coef, label_noise)


@torch.no_grad()
def validate_reward_model(ensemble, labels, label_noise, chunk=32):
    """The ensemble on `labels` (from LabelBuffer.get, at least one; changes nothing): each member's training loss
    (weighted by its bootstrap weights: the loss it trains on) and validation loss (on the labels its resample left
    out), the share of held-out strict preferences each member orders correctly (averaged over members), and each
    member's raw reward for every step of these labels (size, n, 2, L), from which fit_normalization can be set."""
    step_rewards = torch.cat(  # in chunks: every step's frame stack of every label at once would take gigabytes
        [segment_rewards(ensemble, labels["frames"][i : i + chunk]) for i in range(0, len(labels["mu"]), chunk)], 1
    )
    returns = step_rewards.sum(-1)
    mu = torch.as_tensor(labels["mu"], device=ensemble.device)
    losses = preference_loss(returns[..., 0], returns[..., 1], mu, label_noise)
    is_val = torch.as_tensor(labels["is_val"], device=ensemble.device).T.float()
    weight = torch.as_tensor(labels["weight"], device=ensemble.device).T  # (members, labels)
    # the loss each member trains on (reward_gradient_step): the adaptive L2 compares its validation loss with this one
    train_loss = (losses * weight).sum(1) / weight.sum(1)  # NaN for a member with no weighted label here
    val_loss = (losses * is_val).sum(1) / is_val.sum(1)  # NaN for a member with no held-out label yet
    correct = ((returns[..., 0] > returns[..., 1]).float() == mu).float()
    judged = is_val * (mu != 0.5).float()  # "equal" answers have no right order
    val_accuracy = ((correct * judged).sum(1) / judged.sum(1)).nanmean().item()  # members with held-out strict labels
    return train_loss, val_loss, val_accuracy, step_rewards


def adapt_l2(l2_coef, train_loss, val_loss, low=1.1, high=1.5, factor=1.25):
    """C17 2.2.3: keep each member's validation loss between 1.1x and 1.5x its training loss (a NaN loss, no
    held-out or no weighted label yet, leaves the coefficient as it is)."""
    ratio = val_loss / train_loss.clamp(min=1e-8)
    return torch.where(ratio > high, l2_coef * factor, torch.where(ratio < low, l2_coef / factor, l2_coef))


class RewardModelTraining:
    """The reward model's two copies (RewardEnsembles) and their training. `training_ensemble` trains: before RL
    on the pretraining labels (pretrain), during RL one gradient step at a time in a thread of its own (train_step), as
    C17 2.2 fits the reward model in parallel with RL. `policy_ensemble` gives A2C its reward and scores candidate pairs;
    it takes the trained weights each time the thread's step is done. The steps are those of taking turns (runs stay
    reproducible), and A2C's reward is one step behind; on a CPU the thread uses the core that A2C leaves idle."""

    def __init__(self, args: Args, device):
        self.args = args
        self.policy_ensemble = RewardEnsemble(args.ensemble_size, args.reward_dropout).to(device).eval()
        self.training_ensemble = RewardEnsemble(args.ensemble_size, args.reward_dropout).to(device).eval()
        self.training_ensemble.load_state_dict(self.policy_ensemble.state_dict())
        # the thread's dropout draws from a random stream of its own: drawn from the global torch generator, which A2C's
        # actions use, it would take numbers in an order that changes from run to run. Its seed comes from the run's.
        self.dropout_seed = int(np.random.SeedSequence(args.seed).spawn(1)[0].generate_state(1, np.uint64)[0])
        self.dropout_generator = torch.Generator(device).manual_seed(self.dropout_seed)
        for module in self.training_ensemble.modules():
            if isinstance(module, ByteDropout):
                module.generator = self.dropout_generator
        self.optimizer = optim.Adam(self.training_ensemble.parameters(), lr=args.reward_lr)
        self.l2_coef = torch.full((args.ensemble_size,), 1e-4, device=device)
        self.gradient_steps = 0  # taken during RL: every --reward-eval-every, a validation pass
        self.pretrain_epochs_done = 0  # a run stopped while pretraining resumes at the next epoch
        # the latest validation pass's figures (see validate_reward_model)
        self.train_loss = self.val_loss = torch.full((args.ensemble_size,), math.nan)
        self.val_accuracy = math.nan
        self.thread = ThreadPoolExecutor(1, "reward-training")
        self.job = None  # the thread's latest step (a Future)

    def pretrain(self, buffer, rng, stop, checkpoint=None):
        """C17 A.2: --pretrain-epochs epochs on the pretraining labels before RL starts (each epoch as many minibatches
        as the labels fill, drawn at random with replacement), then A2C's copy takes the weights. A progress line per
        epoch (one can take a minute on a CPU), a validation pass every 10, and then `checkpoint()` if given (a run
        killed in the epochs resumes after the last tenth). Returns whether it finished (a stop request ends it after
        the epoch in progress; a resumed run goes on from there)."""
        args = self.args
        epoch_steps, start, first = math.ceil(buffer.size / args.reward_batch_size), time.time(), self.pretrain_epochs_done + 1
        for epoch in range(first, args.pretrain_epochs + 1):
            if stop.is_set():
                return False
            train_reward_model(
                self.training_ensemble,
                self.optimizer,
                buffer,
                self.l2_coef,
                epoch_steps,
                args.reward_batch_size,
                args.label_noise,
                rng,
            )
            self.pretrain_epochs_done, elapsed = epoch, time.time() - start
            line = (
                f"pretraining the reward model: epoch {epoch}/{args.pretrain_epochs} ({elapsed:.0f} s, "
                f"about {elapsed / (epoch - first + 1) * (args.pretrain_epochs - epoch):.0f} s left)"
            )
            if epoch % 10 == 0 or epoch == args.pretrain_epochs:
                self.adapt_l2_to(self.validate_and_renormalize(buffer.get(buffer.latest(args.reward_eval_labels))))
                line += (
                    f", val accuracy {self.val_accuracy:.2f}, train loss {self.train_loss.nanmean():.3f}, "
                    f"val loss {self.val_loss.nanmean():.3f}"
                )
            print(line)
            if checkpoint is not None and epoch % 10 == 0 and epoch < args.pretrain_epochs:
                checkpoint()
        self.policy_ensemble.load_state_dict(self.training_ensemble.state_dict())
        return True

    def train_step(self, buffer, rng, rollout_obs):
        """During RL, every --reward-train-every iterations: A2C's copy takes the weights of the thread's finished step
        (with --pin-reward-level, the rollout `rollout_obs` keeps its mean reward), and the thread starts the next
        step, followed every --reward-eval-every steps by a validation pass on the latest labels. Its labels are copied
        out of the buffer now: the thread never reads the buffer, which label rounds write to."""
        args = self.args
        if self.job is not None:
            validation = self.job.result()  # waits for the step to end (and raises its error, if any)
            if validation is not None:
                self.adapt_l2_to(validation)
            before = self.policy_ensemble.normalized_reward(rollout_obs) if args.pin_reward_level else None
            self.policy_ensemble.load_state_dict(self.training_ensemble.state_dict())
            if args.pin_reward_level:
                self.policy_ensemble.pin_level(rollout_obs, before)
        self.gradient_steps += 1
        batch = buffer.sample(rng, args.reward_batch_size)
        held_out = None
        if self.gradient_steps % args.reward_eval_every == 0:
            held_out = buffer.get(buffer.latest(args.reward_eval_labels))
        self.job = self.thread.submit(self._thread_step, batch, self.l2_coef, held_out)

    def _thread_step(self, batch, l2_coef, held_out):
        reward_gradient_step(self.training_ensemble, self.optimizer, batch, l2_coef, self.args.label_noise)
        return None if held_out is None else self.validate_and_renormalize(held_out)

    def validate_and_renormalize(self, labels):
        """validate_reward_model's figures for the training copy on `labels`; and its reward normalisation refit on
        their steps (C17 2.2.1: zero mean and --reward-std over the judged steps; A2C's copy takes it with the weights)."""
        train_loss, val_loss, val_accuracy, step_rewards = validate_reward_model(
            self.training_ensemble, labels, self.args.label_noise
        )
        self.training_ensemble.fit_normalization(step_rewards.reshape(self.training_ensemble.size, -1), self.args.reward_std)
        return train_loss, val_loss, val_accuracy

    def adapt_l2_to(self, validation):
        """Adapt the L2 coefficients to a validation pass's figures (C17 2.2.3), and keep those for the log."""
        self.train_loss, self.val_loss, self.val_accuracy = validation
        self.l2_coef = adapt_l2(self.l2_coef, self.train_loss, self.val_loss)

    def close(self):
        try:
            if self.job is not None:
                self.job.result()  # the last step's error, if any: raised, not lost (RL waited for every other step)
        finally:
            self.thread.shutdown()

    # --- Infrastructure: checkpoint (the keys of older versions, "reward_fitting" being the training copy) ---
    def state_dict(self):
        if self.job is not None:
            wait([self.job])  # the step in progress (its error, if any, is raised where RL waits for it, or by close)
        step_done = self.job is not None and self.job.exception() is None  # A2C takes its weights at the next one
        return {
            "reward_ensemble": self.policy_ensemble.state_dict(),
            "reward_fitting": self.training_ensemble.state_dict(),
            "reward_optimizer": self.optimizer.state_dict(),
            "l2_coef": self.l2_coef,
            "reward_steps": self.gradient_steps,
            "reward_pretrain_epochs": self.pretrain_epochs_done,
            "reward_step_done": (self.job.result(),) if step_done else None,
            "reward_losses": (self.train_loss, self.val_loss, self.val_accuracy),
        }

    def load_state_dict(self, checkpoint, device):
        """From a checkpoint; those of older versions have no training counters: they restart."""
        self.policy_ensemble.load_state_dict(checkpoint["reward_ensemble"])
        self.training_ensemble.load_state_dict(checkpoint.get("reward_fitting") or checkpoint["reward_ensemble"])
        self.optimizer.load_state_dict(checkpoint["reward_optimizer"])
        self.l2_coef = checkpoint["l2_coef"].to(device)
        self.pretrain_epochs_done = checkpoint.get("reward_pretrain_epochs", 0)  # older checkpoints: from epoch 1
        if "reward_steps" in checkpoint:
            self.gradient_steps = checkpoint["reward_steps"]
            self.train_loss, self.val_loss, self.val_accuracy = checkpoint["reward_losses"]
            if checkpoint["reward_step_done"] is not None:  # the step the run took last: A2C takes it as it would have
                validation = checkpoint["reward_step_done"][0]
                if validation is not None:  # the losses were saved from the device; adapt_l2 uses them there
                    validation = (validation[0].to(device), validation[1].to(device), validation[2])
                self.job = Future()
                self.job.set_result(validation)
        dropout_state = (checkpoint.get("random_states") or {}).get("reward_dropout")
        if dropout_state is not None and dropout_state.numel() == self.dropout_generator.get_state().numel():
            self.dropout_generator.set_state(dropout_state)
        elif dropout_state is not None:  # a GPU's stream is 16 bytes, a CPU's 5056: neither takes the other's
            trained_so_far = self.gradient_steps + self.pretrain_epochs_done  # (pretraining draws from it too)
            self.dropout_generator.manual_seed((self.dropout_seed + trained_so_far) % 2**64)
            print("note: the checkpoint was saved on another kind of device (GPU or CPU): the reward model's dropout")
            print("  draws start again from the run's seed and its steps so far (the run goes on, not as it would have)")


# Evaluation of a saved agent
def evaluate(checkpoint_path, env_id, episodes, seed=0, noop_max=30, mask_score=True, video_dir=None):
    """Game scores of the saved agent (sampling its actions: a greedy Atari policy can stall); with video_dir, games
    0, 1, 8, ... are saved as MP4s in `video_dir/videos` (--capture-video), in place of the clips an earlier evaluation
    left there."""
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    if video_dir is not None and os.path.isdir(f"{video_dir}/videos"):  # an earlier evaluation's clips go: left, they
        for name in os.listdir(f"{video_dir}/videos"):  # would show more episodes, or an agent trained less, beside these
            if re.fullmatch(r"episode-\d+\.mp4", name):
                os.remove(f"{video_dir}/videos/{name}")
    env = make_env(env_id, 0, video_dir is not None, video_dir, noop_max, mask_score)()
    agent = Agent(env.action_space.n)
    agent.load_state_dict(checkpoint["agent"])
    torch.manual_seed(seed)
    scores = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            with torch.no_grad():
                action, _, _, _ = agent.get_action_and_value(torch.as_tensor(obs[None]))
            obs, _, terminated, truncated, info = env.step(action.item())
            done = terminated or truncated
        scores.append(float(info["episode"]["r"]))
    env.close()
    return scores


# =====================================================================================================================
# Infrastructure: the human teacher (C17 appendix B): clips made from the stored frames, sent to label_server.py, the
# answers fetched, the unanswered pairs saved with the run. Readers of the synthetic path can skip this block.
# =====================================================================================================================
MU_OF_CHOICE = {"left": 1.0, "right": 0.0, "equal": 0.5}  # "cant_tell" is dropped (C17 2.2.2)
MISSING = object()  # what HumanTeacher._request returns for a 404 where the caller expects one


class HumanTeacher:
    """People answer in a browser, through label_server.py. SyntheticTeacher's interface. ask() only queues;
    a background thread turns each segment's stored frames into a clip (enlarged, score blanked as the reward model
    sees it), uploads it, posts the pair and polls for answers, retrying with backoff while the server is down, so
    training goes on while people label (C17 2.2: asynchronous). Pairs not yet answered are saved in the run folder
    ({run_dir}/pending_pairs.npz: save/load) and asked again when the run resumes."""

    def __init__(
        self,
        server,
        token,
        experiment,
        instruction,
        run_dir,
        clip_scale=4,
        clip_fps=15,
        poll_interval=2.0,
        pair_check_interval=30.0,
    ):
        self.server, self.token, self.experiment = server.rstrip("/"), token, checked_experiment_name(experiment)
        self.pending_path = os.path.join(run_dir, "pending_pairs.npz")
        self.instruction, self.clip_scale, self.clip_fps, self.poll_interval = instruction, clip_scale, clip_fps, poll_interval
        self.pair_check_interval = pair_check_interval
        self.lock = threading.Lock()
        self.queued = []  # pair ids still to encode, upload and post
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
        """Block until every asked pair is answered (the pretraining labels RL cannot start without), `stop` is set or
        the thread stopped."""
        last = 0.0
        while self.unanswered and self.failure is None and not stop.is_set():
            if time.time() - last > progress_every:
                print(
                    f"waiting for {self.unanswered} labels: label them at {self.server}/ ({len(self.queued)} pairs still to upload)"
                )
                last = time.time()
            stop.wait(0.5)

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
        """WebM/VP9 bytes of the segment's frames, one per step, enlarged (plays in Chromium and Firefox)."""
        grey = segment["frames"][3:].repeat(self.clip_scale, 1).repeat(self.clip_scale, 2)
        frames = list(np.repeat(grey[..., None], 3, -1))
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
        """The unanswered pairs, in step with the saved labels (the answers those hold are not fetched again)."""
        path = self.pending_path
        with self.lock:
            ids = list(self.waiting)
            state = {"pair_ids": np.array(ids, dtype=str), "next_index": self.next_index, "consumed_seq": self.consumed_seq}
            # where a resumed run fetches again: below consumed_seq while answers it must drop are still to come (load)
            state["fetch_from"] = min(self.consumed_seq, self.taken_seq)
            for side, which in (("left", 0), ("right", 1)):
                for key in SEGMENT_KEYS:
                    values = [self.waiting[i][which][key] for i in ids]
                    state[f"{side}_{key}"] = np.stack(values) if values else np.zeros(0, SEGMENT_DTYPES[key])
        np.savez_compressed(path + ".tmp.npz", **state)
        os.replace(path + ".tmp.npz", path)

    def load(self, consumed_seq_in_labels=0):
        """Asked-but-unanswered pairs of a stopped run, if any: asked again (re-posting a pair is harmless). A run
        killed after saving a batch of labels and before this file lists pairs as unanswered whose answers are in the
        labels (up to `consumed_seq_in_labels`, from load_labels): poll() drops those answers when they arrive again."""
        if os.path.exists(self.pending_path):
            self.resumed = True
            with np.load(self.pending_path) as state:
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
    return checked_experiment_name(re.sub(r"[^A-Za-z0-9_.-]", "-", os.path.basename(os.path.abspath(run_dir))))


def checked_experiment_name(experiment):
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
# Infrastructure: stopping, checkpoints and resuming. Ctrl-C or SIGTERM stop a run at the end of an iteration, with
# its checkpoint (--save-model); --resume continues it from the start of the label round it was stopped in (a
# true-reward run: after its last iteration).
# =====================================================================================================================
def stop_on_signals():
    """A threading.Event that Ctrl-C (SIGINT) or SIGTERM (`kill`, `timeout`, a cluster's scheduler) set: the training
    loop stops at the end of the iteration in progress, where everything a resumed run needs is consistent. A second
    Ctrl-C stops at once (KeyboardInterrupt), without saving; one within a second of the first is the same stop, and
    so is any SIGTERM after the first."""
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
    path = os.path.join(run_dir, "checkpoint.pt")
    if not os.path.isfile(path):
        raise SystemExit(f"error: no checkpoint at {path} (was the run started with --save-model?)")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # cut short (a full disk), empty, or not a checkpoint: RuntimeError, EOFError, ...
        raise SystemExit(f"error: cannot read {path} ({type(error).__name__}: {error})") from None


def flags_on_command_line(argv):
    """The settings a command line names, at whatever value (--name or --name=value, with hyphens or underscores, and
    --no-name for False): a flag given at its default value is still given."""
    fields = set(vars(Args()))
    names = {token[2:].split("=")[0].replace("-", "_") for token in argv if token.startswith("--")}
    return {name if name in fields else name.removeprefix("no_") for name in names} & fields


def resumed_args(args: Args, checkpoint, argv=()) -> Args:
    """A resumed run keeps its own settings; only what to do with it (--resume, --eval-only, --eval-episodes; with
    --eval-only, --capture-video: whether to film the evaluation) comes from this command line, and where its label
    server is now (--label-server, --label-token, when given). Any other flag
    given (set away from its default, or named in `argv`, the command line) that differs from the run's own is refused,
    not dropped, and so is a checkpoint with settings this script does not have (another script's run), and a
    checkpoint whose reward model trained (pretraining too) on labels that are not in its labels/ folder (it would go
    on without them)."""
    from_command_line = ("resume", "eval_only", "eval_episodes") + (("capture_video",) if args.eval_only else ())
    saved = dict(checkpoint["args"])
    if saved.pop("frozen_reward", None) is not None and not args.eval_only:
        raise SystemExit(
            f"error: {args.resume} ran with --frozen-reward, which this version no longer has: continue it with "
            "rlhf_a2c_atari.py of commit f15fb44"
        )
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
    if args.eval_only and args.eval_episodes < 1:
        raise SystemExit("error: --eval-only needs --eval-episodes 1 or more")
    labels_dir = os.path.join(args.resume, "labels")
    in_folder = os.listdir(labels_dir) if os.path.isdir(labels_dir) else []
    saved_batches = [name for name in in_folder if name.endswith(".npz") and not name.endswith(".tmp.npz")]  # as load_labels
    trained = checkpoint.get("reward_steps", 0) > 0 or checkpoint.get("reward_pretrain_epochs", 0) > 0
    if trained and not args.eval_only and not saved_batches:
        raise SystemExit(f"error: {args.resume} has a checkpoint but not the labels saved with it ({labels_dir}/)")
    held = 0
    for name in saved_batches:
        with np.load(os.path.join(labels_dir, name)) as batch:
            held += len(batch["mu"])
    if held < checkpoint.get("labels_held", 0) and not args.eval_only:  # a batch missing (a folder copied in part)
        raise SystemExit(
            f"error: {labels_dir}/ holds {held} labels, fewer than the {checkpoint['labels_held']} its checkpoint held: "
            "a label batch is missing (copy the run folder whole)"
        )
    return Args(**{**saved, **given, **{name: getattr(args, name) for name in from_command_line}})


def video_recorder(env):
    """The environment's RecordEpisodeVideo (environment 0's with --capture-video), or None."""
    while not isinstance(env, RecordEpisodeVideo):
        if not isinstance(env, gym.Wrapper):
            return None
        env = env.env
    return env


def save_checkpoint(
    path, args, iteration, global_step, agent, optimizer, rng, reward_training, policy_normalizer, envs, labels_held=0
):
    """Everything needed to evaluate the agent or resume the run after `iteration` (exactly as if it had never stopped
    when that ends a label round, but for the games' state), written atomically: a run killed while saving keeps the
    old checkpoint. With --capture-video, the number of environment 0's game under way, so that a resumed run's videos
    follow (after a kill, the games since the last checkpoint's are filmed again under their numbers)."""
    state = {
        "args": vars(args),
        "agent": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "reward_ensemble": None,  # (a true-reward run)
        "global_step": global_step,
        "iteration": iteration,
        "video_episode": recorder.episode if (recorder := video_recorder(envs.envs[0])) else None,
        "labels_held": labels_held,  # a resume refuses a labels/ folder that holds fewer
    }
    if reward_training is not None:
        state |= reward_training.state_dict()  # after the reward thread's step in progress
        state["policy_rewards"] = list(policy_normalizer.recent)
    # every random stream, so that a resumed run draws what the run would have drawn
    state["random_states"] = {
        "numpy": rng.bit_generator.state,  # pairs, teacher, validation splits, bootstrap weights, batches
        "numpy_global": np.random.get_state(),
        "python": random.getstate(),
        "torch": torch.get_rng_state(),  # A2C's actions
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "reward_dropout": reward_training.dropout_generator.get_state() if reward_training is not None else None,
    }
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def resume_iteration(checkpoint, args: Args) -> int:
    """The iteration a resumed run starts at: the first of the label round the run stopped in (a round's steps are its
    label pool; a true-reward run, which has no label rounds, the one after its last), or one past the last for a run
    that finished. A checkpoint written mid-round redoes that round's start with the later state."""
    if checkpoint["iteration"] >= args.num_iterations:  # finished: no round to redo (its last one may not be whole)
        return args.num_iterations + 1
    if args.feedback == "true-reward":  # no label round to redo
        return checkpoint["iteration"] + 1
    return checkpoint["iteration"] // args.iterations_per_round * args.iterations_per_round + 1


def games_seed(seed, start_iteration):
    """The seed the games start from: the run's own for a new run. A resumed run restarts its games (the emulators'
    state is not saved) from a seed of its own resume point, so that they do not replay the run's first game starts
    (their no-op counts and, for -v5 ids, their sticky actions)."""
    if start_iteration == 1:
        return seed
    return int(np.random.SeedSequence([seed, start_iteration]).generate_state(1)[0])


def restore_checkpoint(checkpoint, agent, optimizer, rng, reward_training, policy_normalizer, device):
    """--resume: the networks, optimisers, the reward model's training and every random stream as the run saved them
    (older checkpoints have no random streams: theirs restart from the seed). The games restart (the emulators' state
    is not saved), from new starts (games_seed)."""
    agent.load_state_dict(checkpoint["agent"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if reward_training is not None:
        reward_training.load_state_dict(checkpoint, device)
        policy_normalizer.recent.extend(checkpoint.get("policy_rewards", []))
    random_states = checkpoint.get("random_states") or {}
    if "numpy" in random_states:
        rng.bit_generator.state = random_states["numpy"]
        np.random.set_state(random_states["numpy_global"])
        random.setstate(random_states["python"])
        torch.set_rng_state(random_states["torch"])
        if random_states["torch_cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(random_states["torch_cuda"])


if __name__ == "__main__":
    args = tyro.cli(Args)
    checkpoint = None
    if args.resume:  # Infrastructure: continue a stopped run, or evaluate it
        checkpoint = load_checkpoint(args.resume)
        args = resumed_args(args, checkpoint, sys.argv[1:])
        if args.eval_only:
            checkpoint_path = os.path.join(args.resume, "checkpoint.pt")
            video_dir = f"{args.resume}/eval" if args.capture_video else None  # clips in runs/NAME/eval/videos
            scores = evaluate(
                checkpoint_path, args.env, args.eval_episodes, args.seed, args.noop_max, args.mask_score, video_dir
            )
            print(f"eval: {len(scores)} games of {args.env}: score {np.mean(scores):.1f} +- {np.std(scores):.1f}")
            sys.exit(0)
        run_dir = os.path.normpath(args.resume)
    elif args.eval_only:
        raise SystemExit("error: --eval-only needs --resume runs/<run_name> (a run saved with --save-model)")
    else:
        run_dir = f"runs/{args.env.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    fill_runtime_fields(args)
    validate_args(args, run_dir)
    rlhf = args.feedback != "true-reward"
    if not args.resume:  # Infrastructure: a folder of its own, even beside a run of its name started this second
        run_dir = claim_new_run_dir(run_dir)
    start_iteration = resume_iteration(checkpoint, args) if checkpoint else 1  # Infrastructure: --resume
    # Infrastructure: each run marks the step it starts logging at; TensorBoard hides what a stopped run logged from a
    # resumed run's mark on (the resumed run logs those steps again). The first mark it reads, a new run's, hides nothing
    first_logged_step = (start_iteration - 1) * args.batch_size + 1
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
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env, i, args.capture_video, run_dir, args.noop_max, args.mask_score) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    num_actions = envs.single_action_space.n

    agent = Agent(num_actions).to(device)
    optimizer = optim.RMSprop(agent.parameters(), lr=args.learning_rate, alpha=args.rmsprop_alpha, eps=args.rmsprop_eps)

    # RLHF: the reward model, the labels, the teacher and the label schedule
    reward_training = buffer = teacher = schedule = None
    labels_dir = f"{run_dir}/labels"
    policy_normalizer = RecentRewardNormalizer(args.reward_norm_window, args.reward_std)  # --reward-normalization policy
    if rlhf:
        reward_training = RewardModelTraining(args, device)
        buffer = LabelBuffer(args.label_buffer, args.segment_len, args.ensemble_size, rng)
        teacher = make_teacher(args, run_dir, rng)
        schedule = label_schedule(args)

    global_step = (start_iteration - 1) * args.batch_size
    checkpoint_path = f"{run_dir}/checkpoint.pt"
    if checkpoint is not None:  # Infrastructure: resume where the run stopped
        restore_checkpoint(checkpoint, agent, optimizer, rng, reward_training, policy_normalizer, device)
        if rlhf:
            load_labels(labels_dir, buffer, teacher)
        print(f"resumed {run_dir} at step {global_step} with {buffer.total if rlhf else 0} labels")

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.num_envs, 4, 84, 84), dtype=torch.uint8).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long).to(device)
    true_rewards = np.zeros((args.num_steps, args.num_envs), np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), bool)
    history = new_history(args.round_steps, args.num_envs) if rlhf else None  # RLHF: the round's steps, for segments
    predicted_episode_return = np.zeros(args.num_envs)

    # TRY NOT TO MODIFY: start the game
    if rlhf:
        teacher.start()
    start_time, start_step = time.time(), global_step
    next_obs, _ = envs.reset(seed=games_seed(args.seed, start_iteration))  # Infrastructure: --resume's games start anew
    next_obs = torch.as_tensor(next_obs).to(device)
    if checkpoint is not None and checkpoint.get("video_episode") is not None and (recorder := video_recorder(envs.envs[0])):
        recorder.renumber(checkpoint["video_episode"] + 1)  # Infrastructure: the games restart, their videos follow
    recent_returns, recent_predicted = [], []
    learned_z = []  # RLHF: the policy's mean learned reward per step since the last log line (see the log below)
    # the last iteration whose update finished, and its step count: what a checkpoint resumes after
    completed, completed_step = start_iteration - 1, global_step
    failure = None  # RLHF: why the run must stop early, if it must (the end-of-run saving still happens)
    stop_requested = stop_on_signals()  # Infrastructure: Ctrl-C and SIGTERM stop the run at the end of an iteration

    def checkpoint_now():  # Infrastructure
        labels_held = buffer.total if rlhf else 0
        save_checkpoint(
            checkpoint_path,
            args,
            completed,
            completed_step,
            agent,
            optimizer,
            rng,
            reward_training,
            policy_normalizer,
            envs,
            labels_held,
        )

    for iteration in range(start_iteration, args.num_iterations + 1):
        if stop_requested.is_set() or (rlhf and teacher.failure):  # Infrastructure: Ctrl-C, SIGTERM, the label server
            break
        pretraining = iteration <= args.pretrain_iterations  # RLHF: the initial policy only collects labels
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, _, _, _ = agent.get_action_and_value(next_obs)
            actions[step] = action

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
            true_rewards[step], dones[step] = reward, terminated | truncated
            if rlhf:  # RLHF: keep this step for the round's segments
                history_index = (iteration - 1) % args.iterations_per_round * args.num_steps + step
                stacks = obs[step].cpu().numpy()
                record_step(history, history_index, stacks, action.cpu().numpy(), reward, dones[step])
            if "final_info" in infos and "episode" in infos["final_info"]:
                episodes = infos["final_info"]["episode"]
                for i in np.flatnonzero(infos["final_info"]["_episode"]):
                    recent_returns.append(float(episodes["r"][i]))
                    writer.add_scalar("charts/episodic_return", episodes["r"][i], global_step)
                    writer.add_scalar("charts/episodic_length", episodes["l"][i], global_step)
            next_obs = torch.as_tensor(next_obs_np).to(device)

        if rlhf and iteration % args.iterations_per_round == 0:
            # RLHF: a label round: the labels the C17 A.2 schedule still lacks, pairs chosen as C17 2.2.4 says (at random
            # before RL: an untrained ensemble's disagreement means nothing, and scoring candidates costs minutes on a CPU)
            labels_wanted = int(schedule[: iteration // args.iterations_per_round].sum())
            selection = "random" if pretraining else args.selection
            query_labels(
                args, rng, teacher, buffer, reward_training.policy_ensemble, history, labels_wanted, selection, labels_dir
            )
            if iteration == args.pretrain_iterations:  # C17 A.2: the reward model is fitted before RL starts
                if args.save_model:  # Infrastructure: a run killed in the wait resumes at this round (its pairs are
                    checkpoint_now()  # saved as asked: the answers given in the wait are not lost); in the epochs, below
                teacher.wait_for_answers(stop_requested)  # people answer asynchronously; RL cannot start without these
                store_answers(teacher, buffer, labels_dir)
                if teacher.failure:  # Infrastructure: the label server refused the run: stop, saving, as at Ctrl-C
                    break
                if buffer.size == 0 and not stop_requested.is_set():  # a reward model fitted on nothing gives NaN
                    failure = NO_PRETRAINING_LABEL.format(threshold=args.teacher_skip_threshold, run_dir=run_dir)
                    break
                if not reward_training.pretrain(buffer, rng, stop_requested, checkpoint_now if args.save_model else None):
                    break  # stopped: a resumed run goes on at the next epoch
                # the games under way began unrewarded: no whole learned score (one that begins with RL has one)
                predicted_episode_return[:] = np.where(dones[-1], 0.0, np.nan)

        if pretraining:  # RLHF: no A2C update before RL starts
            if iteration % args.iterations_per_round == 0:
                print(f"pretraining: step {global_step}, labels {buffer.total}/{args.pretrain_labels} from the initial policy")
                writer.add_scalar("labels/total", buffer.total, global_step)
            completed, completed_step = iteration, global_step
            if args.save_model and iteration == args.pretrain_iterations:  # Infrastructure: the reward model pretrained
                checkpoint_now()  # (hours on a CPU, and the label wait): kept before the first periodic checkpoint
            continue

        if rlhf and iteration % args.reward_train_every == 0 and buffer.size:
            # RLHF: the reward model trains on as labels arrive, in a thread, while A2C runs (RewardModelTraining)
            reward_training.train_step(buffer, rng, obs)

        # RLHF: the reward A2C optimises, for the whole rollout in one batched call
        if rlhf:
            rewards_np = reward_training.policy_ensemble.normalized_reward(obs).cpu().numpy()
            learned_z.append(rewards_np.mean() / args.reward_std)  # for the log (see reward_model/policy_reward_z)
            if args.reward_normalization == "policy":
                rewards_np = policy_normalizer(rewards_np)
            for t in range(args.num_steps):  # predicted score of whole games, next to the true one
                predicted_episode_return += rewards_np[t]
                for i in np.flatnonzero(dones[t] & ~np.isnan(predicted_episode_return)):
                    recent_predicted.append(predicted_episode_return[i])
                    writer.add_scalar("charts/predicted_return", predicted_episode_return[i], global_step)
                predicted_episode_return[dones[t]] = 0.0
        else:
            rewards_np = np.sign(true_rewards)  # the usual A2C reward clipping
        rewards = torch.as_tensor(rewards_np, dtype=torch.float32).to(device)
        # A2C change (README "Atari", no answer in the frames): by default the agent is not told where games end
        # (C17 A.2); the returns run on into the next game
        step_dones = torch.as_tensor(dones if args.episode_end_signal else np.zeros_like(dones), dtype=torch.float32)
        step_dones = step_dones.to(device)

        # ALGO LOGIC: n-step returns, bootstrapped from the value of the state after the rollout
        with torch.no_grad():
            next_return = agent.get_value(next_obs).flatten()
            returns = torch.zeros_like(rewards)
            for t in reversed(range(args.num_steps)):
                next_return = returns[t] = rewards[t] + args.gamma * next_return * (1.0 - step_dones[t])

        # A2C: one gradient step on the whole rollout
        b_obs = obs.reshape(-1, 4, 84, 84)
        _, logprob, entropy, value = agent.get_action_and_value(b_obs, actions.reshape(-1))
        value = value.flatten()
        advantages = returns.reshape(-1) - value.detach()
        pg_loss = -(advantages * logprob).mean()
        v_loss = ((returns.reshape(-1) - value) ** 2).mean()
        entropy_loss = entropy.mean()
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()

        if iteration % args.log_every == 0:
            # TRY NOT TO MODIFY: record rewards for plotting purposes
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            line = f"step {global_step}, SPS {sps}"
            if recent_returns:
                line += f", true return {np.mean(recent_returns[-10:]):.1f}"
            if rlhf:
                # RLHF: how well the learned reward tracks the game score on this rollout
                constant = rewards_np.std() == 0 or true_rewards.std() == 0
                correlation = math.nan if constant else np.corrcoef(rewards_np.ravel(), true_rewards.ravel())[0, 1]
                writer.add_scalar("reward_model/loss", reward_training.train_loss.nanmean().item(), global_step)
                writer.add_scalar("reward_model/val_loss", reward_training.val_loss.nanmean().item(), global_step)
                writer.add_scalar("reward_model/val_accuracy", reward_training.val_accuracy, global_step)
                writer.add_scalar("reward_model/l2", reward_training.l2_coef.mean().item(), global_step)
                writer.add_scalar("reward_model/true_correlation", correlation, global_step)
                # the policy's learned reward per step over --reward-std, before the policy normalisation (with
                # --pin-reward-level, updates keep its level: only its changes count)
                writer.add_scalar("reward_model/policy_reward_z", np.mean(learned_z), global_step)
                writer.add_scalar("labels/total", buffer.total, global_step)
                writer.add_scalar("labels/buffer", buffer.size, global_step)
                writer.add_scalar("labels/pending", teacher.pending, global_step)
                if recent_predicted:
                    line += f", predicted return {np.mean(recent_predicted[-10:]):.2f}"
                line += f", learned reward z {np.mean(learned_z):+.3f}, labels {buffer.total}/{args.labels}"
                line += f", val acc {reward_training.val_accuracy:.2f}, corr {correlation:.2f}"
                learned_z = []
            print(line)
            recent_returns, recent_predicted = recent_returns[-10:], recent_predicted[-10:]

        completed, completed_step = iteration, global_step
        if args.save_model and iteration % args.checkpoint_every == 0:  # Infrastructure
            checkpoint_now()

    # Infrastructure: the run ended, or stopped at the end of an iteration: nothing is lost (labels are saved as they
    # arrive, the checkpoint with --save-model; --resume continues the run)
    if stop_requested.is_set():
        print(f"interrupted at step {global_step}")
    if rlhf:
        run_finished = completed == args.num_iterations
        teacher.close(run_finished)  # people's: a finished run fetches the answers given until its end
        if run_finished:
            store_answers(teacher, buffer, labels_dir)  # (saved with the labels; no reward model of this run sees them)
        print(f"{buffer.total} labels saved in {labels_dir}/")
        reward_training.close()  # after the reward thread's step in progress, if any (its error is raised)
    if args.save_model:
        checkpoint_now()
        print(f"checkpoint saved to {checkpoint_path}")
    envs.close()
    writer.close()
    if rlhf and teacher.failure and failure is None:  # Infrastructure: the label server refused the run
        failure = f"error: the human-feedback thread stopped: {teacher.failure}. The labels are saved" + (
            "; fix that, then --resume goes on" if args.save_model else " (no checkpoint to resume: no --save-model)"
        )
    if failure is not None:
        raise SystemExit(failure)
