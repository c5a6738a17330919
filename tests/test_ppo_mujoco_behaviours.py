"""Scripted preferences (--feedback scripted --behaviour ...): each behaviour function judged on segments built from
the simulator's own states (so a wrong observation index or sign fails), the scripted teacher, and a tiny run."""

import re

import gymnasium as gym
import numpy as np
import pytest
import rlhf_ppo_mujoco as rl
import torch
import tyro
from helpers import only_run_dir, run_script, scalars

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the v4 tasks (gymnasium prefers v5)


def simulated(env_id, set_joints, length=10):
    """One segment of `length` steps whose observations the task itself makes from joint positions and velocities:
    set_joints(qpos, qvel, t) changes them in place for step t. Returns the segment and the MuJoCo data of its last
    step (for geometry checks)."""
    env = gym.make(env_id)
    env.reset(seed=0)
    sim = env.unwrapped
    obs = []
    for t in range(length):
        qpos, qvel = sim.init_qpos.copy(), np.zeros_like(sim.init_qvel)
        set_joints(qpos, qvel, t)
        sim.set_state(qpos, qvel)
        obs.append(sim._get_obs())
    data = sim.data
    segment = {
        "obs": np.array(obs, np.float32)[None],
        "act": np.zeros((1, length) + env.action_space.shape, np.float32),
        "mask": np.ones((1, length), np.float32),
    }
    return segment, data, env


def score(behaviour, segment):
    return float(rl.BEHAVIOURS[behaviour][2](segment).sum())


def test_backflip_prefers_rotating_backwards_in_the_air_over_forwards_or_on_the_ground():
    def backwards_in_the_air(qpos, qvel, t):
        qpos[1], qpos[2], qvel[2] = 1.5, -0.3 * t, -6.0  # rootz, rooty (the torso's angle), its angular velocity

    flip, data, env = simulated("Hopper-v4", backwards_in_the_air)
    # the angle went down: the torso's top has swung backwards, past the hip, and the foot forwards
    assert data.body("foot").xpos[0] > data.body("torso").xpos[0] + 0.3
    env.close()
    forwards, _, _ = simulated("Hopper-v4", lambda q, v, t: (q.__setitem__(1, 1.5), v.__setitem__(2, 6.0)))
    on_the_ground, _, _ = simulated("Hopper-v4", lambda q, v, t: (q.__setitem__(1, 0.3), v.__setitem__(2, -6.0)))
    standing, _, _ = simulated("Hopper-v4", lambda q, v, t: None)
    assert score("backflip", flip) > score("backflip", standing) == 0
    assert score("backflip", standing) > score("backflip", forwards)
    assert score("backflip", on_the_ground) == 0


def test_backwards_prefers_the_cheetah_moving_to_negative_x():
    def moving(speed):
        return lambda qpos, qvel, t: (qpos.__setitem__(0, speed * 0.05 * t), qvel.__setitem__(0, speed))

    back, _, _ = simulated("HalfCheetah-v4", moving(-3.0))
    slow_back, _, _ = simulated("HalfCheetah-v4", moving(-1.0))
    forward, _, _ = simulated("HalfCheetah-v4", moving(3.0))
    assert score("backwards", back) > score("backwards", slow_back) > 0 > score("backwards", forward)


def test_one_leg_prefers_an_upright_walker_on_its_right_leg_with_the_left_foot_lifted():
    def posture(height=1.25, right_knee=0.0, left_knee=0.0):
        def set_joints(qpos, qvel, t):
            qpos[1], qpos[4], qpos[7] = height, right_knee, left_knee  # rootz, leg_joint, leg_left_joint

        return set_joints

    lifted, _, _ = simulated("Walker2d-v4", posture(left_knee=-1.5))
    half, _, _ = simulated("Walker2d-v4", posture(left_knee=-0.7))
    straight, _, _ = simulated("Walker2d-v4", posture())
    crouch, _, _ = simulated("Walker2d-v4", posture(right_knee=-1.0, left_knee=-1.0))
    right_lifted, data, env = simulated("Walker2d-v4", posture(right_knee=-1.5))
    assert data.body("foot").xpos[2] > data.body("foot_left").xpos[2] + 0.3  # this one stands on its left leg
    env.close()
    fallen, _, _ = simulated("Walker2d-v4", posture(height=0.5, left_knee=-1.5))
    assert score("one-leg", lifted) > score("one-leg", half) > score("one-leg", straight) == 0
    assert score("one-leg", crouch) == score("one-leg", right_lifted) == score("one-leg", fallen) == 0


