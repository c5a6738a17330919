# A2C on Atari from preferences over 25-step clips (C17 section 3.1.2 and appendix A.2): docs in README.md "Atari",
# results in benchmark/README.md "Atari"
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
    """decay the learning rate linearly to 0 over the run (C17 A.2)"""
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
    """tell the agent where games end (standard A2C); off by default: C17 A.2 gives no life-loss or episode-end signal,
    which would tell the agent something about the reward. Applies to both feedback modes."""

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
    """epochs of reward-model training on the pretraining labels before RL starts (C17 A.2: 200)"""
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
    """A2C iterations per reward-model gradient step during RL (C17 trains it in parallel with RL): a thread takes
    each step while A2C runs this many iterations, and A2C waits for it if it is not done by then. Labels processed per
    RL step = --reward-batch-size / (this x --num-envs x --num-steps): 16 / (64 x 80) = 1 per 320 steps by default,
    32x fewer than C17 A.2's about 1 per 10 steps (--reward-train-every 2 would match it). On Pong
    (benchmark/README.md, one seed each) 64 and 16 both learned, 64 sooner, and at 64 RLHF runs at 0.7-0.8 of the
    true-reward steps/s on a 2-core CPU (16: 0.6, 8: 0.6)"""
    reward_eval_every: int = 50
    """reward-model gradient steps between validation passes (losses, accuracy, L2 adaptation, normalisation)"""
    reward_eval_labels: int = 256
    """labels (most recent) the validation pass scores"""
    reward_dropout: float = 0.5
    """dropout of the reward model's convolutions (C17 A.2: 0.5)"""
    frozen_reward: Optional[str] = None
    """a run folder `runs/{run_name}` saved with --save-model: A2C optimises that run's reward model as it was saved,
    frozen: no labels, no reward training (C17 3.3's offline fitting; a test of whether A2C can climb a fixed learned
    reward). Needs --feedback synthetic, the default; its teacher is never asked."""
    reward_std: float = 0.05
    """standard deviation of the normalised learned reward given to A2C (C17 A.2: 0.05)"""
    pin_reward_level: bool = True
    """keep the learned reward's level across reward-model updates: after each update (and validation pass) the
    rewards of the current rollout keep the mean they had before it. The preference loss leaves the level free and an
    update moved it by up to 3 standard deviations (benchmark/README.md), which A2C reads as a change of every return"""
    reward_normalization: Literal["policy", "judged"] = "policy"
    """over which steps the learned reward gets its zero mean and --reward-std (C17 2.2.1 does not say): the rewards
    A2C received in the latest --reward-norm-window iterations (as mrahtz's reproduction; keeps the scale when the
    policy reaches states no labelled clip showed), or the steps of the labelled clips (set at each validation pass)"""
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
    """synthetic teacher skips a pair when both segment returns are below this (B-Pref)"""
    teacher_equal_margin: float = 0.0
    """synthetic teacher answers 'equal' when the scores differ by at most this (B-Pref); 0 = exact ties only"""
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

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""
    iterations_per_round: int = 0
    """A2C iterations per label round (computed in runtime)"""
    pretrain_iterations: int = 0
    """iterations of the initial policy used only for pretraining labels (computed in runtime)"""


# C17 A.2: the score (and counters that give the reward away) blanked, as (first row, end row, first column, end
# column) of the 210x160 screen. Each area was found by changing the score bytes of the game's RAM and seeing which
# pixels change (tests/test_atari.py repeats that check on real frames).
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
        self.episode += 1
        cube = round(self.episode ** (1 / 3)) ** 3 == self.episode
        self.frames = [self.env.render()] if (cube and self.episode < 1000) or self.episode % 1000 == 0 else None
        return obs, info

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