def test_steps_after_a_termination_score_nothing():
    segment, _, _ = simulated("HalfCheetah-v4", lambda q, v, t: v.__setitem__(0, -3.0))
    ended = dict(segment, mask=(np.arange(10) < 4).astype(np.float32)[None])
    assert score("backwards", ended) == pytest.approx(0.4 * score("backwards", segment))


def test_the_scripted_teacher_prefers_the_segment_its_behaviour_scores_higher():
    rng = np.random.default_rng(0)
    left = {"obs": np.zeros((4, 5, 17), np.float32), "act": np.zeros((4, 5, 6), np.float32), "mask": np.ones((4, 5))}
    right = {k: v.copy() for k, v in left.items()}
    left["obs"][..., 8] = np.array([-3.0, 2.0, -1.0, -1.0])[:, None]  # x velocity: backwards is negative
    right["obs"][..., 8] = np.array([-1.0, -1.0, -1.0, 2.0])[:, None]
    teacher = rl.ScriptedTeacher(rl.backwards_steps, rng)
    teacher.ask(left, right)
    [(asked_left, asked_right, mu)] = teacher.poll()
    assert mu.tolist() == [1.0, 0.0, 0.5, 1.0]
    assert np.array_equal(asked_left["obs"], left["obs"]) and np.array_equal(asked_right["obs"], right["obs"])
    # the synthetic teacher's noise options work the same way: epsilon 1 flips every strict answer
    flipped = rl.ScriptedTeacher(rl.backwards_steps, rng, float("inf"), 1.0, 1.0)
    flipped.ask(left, right)
    assert flipped.poll()[0][2].tolist() == [0.0, 1.0, 0.5, 0.0]


@pytest.mark.parametrize(
    "args, message",
    [
        ("--feedback scripted", "--feedback scripted needs --behaviour"),
        ("--behaviour backflip", "--behaviour needs --feedback scripted"),
        ("--feedback scripted --behaviour moonwalk", "unknown --behaviour 'moonwalk'; known: backflip, backwards, one-leg"),
        (
            "--feedback scripted --behaviour backwards",
            "--behaviour backwards is for HalfCheetah (e.g. HalfCheetah-v4), not Hopper-v4",
        ),
        (
            '--feedback scripted --behaviour backflip --env-kwargs {"exclude_current_positions_from_observation":false}',
            "reads Hopper's default observation (11 numbers)",
        ),
    ],
)
def test_scripted_settings_that_cannot_work_are_refused_with_a_message(args, message):
    settings = tyro.cli(rl.Args, args=args.split())
    with pytest.raises(SystemExit, match=re.escape(message)):
        rl.fill_runtime_fields(settings)
        rl.validate_args(settings)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # validate_args probes Hopper-v4 (gymnasium prefers v5)
def test_a_backflip_run_whose_hopper_ends_its_episodes_before_any_flip_is_warned(capsys):
    """Hopper ends an episode once its torso tilts 0.2 rad: without README's --env-kwargs no flip can be shown, and a
    run said nothing about it."""
    warning = "no episode lasts through a flip"
    for env_kwargs, warned in (
        ("{}", True),
        ('{"healthy_angle_range":[-1000,1000]}', False),
        ('{"terminate_when_unhealthy":false}', False),  # (README's other way: episodes last, the gallery's run)
    ):
        settings = tyro.cli(rl.Args, args=["--feedback", "scripted", "--behaviour", "backflip", "--env-kwargs", env_kwargs])
        rl.fill_runtime_fields(settings)
        rl.validate_args(settings)
        assert (warning in capsys.readouterr().out) == warned, env_kwargs