def validate_args(args: Args) -> None:
    """Reject impossible settings with a message (no traceback) before anything is created."""
    game = atari_game(args.env)
    if args.mask_score and game not in SCORE_AREAS:
        print(f"warning: no score layout known for '{game}': the score stays visible to the reward model and raters")
    if min(args.num_envs, args.num_steps, args.total_timesteps, args.log_every, args.checkpoint_every) < 1:
        raise SystemExit("error: --num-envs, --num-steps, --total-timesteps, --log-every, --checkpoint-every must be positive")
    if args.reward_norm_window < 1 or not args.reward_std > 0:
        raise SystemExit("error: --reward-norm-window and --reward-std must be positive")
    if args.round_steps < 1 or args.round_steps % args.num_steps:
        raise SystemExit(
            f"error: --round-steps {args.round_steps} must be a positive multiple of --num-steps {args.num_steps}"
        )
    args.batch_size = args.num_envs * args.num_steps
    args.num_iterations = args.total_timesteps // args.batch_size
    args.iterations_per_round = args.round_steps // args.num_steps
    rlhf = args.feedback != "true-reward"
    if args.frozen_reward is not None and args.feedback != "synthetic":
        raise SystemExit(
            f"error: --frozen-reward takes its reward model from a saved run and asks no labels; "
            f"it cannot be combined with --feedback {args.feedback}"
        )
    labelling = rlhf and args.frozen_reward is None  # RLHF with labels: pretraining rounds, the label schedule
    pretrain_rounds = math.ceil(args.pretrain_steps / (args.num_envs * args.round_steps)) if labelling else 0
    args.pretrain_iterations = pretrain_rounds * args.iterations_per_round
    if args.num_iterations <= args.pretrain_iterations:
        raise SystemExit(
            f"error: --total-timesteps {args.total_timesteps} leaves no RL after {args.pretrain_iterations * args.batch_size} "
            f"pretraining steps (--pretrain-steps rounded up to whole label rounds of {args.num_envs} x {args.round_steps})"
        )
    if not labelling:
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
    if args.labels <= 0:
        raise SystemExit(f"error: --labels must be positive (got {args.labels})")
    if not 1 <= args.pretrain_labels <= args.labels:
        raise SystemExit(f"error: --pretrain-labels must be between 1 and --labels {args.labels} (got {args.pretrain_labels})")
    if not 2 <= args.segment_len <= args.round_steps:
        raise SystemExit(f"error: --segment-len {args.segment_len} must be between 2 and --round-steps {args.round_steps}")
    if min(args.label_buffer, args.ensemble_size, args.candidate_multiplier, args.pretrain_epochs) < 1:
        raise SystemExit("error: --label-buffer, --ensemble-size, --candidate-multiplier, --pretrain-epochs must be positive")
    if min(args.reward_batch_size, args.reward_train_every, args.reward_eval_every, args.reward_eval_labels) < 1:
        raise SystemExit(
            "error: --reward-batch-size, --reward-train-every, --reward-eval-every, --reward-eval-labels must be positive"
        )
    if not 0 <= args.reward_dropout < 1:
        raise SystemExit("error: --reward-dropout must be in [0, 1)")
    if not 0 <= args.label_noise < 1 or not 0 <= args.teacher_epsilon <= 1 or not 0 < args.teacher_gamma <= 1:
        raise SystemExit("error: --label-noise must be in [0, 1), --teacher-epsilon in [0, 1], --teacher-gamma in (0, 1]")
    # each queried pair needs two segments of its own from one round's steps
    per_round = label_schedule(args)
    capacity = args.num_envs * (args.round_steps - args.segment_len + 1) // 2
    if per_round.max() > capacity:
        raise SystemExit(
            f"error: --labels {args.labels} is too large for this run: one label round holds at most {capacity} pairs of "
            f"{args.segment_len}-step segments, and the schedule asks for {per_round.max()} in one round. "
            "Use fewer labels, more --total-timesteps/--pretrain-steps, or a longer --round-steps."
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
    """nn.Dropout with its mask drawn from random bytes (8 per 64-bit draw), p rounded to a multiple of 1/256
    (exact for C17's 0.5). PyTorch's CPU dropout draws one random number per element: that was a fifth of a
    reward-model step on a CPU (benchmark/README.md). `generator`: its own random stream (the reward model trains in
    a thread of its own, and the global one would then be drawn from in an order that changes from run to run)."""

    generator = None

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        n, dropped = x.numel(), round(self.p * 256)
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
    `label_noise` chance of a uniformly random answer; mu = 1 left preferred, 0 right, 0.5 equal."""
    p_left = (1 - label_noise) * torch.sigmoid(returns_left - returns_right) + label_noise / 2
    return -(mu * torch.log(p_left) + (1 - mu) * torch.log(1 - p_left))


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


def record_step(history, h, stacks, game_starts, act, true_reward, done):
    """Keep step `h` of the round: the agent's frame stacks (envs, 4, 84, 84), whether each shows the first frame of
    a game, the actions, game score and whether the game ended at this step."""
    if h == 0:
        history["frames"][:3] = stacks[:, :3].swapaxes(0, 1)
    history["frames"][h + 3] = stacks[:, 3]
    previous = history["first_frame"][h - 1] if h > 0 else 0
    history["first_frame"][h] = np.where(game_starts & (h > 0), h + 3, previous)
    history["act"][h], history["true_reward"][h], history["done"][h] = act, true_reward, done


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
    return (gather_segments(history, (side[0][keep], side[1][keep]), segment_len) for side in (left, right))


@torch.no_grad()
def disagreement(ensemble, left, right):
    """Variance across members of each member's P[left > right]."""
    scores = torch.sigmoid(segment_returns(ensemble, left) - segment_returns(ensemble, right)).var(0, unbiased=False)
    return scores.cpu().numpy()


def stack_segments(segments):
    """A list of single segments (dicts of arrays) -> one dict of arrays with a leading batch axis."""
    return {k: np.stack([s[k] for s in segments]) for k in segments[0]}


# RLHF: the synthetic teacher
class SyntheticTeacher:
    """Prefers the segment with more game score (C17 3.1; equal scores are a tie), optionally with the noise of
    B-Pref's simulated teachers (Lee et al. 2021). Teachers share one interface: ask(left, right) queues pairs; poll()
    returns the answered ones as (left, right, mu), mu = 1 left better, 0 right better, 0.5 equal (exact ties, or
    scores within --teacher-equal-margin); pairs the teacher skips are dropped, and the next label round asks for new pairs
    in their place (the budget counts only labels answered)."""

    def __init__(self, rng, beta=float("inf"), gamma=1.0, epsilon=0.0, skip_threshold=float("-inf"), equal_margin=0.0):
        self.rng, self.beta, self.gamma, self.epsilon = rng, beta, gamma, epsilon
        self.skip_threshold, self.equal_margin = skip_threshold, equal_margin
        self.answered = []
        self.pending = 0  # pairs asked but not yet answered (always 0 for a synthetic teacher)

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
        mu = np.where(np.abs(diff) <= self.equal_margin, 0.5, mu)
        return np.where(np.maximum(return_left, return_right) < self.skip_threshold, np.nan, mu)

    def ask(self, left, right):
        mu = self.preferences(left["true_reward"], right["true_reward"])
        keep = ~np.isnan(mu)
        self.answered.append((index_segments(left, keep), index_segments(right, keep), mu[keep]))

    def poll(self):
        answered, self.answered = self.answered, []
        return answered


# RLHF: the human teacher, through label_server.py (C17 appendix B)
MU_OF_CHOICE = {"left": 1.0, "right": 0.0, "equal": 0.5}  # "cant_tell" is dropped (C17 2.2.2)
SEGMENT_KEYS = ("frames", "act", "true_reward")
SEGMENT_DTYPES = {"frames": np.uint8, "act": np.int64, "true_reward": np.float32}


class HumanTeacher:
    """People answer in a browser, through label_server.py. Same interface as SyntheticTeacher. ask() only queues;
    a background thread turns each segment's stored frames into a clip (enlarged, score blanked as the reward model
    sees it), uploads it, posts the pair and polls for answers, retrying with backoff while the server is down, so
    training goes on while people label (C17 2.2: asynchronous). Pairs not yet answered are saved with the run
    (save/load) and asked again when it resumes."""

    def __init__(self, server, token, experiment, instruction, clip_scale=4, clip_fps=15, poll_interval=2.0):
        self.server, self.token, self.experiment = server.rstrip("/"), token, experiment
        self.instruction, self.clip_scale, self.clip_fps, self.poll_interval = instruction, clip_scale, clip_fps, poll_interval
        self.lock = threading.Lock()
        self.queued = []  # pair ids still to encode, upload and post
        self.waiting = {}  # pair id -> (left, right) segments: asked, not yet answered
        self.answered = []  # (pair id, mu, seq) received, not yet handed over by poll()
        self.next_index = 0  # pair ids are {experiment}-{index}
        self.consumed_seq = 0  # label sequence number up to which answers are in the label buffer
        self.received_seq = 0  # label sequence number up to which the thread has fetched answers
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
                pair_id = f"{self.experiment}-{self.next_index:06d}"
                self.next_index += 1
                self.waiting[pair_id] = (index_segments(left, i), index_segments(right, i))
                self.queued.append(pair_id)

    def poll(self):
        if self.failure is not None:
            raise SystemExit(f"error: the human-feedback thread stopped: {self.failure}")
        with self.lock:
            answered, self.answered = self.answered, []
            batches = []
            for pair_id, mu, seq in answered:
                left, right = self.waiting.pop(pair_id)
                self.consumed_seq = max(self.consumed_seq, seq)
                if mu is not None:
                    batches.append((left, right, mu))
        if not batches:
            return []
        lefts, rights, mus = zip(*batches)
        return [(stack_segments(lefts), stack_segments(rights), np.array(mus))]

    def wait_for_all(self, progress_every=10.0):
        """Block until every asked pair is answered (the pretraining labels RL cannot start without)."""
        last = 0.0
        while self.unanswered and self.failure is None:
            if time.time() - last > progress_every:
                print(
                    f"waiting for {self.unanswered} labels: label them at {self.server}/ ({len(self.queued)} pairs still to upload)"
                )
                last = time.time()
            time.sleep(0.5)

    # --- the background thread ---
    def _request(self, method, path, body=None, content_type="application/json"):
        """One HTTP call, retried with exponential backoff (1 s to 60 s) while the server is down or answers 5xx;
        a 4xx stops the thread with the server's message (poll() then stops the run)."""
        delay, warned = 1.0, False
        while not self.stop.is_set():
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
                if error.code < 500:  # the request itself is wrong: retrying cannot help
                    hint = " (does --label-token match the server's --token?)" if error.code == 401 else ""
                    raise RuntimeError(f"{method} {path}: HTTP {error.code} {error.read().decode(errors='replace')}{hint}")
                reason = f"HTTP {error.code}"
            except (urllib.error.URLError, OSError) as error:
                reason = str(getattr(error, "reason", error))
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
            last_poll = 0.0
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
                            self.queued.remove(pair_id)
                if pair_id is None or time.time() - last_poll > self.poll_interval:
                    self._fetch_labels()
                    last_poll = time.time()
                if pair_id is None:
                    self.stop.wait(self.poll_interval)
        except Exception as error:  # reported to the training loop by poll()
            self.failure = f"{type(error).__name__}: {error}"

    def _fetch_labels(self):
        reply = self._request("GET", f"/api/labels?experiment={self.experiment}&since={self.received_seq}")
        if reply is None:
            return
        with self.lock:
            for label in reply["labels"]:
                if label["pair_id"] in self.waiting:  # an answer to a pair of this run that is not in the buffer yet
                    self.answered.append((label["pair_id"], MU_OF_CHOICE.get(label["choice"]), label["seq"]))
                self.received_seq = max(self.received_seq, label["seq"])

    def start(self):
        self.thread.start()
        return self

    def close(self):
        self.stop.set()
        self.thread.join(timeout=60)

    # --- persistence: asked but unanswered pairs survive a stopped run ---
    def save(self, path):
        with self.lock:
            ids = list(self.waiting)
            state = {"pair_ids": np.array(ids, dtype=str), "next_index": self.next_index, "consumed_seq": self.consumed_seq}
            for side, which in (("left", 0), ("right", 1)):
                for key in SEGMENT_KEYS:
                    values = [self.waiting[i][which][key] for i in ids]
                    state[f"{side}_{key}"] = np.stack(values) if values else np.zeros(0, SEGMENT_DTYPES[key])
        np.savez_compressed(path + ".tmp.npz", **state)
        os.replace(path + ".tmp.npz", path)

    def load(self, path):
        """Asked-but-unanswered pairs of a stopped run: asked again (re-posting a pair is harmless)."""
        with np.load(path) as state:
            self.next_index, self.consumed_seq = int(state["next_index"]), int(state["consumed_seq"])
            self.received_seq = self.consumed_seq
            for n, pair_id in enumerate(state["pair_ids"]):
                left, right = ({k: state[f"{side}_{k}"][n] for k in SEGMENT_KEYS} for side in ("left", "right"))
                self.waiting[str(pair_id)] = (left, right)
                self.queued.append(str(pair_id))


# RLHF: the labels, with each member's validation split and bootstrap weights (C17 2.2.3)
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


def save_labels(folder, stored):
    """One file per batch of new labels (labels/{labels so far}.npz): a stopped run loses nothing, and no save
    rewrites the whole buffer."""
    os.makedirs(folder, exist_ok=True)
    flat = {f"{side}_{k}": stored[side][k] for side in ("left", "right") for k in SEGMENT_KEYS}
    flat |= {k: stored[k] for k in ("mu", "is_val", "weight")}
    path = f"{folder}/{stored['end']:07d}.npz"
    np.savez_compressed(path + ".tmp.npz", **flat)
    os.replace(path + ".tmp.npz", path)


def load_labels(folder, buffer):
    """Every saved batch, in order, into the buffer (which keeps the latest `capacity`)."""
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".npz") and not name.endswith(".tmp.npz"):
            with np.load(os.path.join(folder, name)) as saved:
                left, right = ({k: saved[f"{side}_{k}"] for k in SEGMENT_KEYS} for side in ("left", "right"))
                buffer.add(left, right, saved["mu"], saved["is_val"], saved["weight"])