@pytest.mark.slow
def test_a_tiny_scripted_run_is_labelled_by_its_behaviour(tmp_path):
    tiny = "--env HalfCheetah-v4 --total-timesteps 3072 --num-envs 8 --num-steps 64 --pretrain-steps 1024 --labels 40"
    tiny += " --segment-len 20 --pretrain-epochs 5 --reward-eval-every 2 --feedback scripted --behaviour backwards"
    result = run_script(tmp_path, tiny + " --save-model")
    assert result.returncode == 0, result.stderr
    assert "labels 40/40" in result.stdout
    run_dir = only_run_dir(tmp_path)
    labels = np.load(run_dir / "labels.npz")
    backwards = -(labels["obs"][..., 8] * labels["mask"]).sum(-1)  # (labels, 2): each segment's backward progress
    strict = labels["mu"] != 0.5
    assert strict.sum() == 40
    assert np.all((backwards[:, 0] > backwards[:, 1]) == (labels["mu"] == 1))
    # and not by the environment's reward, which pays for running forwards
    true_returns = labels["true_reward"].sum(-1)
    assert np.mean((true_returns[:, 0] > true_returns[:, 1]) == (labels["mu"] == 1)) < 0.5

    # the progress lines and TensorBoard show how much of the behaviour each rollout has, per 1000 steps
    printed = [float(x) for x in re.findall(r"backwards score (\S+)/1000 steps", result.stdout)]
    logged = scalars(run_dir)["charts/behaviour_score"]
    assert len(printed) == len(logged) == 4  # one per RL iteration: (3072 - 1024) / (8 x 64)
    assert printed == pytest.approx([value for _, value in logged], abs=0.06)

    # --eval-only scores the agent by its behaviour too: here the x velocities, negated and summed over the episode
    evaluation = run_script(tmp_path, f"--resume {run_dir} --eval-only --eval-episodes 1")
    assert evaluation.returncode == 0, evaluation.stderr
    reported = float(re.search(r"eval: backwards score (\S+) ", evaluation.stdout).group(1))
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    agent, obs_rms = rl.Agent(17, 6), rl.RunningMeanStd()
    agent.load_state_dict(checkpoint["agent"])
    obs_rms.load_state_dict(checkpoint["obs_rms"])
    env = gym.make("HalfCheetah-v4")
    obs, _ = env.reset(seed=1)  # the run's --seed, the first evaluation episode
    x_velocities, done = [], False
    while not done:
        x_velocities.append(env.unwrapped.data.qvel[0])
        with torch.no_grad():
            action = agent.actor_mean(torch.as_tensor(rl.normalize_obs(obs_rms, obs[None]))).numpy()[0]
        obs, _, terminated, truncated, _ = env.step(np.clip(action, -1, 1))
        done = terminated or truncated
    assert len(x_velocities) == 1000
    assert reported == pytest.approx(-np.sum(x_velocities), abs=0.1)


def within_joint_ranges(env_id, qpos):
    """Is every limited hinge of the pose inside its range (the simulator's set_state does not enforce them)?"""
    env = gym.make(env_id)
    model = env.unwrapped.model
    inside = all(
        model.jnt_range[j, 0] - 1e-6 <= qpos[model.jnt_qposadr[j]] <= model.jnt_range[j, 1] + 1e-6
        for j in range(model.njnt)
        if model.jnt_limited[j]
    )
    env.close()
    return inside


def test_the_walker_behaviour_rewards_a_pose_its_joints_can_reach():
    # standing on the right leg with the left foot lifted as far as the joints allow: the left knee bent
    # (leg_left_joint, range -150..0 degrees) with the thigh straight down; the thighs cannot swing forward (-150..0)
    def one_leg(qpos, qvel, t):
        qpos[7] = -1.5  # leg_left_joint

    lifted, data, env = simulated("Walker2d-v4", one_leg)
    assert within_joint_ranges("Walker2d-v4", env.unwrapped.data.qpos)
    assert data.body("foot_left").xpos[2] > data.body("foot").xpos[2] + 0.3  # the left foot is well off the ground
    env.close()
    straight, _, _ = simulated("Walker2d-v4", lambda q, v, t: None)
    assert score("one-leg", lifted) > score("one-leg", straight) + 5