@torch.no_grad()
def label_step_rewards(ensemble, labels, chunk=32):
    """Raw step rewards of each member for every step of the labelled segments: (size, n, 2, L), in chunks."""
    if len(labels["mu"]) == 0:
        return torch.zeros((ensemble.size, 0, *labels["act"].shape[1:]), device=ensemble.device)
    return torch.cat(
        [segment_rewards(ensemble, labels["frames"][i : i + chunk]) for i in range(0, len(labels["mu"]), chunk)],
        1,
    )


def train_reward_model(ensemble, optimizer, buffer, l2_coef, steps, batch_size, label_noise, rng):
    """`steps` Adam steps on random minibatches of labels."""
    for _ in range(steps if buffer.size else 0):
        reward_step(ensemble, optimizer, random_batch(buffer, batch_size, rng), l2_coef, label_noise)


def random_batch(buffer, batch_size, rng):
    """`batch_size` labels drawn with replacement from the buffer (all it holds if fewer), copied out of it."""
    return buffer.get(rng.integers(0, buffer.size, min(batch_size, buffer.size)))


def reward_step(ensemble, optimizer, batch, l2_coef, label_noise):
    """One Adam step on a minibatch of labels (from LabelBuffer.get); each member's loss uses its own bootstrap
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


def fit_step(ensemble, optimizer, batch, l2_coef, label_noise, held_out, target_std):
    """What the reward thread does each time: one reward_step, then, if `held_out` labels are given, the validation
    pass on them (score_labels)."""
    reward_step(ensemble, optimizer, batch, l2_coef, label_noise)
    return None if held_out is None else score_labels(ensemble, held_out, label_noise, target_std)


def evaluate_reward_model(ensemble, buffer, count, label_noise, target_std):
    """On the `count` most recent labels: each member's training loss (weighted by its bootstrap weights: the loss
    it trains on) and validation loss (on the labels its resample left out), and the share of held-out strict
    preferences each member orders correctly (averaged over members). Also refits the reward normalisation on the
    steps of those labels."""
    return score_labels(ensemble, buffer.get(buffer.latest(count)), label_noise, target_std)


@torch.no_grad()
def score_labels(ensemble, labels, label_noise, target_std):
    """evaluate_reward_model on given labels (from LabelBuffer.get)."""
    step_rewards = label_step_rewards(ensemble, labels)  # (members, labels, 2, L)
    returns = step_rewards.sum(-1)
    mu = torch.as_tensor(labels["mu"], device=ensemble.device)
    losses = preference_loss(returns[..., 0], returns[..., 1], mu, label_noise)
    is_val = torch.as_tensor(labels["is_val"], device=ensemble.device).T.float()
    weight = torch.as_tensor(labels["weight"], device=ensemble.device).T  # (members, labels)
    # the loss each member trains on (reward_step): the adaptive L2 compares its validation loss with this one
    train_loss = (losses * weight).sum(1) / weight.sum(1)  # NaN for a member with no weighted label here
    val_loss = (losses * is_val).sum(1) / is_val.sum(1)  # NaN for a member with no held-out label yet
    correct = ((returns[..., 0] > returns[..., 1]).float() == mu).float()
    judged = is_val * (mu != 0.5).float()  # "equal" answers have no right order
    val_accuracy = ((correct * judged).sum(1) / judged.sum(1)).nanmean().item()  # members with held-out strict labels
    ensemble.fit_normalization(step_rewards.reshape(ensemble.size, -1), target_std)
    return train_loss, val_loss, val_accuracy


@torch.no_grad()
def pin_level(ensemble, stacks, before):
    """Shift the ensemble's output so that `stacks` (the current rollout) get the same mean normalised reward as
    `before` (theirs before a reward-model update): the update may change what the reward prefers, not its level."""
    ensemble.ensemble_mean += (ensemble.normalized_reward(stacks).mean() - before.mean()) * ensemble.ensemble_std


def adapt_l2(l2_coef, train_loss, val_loss, low=1.1, high=1.5, factor=1.25):
    """C17 2.2.3: keep each member's validation loss between 1.1x and 1.5x its training loss (a NaN loss, no
    held-out or no weighted label yet, leaves the coefficient as it is)."""
    ratio = val_loss / train_loss.clamp(min=1e-8)
    return torch.where(ratio > high, l2_coef * factor, torch.where(ratio < low, l2_coef / factor, l2_coef))


# Evaluation of a saved agent
def evaluate(checkpoint_path, env_id, episodes, seed=0, noop_max=30, mask_score=True):
    """Game scores of the saved agent (sampling its actions: a greedy Atari policy can stall)."""
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    env = make_env(env_id, 0, False, None, noop_max, mask_score)()
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


if __name__ == "__main__":
    args = tyro.cli(Args)
    checkpoint = None
    if args.resume:
        checkpoint_path = os.path.join(args.resume, "checkpoint.pt")
        if not os.path.isfile(checkpoint_path):
            raise SystemExit(f"error: no checkpoint at {checkpoint_path} (was the run started with --save-model?)")
        checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
        # a resumed run keeps its own settings; only what to do with it comes from this command line
        keep = {k: getattr(args, k) for k in ("resume", "eval_only", "eval_episodes")}
        args = Args(**{**checkpoint["args"], **keep})
        if args.eval_only:
            scores = evaluate(checkpoint_path, args.env, args.eval_episodes, args.seed, args.noop_max, args.mask_score)
            print(f"eval: {len(scores)} games of {args.env}: score {np.mean(scores):.1f} +- {np.std(scores):.1f}")
            sys.exit(0)
        run_dir = os.path.normpath(args.resume)
    elif args.eval_only:
        raise SystemExit("error: --eval-only needs --resume runs/<run_name> (a run saved with --save-model)")
    else:
        run_dir = f"runs/{args.env.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    validate_args(args)
    rlhf = args.feedback != "true-reward"
    frozen = args.frozen_reward is not None  # RLHF on a saved run's reward model, unchanged (see Args)
    if frozen and checkpoint is None:
        source_path = os.path.join(args.frozen_reward, "checkpoint.pt")
        if not os.path.isfile(source_path):
            raise SystemExit(f"error: no checkpoint at {source_path} (--frozen-reward needs a run saved with --save-model)")
        source = torch.load(source_path, map_location="cpu", weights_only=False)
        if source.get("reward_ensemble") is None:
            raise SystemExit(f"error: {source_path} has no reward model (a --feedback true-reward run)")
        # the ensemble is rebuilt as that run built it
        args.ensemble_size, args.reward_dropout = source["args"]["ensemble_size"], source["args"]["reward_dropout"]
    os.makedirs(run_dir, exist_ok=True)
    writer = SummaryWriter(run_dir)
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
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

    # RLHF: reward ensemble, labels and teacher
    ensemble = fitting = fitting_rng = reward_optimizer = buffer = teacher = None
    l2_coef = torch.full((args.ensemble_size,), 1e-4, device=device)
    schedule = label_schedule(args) if rlhf and not frozen else None
    labels_dir = f"{run_dir}/labels"
    pending_path = f"{run_dir}/pending_pairs.npz"  # RLHF, human feedback: pairs asked but not yet answered
    if rlhf:
        # two copies of the reward model: `ensemble` gives A2C its rewards and scores candidate pairs, `fitting`
        # trains, in a thread of its own during RL (see "the reward model keeps training" below)
        ensemble = RewardEnsemble(args.ensemble_size, args.reward_dropout).to(device).eval()
        fitting = RewardEnsemble(args.ensemble_size, args.reward_dropout).to(device).eval()
        fitting.load_state_dict(ensemble.state_dict())
        # its dropout's own random stream, with a seed of its own (not the global torch generator's) drawn from the run's
        dropout_seed = int(np.random.SeedSequence(args.seed).spawn(1)[0].generate_state(1, np.uint64)[0])
        fitting_rng = torch.Generator(device).manual_seed(dropout_seed)
        for module in fitting.modules():
            if isinstance(module, ByteDropout):
                module.generator = fitting_rng
        reward_optimizer = optim.Adam(fitting.parameters(), lr=args.reward_lr)
        buffer = LabelBuffer(args.label_buffer, args.segment_len, args.ensemble_size, rng)
    if frozen and checkpoint is None:
        ensemble.load_state_dict(source["reward_ensemble"])  # the model that run's A2C used last
        # its normalisation dates from that run's last validation pass, and the members kept training after it:
        # refit it on the run's latest labels, as a validation pass at the checkpoint would have
        latest = LabelBuffer(args.reward_eval_labels, source["args"]["segment_len"], args.ensemble_size, rng)
        load_labels(f"{args.frozen_reward}/labels", latest)
        if latest.size:
            ensemble.fit_normalization(
                label_step_rewards(ensemble, latest.get(np.arange(latest.size))).flatten(1), args.reward_std
            )
        print(
            f"frozen reward model of {args.frozen_reward} (saved at step {source['global_step']}; normalisation refit on "
            f"its latest {latest.size} labels): no labels are asked"
        )
    if args.feedback == "synthetic" and not frozen:
        teacher = SyntheticTeacher(
            rng,
            args.teacher_beta,
            args.teacher_gamma,
            args.teacher_epsilon,
            args.teacher_skip_threshold,
            args.teacher_equal_margin,
        )
    elif args.feedback == "human":
        experiment = re.sub(r"[^A-Za-z0-9_.-]", "-", os.path.basename(run_dir))
        teacher = HumanTeacher(
            args.label_server, args.label_token, experiment, args.instruction, args.clip_scale, args.clip_fps
        )
        print(f"human feedback: pairs go to {args.label_server}/ (experiment {experiment}); open it in a browser to label")

    start_iteration, global_step = 1, 0
    checkpoint_path = f"{run_dir}/checkpoint.pt"
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["agent"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        if rlhf:
            ensemble.load_state_dict(checkpoint["reward_ensemble"])
            fitting.load_state_dict(checkpoint.get("reward_fitting") or checkpoint["reward_ensemble"])
            reward_optimizer.load_state_dict(checkpoint["reward_optimizer"])
            l2_coef = checkpoint["l2_coef"].to(device)
            load_labels(labels_dir, buffer)
            if args.feedback == "human" and os.path.exists(pending_path):
                teacher.load(pending_path)
        # a run resumes at the start of the label round it was stopped in (a round's steps are its label pool)
        start_iteration = checkpoint["iteration"] // args.iterations_per_round * args.iterations_per_round + 1
        global_step = (start_iteration - 1) * args.batch_size
        # every random stream goes on where it stopped: new labels get new validation splits and bootstrap weights,
        # new pairs, batches and dropout masks (the games restart: the emulators' state is not saved; a checkpoint
        # written mid-round, e.g. on Ctrl-C, redoes that round's start with the later state). Checkpoints of
        # older versions have none: their streams restart from the seed
        random_states = checkpoint.get("random_states") or {}
        if "numpy" in random_states:
            rng.bit_generator.state = random_states["numpy"]
            np.random.set_state(random_states["numpy_global"])
            random.setstate(random_states["python"])
            torch.set_rng_state(random_states["torch"])
            if random_states["torch_cuda"] is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(random_states["torch_cuda"])
            if fitting_rng is not None and random_states["reward_dropout"] is not None:
                fitting_rng.set_state(random_states["reward_dropout"])
        print(f"resumed {run_dir} at step {global_step} with {buffer.total if rlhf else 0} labels")

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.num_envs, 4, 84, 84), dtype=torch.uint8).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long).to(device)
    true_rewards = np.zeros((args.num_steps, args.num_envs), np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), bool)
    history = new_history(args.round_steps, args.num_envs) if rlhf else None  # RLHF: segments come from here
    predicted_episode_return = np.zeros(args.num_envs)

    def save_checkpoint():
        """Everything needed to evaluate the agent or resume the run after the last completed iteration (exactly as if
        it had never stopped only at a round's end, and but for the games' state)."""
        if reward_job is not None:
            wait([reward_job])  # the reward thread's step in progress (its error, if any, is raised where RL waits)
        step_done = reward_job is not None and reward_job.exception() is None  # A2C takes its weights at the next one
        state = {
            "args": vars(args),
            "agent": agent.state_dict(),
            "optimizer": optimizer.state_dict(),
            "reward_ensemble": ensemble.state_dict() if rlhf else None,  # the one A2C uses
            "reward_fitting": fitting.state_dict() if rlhf and not frozen else None,  # the one that trains
            "reward_optimizer": reward_optimizer.state_dict() if rlhf else None,
            "l2_coef": l2_coef,
            "global_step": completed_step,
            "iteration": completed,
            # RLHF: what else decides what comes next: every random stream, the reward-fit counter (when validation
            # and the L2 adaptation run), the finished step's validation, the latest figures, the policy reward window
            "random_states": {
                "numpy": rng.bit_generator.state,  # pairs, teacher, validation splits, bootstrap weights, batches
                "numpy_global": np.random.get_state(),
                "python": random.getstate(),
                "torch": torch.get_rng_state(),  # A2C's actions
                "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "reward_dropout": fitting_rng.get_state() if fitting_rng is not None else None,
            },
            "reward_steps": reward_steps,
            "reward_step_done": (reward_job.result(),) if step_done else None,
            "reward_losses": (train_loss, val_loss, val_accuracy),
            "policy_rewards": list(policy_normalizer.recent),
        }
        torch.save(state, checkpoint_path + ".tmp")
        os.replace(checkpoint_path + ".tmp", checkpoint_path)  # atomic: a run killed while saving keeps the old one

    if args.feedback == "human":
        teacher.start()

    # TRY NOT TO MODIFY: start the game
    start_time, start_step = time.time(), global_step
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs).to(device)
    game_starts = np.ones(args.num_envs, bool)  # RLHF: which environments show the first frame of a game
    recent_returns, recent_predicted = [], []
    learned_z = []  # RLHF: the policy's mean learned reward per step since the last log line (see the log below)
    policy_normalizer = RecentRewardNormalizer(args.reward_norm_window, args.reward_std)  # RLHF: see Args
    reward_steps = 0  # RLHF: reward-model gradient steps so far, and the latest validation figures
    reward_thread = ThreadPoolExecutor(1, "reward-fit") if rlhf and not frozen else None
    reward_job = None  # RLHF: the reward thread's latest step (a Future)
    train_loss = val_loss = torch.full((args.ensemble_size,), math.nan)
    val_accuracy = math.nan
    if checkpoint is not None and "reward_steps" in checkpoint:  # RLHF: the counters of the stopped run (see above)
        reward_steps = checkpoint["reward_steps"]
        train_loss, val_loss, val_accuracy = checkpoint["reward_losses"]
        policy_normalizer.recent.extend(checkpoint["policy_rewards"])
        if checkpoint["reward_step_done"] is not None:  # the step the run took last: A2C takes it as it would have
            validation = checkpoint["reward_step_done"][0]
            if validation is not None:  # the losses were saved from the device; adapt_l2 uses them there
                validation = (validation[0].to(device), validation[1].to(device), validation[2])
            reward_job = Future()
            reward_job.set_result(validation)
    # the last iteration whose update finished, and its step count: what a checkpoint resumes after
    completed, completed_step = start_iteration - 1, global_step
    # `kill`, `timeout` or a cluster's scheduler (SIGTERM) stops the run as Ctrl-C does: the checkpoint is written
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    try:
        for iteration in range(start_iteration, args.num_iterations + 1):
            pretraining = iteration <= args.pretrain_iterations  # RLHF: the initial policy only collects labels
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

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
                    h = (iteration - 1) % args.iterations_per_round * args.num_steps + step
                    record_step(history, h, obs[step].cpu().numpy(), game_starts, action.cpu().numpy(), reward, dones[step])
                    game_starts = dones[step]
                if "final_info" in infos and "episode" in infos["final_info"]:
                    episodes = infos["final_info"]["episode"]
                    for i in np.flatnonzero(infos["final_info"]["_episode"]):
                        recent_returns.append(float(episodes["r"][i]))
                        writer.add_scalar("charts/episodic_return", episodes["r"][i], global_step)
                        writer.add_scalar("charts/episodic_length", episodes["l"][i], global_step)
                next_obs = torch.as_tensor(next_obs_np).to(device)

            if rlhf and not frozen and iteration % args.iterations_per_round == 0:
                # RLHF: a label round: this round's share of the budget (C17 A.2 schedule, 2.2.4 selection)
                label_round = iteration // args.iterations_per_round - 1
                # the schedule's total so far, less what is answered or waiting (a resumed round asks nothing twice)
                to_ask = int(schedule[: label_round + 1].sum()) - buffer.total - teacher.pending
                if to_ask > 0:
                    # before RL starts the ensemble is untrained: its disagreement means nothing, so pairs are random
                    selection = "random" if pretraining else args.selection
                    left, right = select_pairs(
                        rng, ensemble, history, args.segment_len, to_ask, args.candidate_multiplier, selection
                    )
                    teacher.ask(left, right)
                if iteration == args.pretrain_iterations and args.feedback == "human":
                    teacher.wait_for_all()  # people label asynchronously, but RL cannot start without these
                for left, right, mu in teacher.poll():
                    stored = buffer.add(left, right, mu)
                    save_labels(labels_dir, stored | {"end": buffer.total})
                if args.feedback == "human":
                    teacher.save(pending_path)  # in step with the saved labels: their answers are not fetched again
                if iteration == args.pretrain_iterations and buffer.size == 0:
                    # RLHF: a reward model fitted on nothing gives NaN: stop (labels and checkpoint are saved below)
                    if args.feedback == "human":
                        why = (
                            "every pair from the initial policy was answered 'can't tell'. Label the new pairs a "
                            f"resumed run asks (--resume {run_dir}, for a run started with --save-model)"
                        )
                    else:
                        why = (
                            "the synthetic teacher skipped every pair from the initial policy (both segments' returns "
                            f"below --teacher-skip-threshold {args.teacher_skip_threshold:g}). Start again with a lower "
                            "--teacher-skip-threshold, or more --pretrain-steps"
                        )
                    raise SystemExit(f"error: no label to pretrain the reward model on: {why}")
                if iteration == args.pretrain_iterations:  # C17 A.2: 200 epochs on the pretraining labels
                    epoch_steps, fit_start = math.ceil(buffer.size / args.reward_batch_size), time.time()
                    for epoch in range(1, args.pretrain_epochs + 1):
                        train_reward_model(
                            fitting,
                            reward_optimizer,
                            buffer,
                            l2_coef,
                            epoch_steps,
                            args.reward_batch_size,
                            args.label_noise,
                            rng,
                        )
                        # a line per epoch, with the time left: on a CPU an epoch can take a minute or more
                        elapsed = time.time() - fit_start
                        line = (
                            f"pretraining the reward model: epoch {epoch}/{args.pretrain_epochs} ({elapsed:.0f} s, "
                            f"about {elapsed / epoch * (args.pretrain_epochs - epoch):.0f} s left)"
                        )
                        if epoch % 10 == 0 or epoch == args.pretrain_epochs:
                            train_loss, val_loss, val_accuracy = evaluate_reward_model(
                                fitting, buffer, args.reward_eval_labels, args.label_noise, args.reward_std
                            )
                            l2_coef = adapt_l2(l2_coef, train_loss, val_loss)
                            line += (
                                f", val accuracy {val_accuracy:.2f}, train loss {train_loss.nanmean():.3f}, "
                                f"val loss {val_loss.nanmean():.3f}"
                            )
                        print(line)
                    ensemble.load_state_dict(fitting.state_dict())

            if pretraining:
                if iteration % args.iterations_per_round == 0:
                    print(
                        f"pretraining: step {global_step}, labels {buffer.total}/{args.pretrain_labels} from the initial policy"
                    )
                    writer.add_scalar("labels/total", buffer.total, global_step)
                completed, completed_step = iteration, global_step
                continue

            # RLHF: the reward model keeps training as labels arrive. C17 2.2 fits it in parallel with RL: here a
            # thread takes each step on `fitting` while A2C runs the next --reward-train-every iterations, and then
            # `ensemble` takes its weights. The steps are those of taking them in turn (runs stay reproducible), and
            # A2C's reward is one step behind; on a CPU the thread uses the core that A2C leaves idle.
            if rlhf and not frozen and iteration % args.reward_train_every == 0 and buffer.size:
                if reward_job is not None:
                    validation = reward_job.result()  # waits for the step to end (and raises its error, if any)
                    if validation is not None:
                        train_loss, val_loss, val_accuracy = validation
                        l2_coef = adapt_l2(l2_coef, train_loss, val_loss)
                    before = ensemble.normalized_reward(obs) if args.pin_reward_level else None
                    ensemble.load_state_dict(fitting.state_dict())
                    if args.pin_reward_level:
                        pin_level(ensemble, obs, before)
                reward_steps += 1
                # the labels are copied out now: the thread never reads the buffer, which label rounds write to
                batch = random_batch(buffer, args.reward_batch_size, rng)
                held_out = None
                if reward_steps % args.reward_eval_every == 0:
                    held_out = buffer.get(buffer.latest(args.reward_eval_labels))
                reward_job = reward_thread.submit(
                    fit_step, fitting, reward_optimizer, batch, l2_coef, args.label_noise, held_out, args.reward_std
                )

            # RLHF: the reward A2C optimises, for the whole rollout in one batched call
            if rlhf:
                rewards_np = ensemble.normalized_reward(obs).cpu().numpy()
                learned_z.append(rewards_np.mean() / args.reward_std)  # for the log (see reward_model/policy_reward_z)
                if args.reward_normalization == "policy":
                    rewards_np = policy_normalizer(rewards_np)
                for t in range(args.num_steps):  # predicted score of whole games, next to the true one
                    predicted_episode_return += rewards_np[t]
                    for i in np.flatnonzero(dones[t]):
                        recent_predicted.append(predicted_episode_return[i])
                        writer.add_scalar("charts/predicted_return", predicted_episode_return[i], global_step)
                    predicted_episode_return[dones[t]] = 0.0
            else:
                rewards_np = np.sign(true_rewards)  # the usual A2C reward clipping
            rewards = torch.as_tensor(rewards_np, dtype=torch.float32).to(device)
            # C17 A.2: by default the agent is not told where games end (the returns run on into the next game)
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
            completed, completed_step = iteration, global_step

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
                    writer.add_scalar("reward_model/loss", train_loss.nanmean().item(), global_step)
                    writer.add_scalar("reward_model/val_loss", val_loss.nanmean().item(), global_step)
                    writer.add_scalar("reward_model/val_accuracy", val_accuracy, global_step)
                    writer.add_scalar("reward_model/l2", l2_coef.mean().item(), global_step)
                    writer.add_scalar("reward_model/true_correlation", correlation, global_step)
                    # the policy's learned reward per step over --reward-std, before the policy normalisation. With
                    # --frozen-reward: in std of the labelled clips' rewards, a fixed yardstick of how far A2C has
                    # climbed. With --pin-reward-level (online) updates keep the level, so only its changes count.
                    writer.add_scalar("reward_model/policy_reward_z", np.mean(learned_z), global_step)
                    writer.add_scalar("labels/total", buffer.total, global_step)
                    writer.add_scalar("labels/buffer", buffer.size, global_step)
                    writer.add_scalar("labels/pending", teacher.pending if teacher else 0, global_step)
                    if recent_predicted:
                        line += f", predicted return {np.mean(recent_predicted[-10:]):.2f}"
                    line += f", learned reward z {np.mean(learned_z):+.3f}"
                    if frozen:
                        line += f", frozen reward model, corr {correlation:.2f}"
                    else:
                        line += f", labels {buffer.total}/{args.labels}, val acc {val_accuracy:.2f}, corr {correlation:.2f}"
                    learned_z = []
                print(line)
                recent_returns, recent_predicted = recent_returns[-10:], recent_predicted[-10:]

            if args.save_model and iteration % args.checkpoint_every == 0:
                save_checkpoint()
    except KeyboardInterrupt:
        print(f"interrupted at step {global_step}")
    finally:
        if reward_thread is not None:
            reward_thread.shutdown()  # after the step in progress, if any
        # nothing is lost when a run stops: labels are saved as they arrive, the checkpoint with --save-model
        if rlhf and not frozen:
            print(f"{buffer.total} labels saved in {labels_dir}/")
            if args.feedback == "human":
                teacher.close()
                teacher.save(pending_path)
                print(f"{teacher.pending} unanswered pairs saved to {pending_path} (asked again on --resume)")
        if args.save_model:
            save_checkpoint()
            print(f"checkpoint saved to {checkpoint_path}")
        envs.close()
        writer.close()
